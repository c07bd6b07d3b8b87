//! [`Waker`] and [`Wakers`]: how waiting readers learn that there is news.

use std::fmt;

/// A reader's wake-up callback. It runs once, on the appending thread.
pub type Waker = Box<dyn FnOnce() + Send>;

/// Wakers drained from the log by an append, a close or an expiry.
///
/// They are handed back instead of being called in place so that the caller
/// can run them after releasing the lock around the log: a callback may take
/// other locks (or the GIL), and running it under ours invites deadlock.
#[must_use = "waiting readers hang unless these are woken"]
#[derive(Default)]
pub struct Wakers(pub(crate) Vec<Waker>);

impl Wakers {
    /// Calls every waker, in registration order.
    pub fn wake_all(self) {
        for waker in self.0 {
            waker();
        }
    }

    /// How many readers are waiting on these.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no reader was waiting.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Wakers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Wakers").field(&self.0.len()).finish()
    }
}
