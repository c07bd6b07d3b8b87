#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod log;
mod shared;

pub use log::{Entry, EventLog, Waker, Wakers};
pub use shared::SharedLog;

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
}
