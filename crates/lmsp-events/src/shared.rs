//! [`SharedLog`]: an [`EventLog`] behind a mutex, waking readers outside it.

use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::{EventLog, LogError, Waker};

/// An [`EventLog`] shared between a producer and readers on other threads
/// (put it in an `Arc`). Wakers always run after the mutex is released.
#[derive(Debug, Default)]
pub struct SharedLog {
    inner: Mutex<EventLog>,
}

impl SharedLog {
    /// An empty, open log.
    pub fn new() -> Self {
        Self::default()
    }

    /// [`EventLog::append`], then wakes the waiting readers.
    pub fn append(&self, event: &str, data: &[u8]) -> Result<u64, LogError> {
        let (id, wakers) = self.lock().append(event, data)?;
        wakers.wake_all();
        Ok(id)
    }

    /// [`EventLog::append_text`], then wakes the waiting readers.
    pub fn append_text(
        &self,
        event: &str,
        head: &[u8],
        text: &str,
        tail: &[u8],
    ) -> Result<u64, LogError> {
        let (id, wakers) = self.lock().append_text(event, head, text, tail)?;
        wakers.wake_all();
        Ok(id)
    }

    /// [`EventLog::close`], then wakes the waiting readers.
    pub fn close(&self) {
        let wakers = self.lock().close();
        wakers.wake_all();
    }

    /// [`EventLog::wait_after`] under the lock.
    pub fn wait_after(&self, after: u64, waker: Waker) -> Result<(), Waker> {
        self.lock().wait_after(after, waker)
    }

    /// Runs `read` with the log locked, e.g. to copy out `frames_after`.
    pub fn read<R>(&self, read: impl FnOnce(&EventLog) -> R) -> R {
        read(&self.lock())
    }

    fn lock(&self) -> MutexGuard<'_, EventLog> {
        // Every mutation validates before it writes, so a panic elsewhere while
        // the lock was held cannot have left the log half-updated.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
