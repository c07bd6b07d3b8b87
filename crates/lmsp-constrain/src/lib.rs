//! Grammar-constrained sampling: the only way lmsp shapes a model's output.
//!
//! A [`Vocabulary`] is built once per model from the model's own token bytes. It compiles a
//! [`Grammar`] (a JSON schema, or a Lark grammar for tool calls) into a [`Compiled`] start
//! state, cached by the grammar's text. Each generation gets a [`Constraint`] from it and calls
//! [`Constraint::step`] once per token on the logits the model produced: the grammar's token
//! mask is applied while sampling (nothing is copied or written into the logits), the chosen
//! token is committed, and the step says when the output is complete. The grammar engine is
//! llguidance, whose parser limits bound what a hostile grammar can cost.

mod compile;
mod constraint;
mod error;
mod narrow;
mod patterns;
mod penalty;
mod sample;
mod vocab;

#[cfg(test)]
mod toy;

pub use compile::{Compiled, Grammar, Probe, prepared_json_schema};
pub use narrow::narrow;
pub use constraint::{Check, Constraint, Stats, Step};
pub use error::CompileError;
pub use penalty::{Penalties, Recent};
pub use sample::{Sampler, Sampling};
pub use toktrie::TokenId;
pub use vocab::{Token, Vocabulary, VocabularyError};
