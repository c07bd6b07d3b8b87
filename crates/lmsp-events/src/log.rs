//! [`EventLog`]: entries, their frames, and the wakers of waiting readers.

use std::{fmt, mem, str};

use crate::LogError;

/// A reader's wake-up callback. It runs once, on the appending thread.
pub type Waker = Box<dyn FnOnce() + Send>;

/// Wakers drained from the log by an append or a close.
///
/// They are handed back instead of being called in place so that the caller
/// can run them after releasing the lock around the log: a callback may take
/// other locks (or the GIL), and running it under ours invites deadlock.
#[must_use = "waiting readers hang unless these are woken"]
#[derive(Default)]
pub struct Wakers(Vec<Waker>);

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

/// One logged event, borrowed from the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'a> {
    /// Its id: 1 for the first entry, then one more for each.
    pub id: u64,
    /// Its event name, e.g. `response.output_text.delta`.
    pub event: &'a str,
    /// Its data, JSON text (always valid UTF-8).
    pub data: &'a [u8],
}

/// Where an entry's parts sit. Name and data are read back out of the frame
/// itself rather than kept as copies: that halves the bytes each event adds,
/// and at one event per token, fresh memory is most of an append's cost.
#[derive(Debug, Clone, Copy)]
struct Slot {
    frame_end: usize,
    name_at: usize,
    name_len: usize,
    /// In `frames`, or in `spill` for data that its frame splits over lines.
    data_at: usize,
    data_len: usize,
    spilled: bool,
}

/// An append-only log of framed events for one response.
#[derive(Default)]
pub struct EventLog {
    slots: Vec<Slot>,
    frames: Vec<u8>,
    /// Data with line breaks, which its frame cannot hold verbatim. JSON from
    /// a serializer has none, so this normally stays empty.
    spill: Vec<u8>,
    /// Where `append_text` assembles data before framing it; reused.
    scratch: Vec<u8>,
    closed: bool,
    waiters: Vec<Waker>,
}

impl fmt::Debug for EventLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventLog")
            .field("last_id", &self.last_id())
            .field("frame_bytes", &self.frames.len())
            .field("closed", &self.closed)
            .field("waiters", &self.waiters.len())
            .finish()
    }
}

impl EventLog {
    /// An empty, open log.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends an event whose data is ready-made JSON text and returns its id,
    /// with the wakers of the readers that were waiting for it.
    pub fn append(&mut self, event: &str, data: &[u8]) -> Result<(u64, Wakers), LogError> {
        self.ensure_open()?;
        let data = str::from_utf8(data).map_err(LogError::InvalidUtf8)?;
        self.commit(event, data)
    }

    /// Appends an event whose data is `head ++ json_string(text) ++ tail`: the
    /// per-token path, where `head` is e.g.
    /// `{"response_id":"resp_X","item_id":"msg_Y","delta":` and `tail` is `}`.
    pub fn append_text(
        &mut self,
        event: &str,
        head: &[u8],
        text: &str,
        tail: &[u8],
    ) -> Result<(u64, Wakers), LogError> {
        self.ensure_open()?;
        let mut scratch = mem::take(&mut self.scratch);
        scratch.clear();
        scratch.extend_from_slice(head);
        serde_json::to_writer(&mut scratch, text)
            .expect("serializing a str into a Vec cannot fail");
        scratch.extend_from_slice(tail);
        let result = match str::from_utf8(&scratch) {
            Ok(data) => self.commit(event, data),
            Err(err) => Err(LogError::InvalidUtf8(err)),
        };
        self.scratch = scratch;
        result
    }

    /// Closes the log: later appends fail, and waiting readers are handed back
    /// to be woken. Closing twice is harmless.
    pub fn close(&mut self) -> Wakers {
        self.closed = true;
        Wakers(mem::take(&mut self.waiters))
    }

    /// Whether [`EventLog::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// The id of the newest entry; 0 while the log is empty.
    pub fn last_id(&self) -> u64 {
        self.slots.len() as u64
    }

    /// The last id and every wire frame with a larger id than `after`, as one
    /// slice (empty when `after >= last_id`).
    pub fn frames_after(&self, after: u64) -> (u64, &[u8]) {
        let last = self.last_id();
        if after >= last {
            return (last, &[]);
        }
        // after < last = slots.len(), so the index fits a usize.
        let start = self.frame_start(after as usize);
        (last, &self.frames[start..])
    }

    /// Every entry with a larger id than `after`, oldest first.
    pub fn entries_after(
        &self,
        after: u64,
    ) -> impl ExactSizeIterator<Item = Entry<'_>> + DoubleEndedIterator {
        let first = after.min(self.last_id()) as usize;
        (first..self.slots.len()).map(move |index| self.entry_at(index))
    }

    /// The entry with this id, if there is one.
    pub fn entry(&self, id: u64) -> Option<Entry<'_>> {
        let index = usize::try_from(id.checked_sub(1)?).ok()?;
        (index < self.slots.len()).then(|| self.entry_at(index))
    }

    /// Registers `waker` to run on the next append or close, unless the reader
    /// need not wait: when an entry after `after` exists or the log is closed,
    /// the waker comes back untouched in `Err` and the caller reads now.
    pub fn wait_after(&mut self, after: u64, waker: Waker) -> Result<(), Waker> {
        if self.closed || self.last_id() > after {
            return Err(waker);
        }
        self.waiters.push(waker);
        Ok(())
    }

    /// How many wakers are registered.
    pub fn waiting(&self) -> usize {
        self.waiters.len()
    }

    fn ensure_open(&self) -> Result<(), LogError> {
        if self.closed {
            return Err(LogError::Closed);
        }
        Ok(())
    }

    /// Frames the event and records where its parts landed. The encoder
    /// validates before it writes, so a failed append leaves no trace.
    fn commit(&mut self, event: &str, data: &str) -> Result<(u64, Wakers), LogError> {
        let id = self.last_id() + 1;
        let spans = lmsp_sse::encode_event_spans(&mut self.frames, Some(id), Some(event), data)?;
        let name = spans.event.expect("a named event has a name span");
        let (data_at, spilled) = match spans.data {
            Some(range) => (range.start, false),
            None => {
                self.spill.extend_from_slice(data.as_bytes());
                (self.spill.len() - data.len(), true)
            }
        };
        self.slots.push(Slot {
            frame_end: self.frames.len(),
            name_at: name.start,
            name_len: name.len(),
            data_at,
            data_len: data.len(),
            spilled,
        });
        Ok((id, Wakers(mem::take(&mut self.waiters))))
    }

    fn frame_start(&self, index: usize) -> usize {
        index
            .checked_sub(1)
            .map_or(0, |prev| self.slots[prev].frame_end)
    }

    fn entry_at(&self, index: usize) -> Entry<'_> {
        let slot = self.slots[index];
        let name = &self.frames[slot.name_at..slot.name_at + slot.name_len];
        let data = if slot.spilled {
            &self.spill
        } else {
            &self.frames
        };
        Entry {
            id: index as u64 + 1,
            event: str::from_utf8(name).expect("event names are copied in from a &str"),
            data: &data[slot.data_at..slot.data_at + slot.data_len],
        }
    }
}

#[cfg(test)]
#[path = "log_tests.rs"]
mod tests;
