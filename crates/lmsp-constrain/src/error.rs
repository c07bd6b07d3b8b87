//! The error a grammar is refused with, shared by the compiler and the pattern check.

/// A grammar the engine cannot enforce, or one over the parser limits. The message names the
/// keyword or the limit, as llguidance reports it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct CompileError {
    /// What was wrong, for the client.
    pub message: String,
}

impl CompileError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self { message: one_line(&message.into()) }
    }
}

/// Errors can span lines (a regex error points at the offending character); a problem
/// document's detail is one line.
pub(crate) fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}
