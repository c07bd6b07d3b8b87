//! [`Limits`]: how much history an [`EventLog`](crate::EventLog) keeps, and for how long.

use std::time::Duration;

use crate::LogError;

/// The bounds of one log's history. Memory grows with what a response actually
/// writes, up to these bounds; it is not reserved up front.
///
/// The defaults are sized so that a normal response never loses an event: one
/// event per generated token plus a handful, so 65,536 events outlast any
/// output a local model's context window allows (8,192 tokens for the embedded
/// model); a delta frame is about 150 bytes, so those events take about 10 MB,
/// and 16 MiB still leaves room for the final items, which repeat the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The most events kept; older ones are dropped first. At least 1.
    pub max_events: usize,
    /// The most wire-frame bytes kept; older events are dropped first, but the
    /// newest event is always kept, even alone over this bound. At least 1.
    /// Data that its frame splits over lines is also kept verbatim aside;
    /// it is smaller than its frame, so it at most doubles this.
    pub max_bytes: usize,
    /// How long the history outlives the close of the log: long enough for a
    /// client whose connection dropped to come back (browsers retry within
    /// seconds), short enough that finished tasks do not pile up in memory.
    pub retention: Duration,
}

impl Limits {
    /// The default [`Limits::max_events`].
    pub const DEFAULT_MAX_EVENTS: usize = 65_536;
    /// The default [`Limits::max_bytes`]: 16 MiB.
    pub const DEFAULT_MAX_BYTES: usize = 16 << 20;
    /// The default [`Limits::retention`]: five minutes.
    pub const DEFAULT_RETENTION: Duration = Duration::from_secs(300);

    /// Checks that the bounds can hold at least one event.
    pub fn validate(&self) -> Result<(), LogError> {
        if self.max_events == 0 {
            return Err(LogError::InvalidLimit("max_events must be at least 1"));
        }
        if self.max_bytes == 0 {
            return Err(LogError::InvalidLimit("max_bytes must be at least 1"));
        }
        Ok(())
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_events: Self::DEFAULT_MAX_EVENTS,
            max_bytes: Self::DEFAULT_MAX_BYTES,
            retention: Self::DEFAULT_RETENTION,
        }
    }
}
