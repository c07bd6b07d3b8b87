#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod encode;
mod parse;

pub use encode::{
    FrameSpans, encode_comment, encode_event, encode_event_spans, validate_event_name,
};
pub use parse::{Event, Item, Parser};

/// Everything that can go wrong in this crate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    /// An event name must be non-empty and free of CR and LF: either would end
    /// the `event:` line early and corrupt the frame.
    #[error("invalid SSE event name {0:?}: it must be non-empty and contain no CR or LF")]
    InvalidEventName(String),
}
