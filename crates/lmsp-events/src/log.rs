//! [`EventLog`]: a bounded ring of framed events, their wakers and their expiry.

use std::{collections::VecDeque, fmt, io::Write, mem, str, time::Duration};

use crate::{Limits, LogError, Waker, Wakers, window::Window};

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

/// Where a kept entry ends, as logical offsets into the two windows; it starts
/// where the one before it ends (the oldest at the windows' starts). Name and
/// data are read back out of the frame instead of being kept as copies: at one
/// event per token, fresh memory is most of an append's cost.
#[derive(Debug, Clone, Copy)]
struct Slot {
    frame_end: u64,
    /// Past this entry's data in `spill`; equal to the previous entry's when
    /// its frame holds the data whole.
    spill_end: u64,
}

/// What a one-line frame can add to its event name and data: `id: ` and up
/// to 20 digits, `event: `, `data: `, and four line feeds.
const FRAME_OVERHEAD: usize = 4 + 20 + 7 + 6 + 4;

/// The events of one response, as a ring: ids grow by 1 from 1, the oldest
/// are dropped once [`Limits`] are reached, and the whole history goes once
/// the log has been closed for [`Limits::retention`].
///
/// The log never reads a clock: times are passed in (`now`, the caller's
/// monotonic clock as time since any fixed origin), so tests are exact.
pub struct EventLog {
    limits: Limits,
    slots: VecDeque<Slot>,
    /// Every kept frame, contiguous, so that a replay is one slice.
    frames: Window,
    /// Data with line breaks, which its frame cannot hold verbatim. JSON from
    /// a serializer has none, so this normally stays empty.
    spill: Window,
    /// Where `append_text` assembles data before framing it; reused.
    scratch: Vec<u8>,
    last_id: u64,
    closed_at: Option<Duration>,
    expired: bool,
    waiters: Vec<Waker>,
}

impl fmt::Debug for EventLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventLog")
            .field("first_id", &self.first_id())
            .field("last_id", &self.last_id)
            .field("frame_bytes", &self.frames.live())
            .field("closed_at", &self.closed_at)
            .field("expired", &self.expired)
            .field("waiters", &self.waiters.len())
            .finish()
    }
}

impl Default for EventLog {
    fn default() -> Self {
        Self::from_valid(Limits::default())
    }
}

impl EventLog {
    /// An empty, open log with the default [`Limits`].
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty, open log with these limits; [`LogError::InvalidLimit`] if
    /// they cannot hold an event.
    pub fn with_limits(limits: Limits) -> Result<Self, LogError> {
        limits.validate()?;
        Ok(Self::from_valid(limits))
    }

    fn from_valid(limits: Limits) -> Self {
        Self {
            limits,
            slots: VecDeque::new(),
            frames: Window::default(),
            spill: Window::default(),
            scratch: Vec::new(),
            last_id: 0,
            closed_at: None,
            expired: false,
            waiters: Vec::new(),
        }
    }

    /// The limits this log was made with.
    pub fn limits(&self) -> &Limits {
        &self.limits
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
        self.append_built(event, head, Some(text), tail, None)
    }

    /// Appends an event whose data is `head ++ json_string(text) ++ tail ++ id ++ "}"`
    /// (without `text`, `head ++ tail ++ id ++ "}"`), `id` being the id this event gets.
    /// For a face whose events carry their own number (the OpenAI one's
    /// `sequence_number`): numbered by the log, the number is the SSE id, so a reader
    /// resuming after number N reads after id N, and no caller keeps a count of its own.
    pub fn append_numbered(
        &mut self,
        event: &str,
        head: &[u8],
        text: Option<&str>,
        tail: &[u8],
    ) -> Result<(u64, Wakers), LogError> {
        let id = self.last_id + 1;
        self.append_built(event, head, text, tail, Some(id))
    }

    /// `head ++ json_string(text) ++ tail ++ [id "}"]`, built in the reused scratch
    /// buffer, then committed.
    fn append_built(
        &mut self,
        event: &str,
        head: &[u8],
        text: Option<&str>,
        tail: &[u8],
        id: Option<u64>,
    ) -> Result<(u64, Wakers), LogError> {
        self.ensure_open()?;
        let mut data = mem::take(&mut self.scratch);
        data.clear();
        data.extend_from_slice(head);
        if let Some(text) = text {
            serde_json::to_writer(&mut data, text)
                .expect("serializing a str into a Vec cannot fail");
        }
        data.extend_from_slice(tail);
        if let Some(id) = id {
            write!(data, "{id}}}").expect("writing into a Vec cannot fail");
        }
        let result = match str::from_utf8(&data) {
            Ok(joined) => self.commit(event, joined),
            Err(err) => Err(LogError::InvalidUtf8(err)),
        };
        self.scratch = data;
        result
    }

    /// Closes the log at time `now`: later appends fail, the retention clock
    /// starts, and waiting readers are handed back to be woken. Closing again
    /// changes nothing (the first time stands).
    pub fn close(&mut self, now: Duration) -> Wakers {
        self.closed_at.get_or_insert(now);
        Wakers(mem::take(&mut self.waiters))
    }

    /// Whether [`EventLog::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed_at.is_some()
    }

    /// When the history expires: [`Limits::retention`] after the close; `None`
    /// while the log is open.
    pub fn expires_at(&self) -> Option<Duration> {
        let closed_at = self.closed_at?;
        Some(closed_at.saturating_add(self.limits.retention))
    }

    /// Expires the history if the log closed at least [`Limits::retention`]
    /// before `now`; returns whether the history is expired (now or before).
    /// A closed log has no waiting readers, so there is nobody to wake.
    pub fn expire_if_due(&mut self, now: Duration) -> bool {
        // Dropping again is cheap and right: an open log expired early may
        // have taken events before its close.
        if self.expires_at().is_some_and(|at| now >= at) {
            self.drop_history();
        }
        self.expired
    }

    /// Drops the whole history now, e.g. when a timer set for
    /// [`EventLog::expires_at`] fires, and frees its memory. The log keeps its
    /// last id and whether it is closed; reads before the last id now fail with
    /// [`LogError::HistoryExpired`]. Meant for closed logs; on an open one,
    /// later appends are kept as usual, and waiting readers are handed back.
    pub fn expire(&mut self) -> Wakers {
        self.drop_history();
        Wakers(mem::take(&mut self.waiters))
    }

    /// Whether the history was expired by [`EventLog::expire`] or
    /// [`EventLog::expire_if_due`].
    pub fn is_expired(&self) -> bool {
        self.expired
    }

    /// The id of the newest entry; 0 while nothing was appended.
    pub fn last_id(&self) -> u64 {
        self.last_id
    }

    /// The id of the oldest kept entry; `last_id + 1` when none is kept. A
    /// reader can resume after any id from `first_id - 1` on.
    pub fn first_id(&self) -> u64 {
        self.last_id + 1 - self.slots.len() as u64
    }

    /// How many entries are kept.
    pub fn retained(&self) -> usize {
        self.slots.len()
    }

    /// The wire bytes of the kept frames, which [`Limits::max_bytes`] bounds.
    pub fn retained_bytes(&self) -> usize {
        self.frames.live()
    }

    /// The last id and every wire frame with a larger id than `after`, as one
    /// slice (empty when `after >= last_id`); [`LogError::HistoryExpired`] if
    /// some of those frames are no longer kept.
    pub fn read_after(&self, after: u64) -> Result<(u64, &[u8]), LogError> {
        let Some(index) = self.index_after(after)? else {
            return Ok((self.last_id, &[]));
        };
        let start = self.starts(index).0;
        Ok((self.last_id, self.frames.slice(start, self.frames.end())))
    }

    /// Like [`EventLog::read_after`], but only the frames that fit in
    /// `max_bytes`, cut between frames (the first one whole even when it alone
    /// is larger): the id of the last frame returned, and the frames. A reader
    /// far behind (a replay) copies out a bounded chunk at a time, never the
    /// rest of the ring.
    pub fn read_after_within(&self, after: u64, max_bytes: usize) -> Result<(u64, &[u8]), LogError> {
        let Some(index) = self.index_after(after)? else {
            return Ok((self.last_id, &[]));
        };
        let start = self.starts(index).0;
        let limit = start.saturating_add(max_bytes as u64);
        // Slots end at growing offsets, and those before `index` end at or before `start`.
        let within = self.slots.partition_point(|slot| slot.frame_end <= limit);
        let last = within.max(index + 1) - 1;
        let end = self.slots[last].frame_end;
        Ok((self.first_id() + last as u64, self.frames.slice(start, end)))
    }

    /// Every entry with a larger id than `after`, oldest first;
    /// [`LogError::HistoryExpired`] if some of them are no longer kept.
    pub fn entries_after(
        &self,
        after: u64,
    ) -> Result<impl ExactSizeIterator<Item = Entry<'_>> + DoubleEndedIterator, LogError> {
        let first = self.index_after(after)?.unwrap_or(self.slots.len());
        Ok((first..self.slots.len()).map(move |index| self.entry_at(index)))
    }

    /// The entry with this id, if it is kept.
    pub fn entry(&self, id: u64) -> Option<Entry<'_>> {
        let index = usize::try_from(id.checked_sub(self.first_id())?).ok()?;
        (index < self.slots.len()).then(|| self.entry_at(index))
    }

    /// Registers `waker` to run on the next append, close or expiry, unless the
    /// reader need not wait: when an entry after `after` exists (kept or
    /// dropped: a reader whose events were dropped must learn it now) or the
    /// log is closed, the waker comes back untouched in `Err` and the caller
    /// reads now.
    pub fn wait_after(&mut self, after: u64, waker: Waker) -> Result<(), Waker> {
        if self.is_closed() || self.last_id > after {
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
        if self.is_closed() {
            return Err(LogError::Closed);
        }
        Ok(())
    }

    /// Frames the event, then drops the oldest entries past the limits. The
    /// encoder validates before it writes, so a failed append leaves no trace.
    fn commit(&mut self, event: &str, data: &str) -> Result<(u64, Wakers), LogError> {
        let id = self.last_id + 1;
        // Room for the whole frame up front, so the encoder never grows the
        // buffer itself and the window decides between reusing and growing.
        let out = self
            .frames
            .writer(event.len() + data.len() + FRAME_OVERHEAD);
        let spans = lmsp_sse::encode_event_spans(out, Some(id), Some(event), data)?;
        if spans.data.is_none() {
            self.spill
                .writer(data.len())
                .extend_from_slice(data.as_bytes());
        }
        if self.slots.len() == self.limits.max_events {
            // Before the push, so the deque never outgrows `max_events`.
            self.drop_oldest();
        }
        self.slots.push_back(Slot {
            frame_end: self.frames.end(),
            spill_end: self.spill.end(),
        });
        while self.slots.len() > 1 && self.frames.live() > self.limits.max_bytes {
            self.drop_oldest();
        }
        self.last_id = id;
        Ok((id, Wakers(mem::take(&mut self.waiters))))
    }

    fn drop_oldest(&mut self) {
        let gone = self.slots.pop_front().expect("only called with entries");
        self.frames.release_to(gone.frame_end);
        self.spill.release_to(gone.spill_end);
    }

    fn drop_history(&mut self) {
        // Fresh containers, not cleared ones: the point is to give memory back.
        self.slots = VecDeque::new();
        self.frames.clear();
        self.spill.clear();
        self.scratch = Vec::new();
        self.expired = true;
    }

    /// The slot index of the first entry after `after`: `None` if there is
    /// none, [`LogError::HistoryExpired`] if it is no longer kept.
    fn index_after(&self, after: u64) -> Result<Option<usize>, LogError> {
        if after >= self.last_id {
            return Ok(None);
        }
        let first_id = self.first_id();
        if after + 1 < first_id {
            return Err(LogError::HistoryExpired { after, first_id });
        }
        // after < last_id, so this is the index of a kept slot: it fits a usize.
        Ok(Some((after + 1 - first_id) as usize))
    }

    /// Where the entry at `index` starts in the frames and in the spill.
    fn starts(&self, index: usize) -> (u64, u64) {
        match index.checked_sub(1) {
            Some(prev) => (self.slots[prev].frame_end, self.slots[prev].spill_end),
            None => (self.frames.start(), self.spill.start()),
        }
    }

    fn entry_at(&self, index: usize) -> Entry<'_> {
        let slot = self.slots[index];
        let (frame_start, spill_start) = self.starts(index);
        let frame = self.frames.slice(frame_start, slot.frame_end);
        let (event, inline) = split_frame(frame);
        let data = if slot.spill_end > spill_start {
            self.spill.slice(spill_start, slot.spill_end)
        } else {
            inline
        };
        Entry {
            id: self.first_id() + index as u64,
            event: str::from_utf8(event).expect("event names are copied in from a &str"),
            data,
        }
    }
}

/// The event name and, when the frame has one `data:` line, the data of a
/// frame as `lmsp_sse` writes it: `id: N\nevent: NAME\ndata: DATA\n\n`.
fn split_frame(frame: &[u8]) -> (&[u8], &[u8]) {
    let line_end = |from: usize| {
        from + frame[from..]
            .iter()
            .position(|&b| b == b'\n')
            .expect("every frame line ends in a line feed")
    };
    let name_at = line_end(0) + 1 + b"event: ".len();
    let name_end = line_end(name_at);
    debug_assert!(frame[..name_at].ends_with(b"\nevent: "));
    let data_at = (name_end + 1 + b"data: ".len()).min(frame.len() - 2);
    (&frame[name_at..name_end], &frame[data_at..frame.len() - 2])
}

#[cfg(test)]
#[path = "log_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "ring_tests.rs"]
mod ring_tests;
