//! One generation under a grammar: mask, sample, commit, once per token.

use std::sync::Arc;

use llguidance::Matcher;
use toktrie::TokenId;

use crate::compile::{Compiled, one_line};
use crate::sample::{Sampler, Sampling};

/// What one step decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Emit this token; the grammar goes on.
    Token(TokenId),
    /// Emit this token; it completes the grammar, so the output ends after it.
    Last(TokenId),
    /// The output ends here (an end-of-generation token was chosen where the grammar may end).
    End,
    /// The grammar can no longer be followed; [`Constraint::error`] says why. Every later
    /// step returns `Error` too.
    Error,
}

/// A generation's grammar state and sampler.
pub struct Constraint {
    matcher: Matcher,
    sampler: Sampler,
    end_tokens: Arc<[TokenId]>,
    error: Option<String>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").field("error", &self.error).finish_non_exhaustive()
    }
}

impl Constraint {
    /// Starts a generation at the grammar's start state.
    pub fn new(compiled: &Compiled, sampling: Sampling) -> Self {
        Self {
            matcher: compiled.start(),
            sampler: Sampler::new(sampling),
            end_tokens: compiled.end_tokens(),
            error: None,
        }
    }

    /// One token: masks `logits` (the model's row for this sequence, one entry per
    /// vocabulary token) with the grammar, samples, and commits the choice.
    pub fn step(&mut self, logits: &[f32]) -> Step {
        if self.error.is_some() {
            return Step::Error;
        }
        if self.matcher.is_stopped() {
            return Step::End;
        }
        let mask = match self.matcher.compute_mask() {
            Ok(mask) => mask,
            Err(err) => return self.fail(&err.to_string()),
        };
        let Some(token) = self.sampler.sample(logits, &mask) else {
            return self.fail("the grammar allows no token here");
        };
        if self.end_tokens.contains(&token) {
            return Step::End;
        }
        if let Err(err) = self.matcher.consume_token(token) {
            return self.fail(&err.to_string());
        }
        if self.matcher.is_stopped() { Step::Last(token) } else { Step::Token(token) }
    }

    /// Why the grammar could not be followed, once a step returned [`Step::Error`].
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    fn fail(&mut self, message: &str) -> Step {
        self.error = Some(one_line(message));
        Step::Error
    }
}

#[cfg(test)]
#[path = "constraint_tests.rs"]
mod tests;
