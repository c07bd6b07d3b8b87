#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod limits;
mod log;
mod shared;
mod wakers;
mod window;

pub use limits::Limits;
pub use log::{Entry, EventLog};
pub use shared::SharedLog;
pub use wakers::{Waker, Wakers};

/// Everything that can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The log was closed: the response is over and takes no more events.
    #[error("the event log is closed")]
    Closed,
    /// Event data must be UTF-8 text (it is JSON, and SSE is a text protocol).
    #[error("event data is not valid UTF-8")]
    InvalidUtf8(#[source] std::str::Utf8Error),
    /// The event could not be framed, e.g. its name holds a line break.
    #[error(transparent)]
    Sse(#[from] lmsp_sse::SseError),
    /// Some of the events a reader asked for are no longer kept: the ring
    /// dropped them to stay within its bounds, or the history expired after
    /// the log closed. The service answers 410 `event_history_expired`
    /// (R6.4-3); the reader can only resume after `first_id - 1` or later.
    #[error(
        "event history expired: events after id {after} were dropped \
         (the kept history starts at id {first_id})"
    )]
    HistoryExpired {
        /// The id the reader asked to read after.
        after: u64,
        /// The oldest id still kept; `last_id + 1` when none is.
        first_id: u64,
    },
    /// A [`Limits`] value is out of range, e.g. `max_events` is 0.
    #[error("invalid event log limit: {0}")]
    InvalidLimit(&'static str),
}
