//! One generation under a grammar: choose, commit, once per token.
//!
//! A token mask walks the whole token trie (up to ~0.7 ms for 49k tokens where llguidance's
//! slicer cannot help), while asking whether one token is allowed walks that token's bytes
//! (microseconds). So a step first samples from the whole row, as if unconstrained, and asks
//! the grammar about that one token; only when it is refused does the step compute the mask
//! and sample from the allowed tokens. The result is exactly the masked one: at temperature 0
//! an allowed argmax is the masked argmax; above it, an allowed draw keeps its probability and
//! a refused one is redrawn from the mask, which together is the masked distribution (and
//! what llama.cpp's common sampler does with its grammars).

use std::sync::Arc;
use std::time::Instant;

use llguidance::Matcher;
use toktrie::{SimpleVob, TokenId};

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

/// How a generation asks its grammar which tokens are allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Check {
    /// Sample from the whole row, check that one token, mask only when it is refused.
    #[default]
    SampledToken,
    /// The mask of every allowed token at every step: the reference the first is exact to.
    EveryMask,
}

/// Where a generation's steps spent their time, summed over its steps so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Steps taken.
    pub steps: u64,
    /// Steps that computed the full token mask.
    pub masks: u64,
    /// Choosing from the logits: argmax and draws (the mask's own sampling included).
    pub sample_ns: u64,
    /// Asking the grammar about single tokens.
    pub check_ns: u64,
    /// Computing token masks (llguidance's trie walk).
    pub mask_ns: u64,
    /// Committing the chosen token to the grammar state.
    pub commit_ns: u64,
}

/// A generation's grammar state and sampler.
pub struct Constraint {
    matcher: Matcher,
    sampler: Sampler,
    end_tokens: Arc<[TokenId]>,
    check: Check,
    stats: Stats,
    error: Option<String>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").field("error", &self.error).finish_non_exhaustive()
    }
}

/// Nanoseconds since `start`, added to `total`; returns the new start.
fn lap(total: &mut u64, start: Instant) -> Instant {
    let now = Instant::now();
    *total += u64::try_from((now - start).as_nanos()).unwrap_or(u64::MAX);
    now
}

impl Constraint {
    /// Starts a generation at the grammar's start state, checking sampled tokens.
    pub fn new(compiled: &Compiled, sampling: Sampling) -> Self {
        Self::with_check(compiled, sampling, Check::default())
    }

    /// Starts a generation at the grammar's start state, asking the grammar as `check` says.
    pub fn with_check(compiled: &Compiled, sampling: Sampling, check: Check) -> Self {
        Self {
            matcher: compiled.start(),
            sampler: Sampler::new(sampling),
            end_tokens: compiled.end_tokens(),
            check,
            stats: Stats::default(),
            error: None,
        }
    }

    /// One token: chooses from `logits` (the model's row for this sequence, one entry per
    /// vocabulary token) a token the grammar allows, and commits it.
    pub fn step(&mut self, logits: &[f32]) -> Step {
        if self.error.is_some() {
            return Step::Error;
        }
        if self.matcher.is_stopped() {
            return Step::End;
        }
        self.stats.steps += 1;
        let token = match self.choose(logits) {
            Ok(token) => token,
            Err(message) => return self.fail(&message),
        };
        if self.end_tokens.contains(&token) {
            return Step::End;
        }
        let started = Instant::now();
        let committed = self.matcher.consume_token(token);
        lap(&mut self.stats.commit_ns, started);
        if let Err(err) = committed {
            return self.fail(&err.to_string());
        }
        if self.matcher.is_stopped() { Step::Last(token) } else { Step::Token(token) }
    }

    /// Where this generation's steps spent their time so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Why the grammar could not be followed, once a step returned [`Step::Error`].
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    fn choose(&mut self, logits: &[f32]) -> Result<TokenId, String> {
        let mut clock = Instant::now();
        let best = Sampler::best(logits);
        clock = lap(&mut self.stats.sample_ns, clock);
        if let (Check::SampledToken, Some(best)) = (self.check, best) {
            // The draw is exact only when the mask allows `best` (see `Sampler::propose`).
            let best_allowed = self.allows(best.0);
            clock = lap(&mut self.stats.check_ns, clock);
            if best_allowed {
                let token = self.sampler.propose(logits, best);
                clock = lap(&mut self.stats.sample_ns, clock);
                let allowed = token == best.0 || self.allows(token);
                lap(&mut self.stats.check_ns, clock);
                if allowed {
                    return Ok(token);
                }
                // Refused by the check; the mask has the last word on what is allowed.
                let mask = self.mask()?;
                if mask.is_allowed(token) {
                    return Ok(token);
                }
                return self.sample_masked(logits, &mask);
            }
        }
        let mask = self.mask()?;
        self.sample_masked(logits, &mask)
    }

    /// Whether the grammar allows `token` now. Never allows a token the mask refuses (the
    /// mask allows end tokens exactly where the grammar is accepting; a text token where its
    /// bytes go through the same lexer and parser that the mask's trie walk uses), so a token
    /// it allows is one the masked sampler could have chosen.
    fn allows(&mut self, token: TokenId) -> bool {
        if self.end_tokens.contains(&token) {
            self.matcher.is_accepting().unwrap_or(false)
        } else {
            self.matcher.validate_tokens(&[token]).is_ok_and(|n| n == 1)
        }
    }

    fn mask(&mut self) -> Result<SimpleVob, String> {
        let started = Instant::now();
        let mask = self.matcher.compute_mask().map_err(|err| err.to_string());
        self.stats.masks += 1;
        lap(&mut self.stats.mask_ns, started);
        mask
    }

    fn sample_masked(&mut self, logits: &[f32], mask: &SimpleVob) -> Result<TokenId, String> {
        let started = Instant::now();
        let token = self.sampler.sample(logits, mask);
        lap(&mut self.stats.sample_ns, started);
        token.ok_or_else(|| "the grammar allows no token here".to_owned())
    }

    fn fail(&mut self, message: &str) -> Step {
        self.error = Some(one_line(message));
        Step::Error
    }
}

#[cfg(test)]
#[path = "constraint_tests.rs"]
mod tests;
