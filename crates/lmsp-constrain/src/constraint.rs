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
use toktrie::{SimpleVob, TokEnv, TokenId};

use crate::compile::Compiled;
use crate::error::one_line;
use crate::penalty::Recent;
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
    /// Tokens the grammar forced and [`Constraint::fast_forward`] committed.
    pub forced: u64,
    /// Finding and committing forced tokens.
    pub forward_ns: u64,
}

/// What the single-token check says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Allowed,
    Refused,
    /// Only the mask can tell.
    Ask,
}

/// How far below the best logit, and how many of the likeliest tokens, a step looks for the
/// most likely allowed one before it computes the mask: past e^-12 of the best, a token is
/// one the model barely considers, where the grammar forces its own choice (the mask finds it).
const LIKELIEST_SPAN: f32 = 12.0;
const LIKELIEST_CHECKS: usize = 16;
/// Draws refused in a row before a step asks the mask (each is exact; see `Sampler::propose`).
const DRAWS: usize = 4;

/// A generation's grammar state and sampler.
pub struct Constraint {
    matcher: Matcher,
    sampler: Sampler,
    // The generation's latest tokens, for the repetition penalties.
    recent: Recent,
    end_tokens: Arc<[TokenId]>,
    env: TokEnv,
    check: Check,
    stats: Stats,
    // Scratch for the likeliest tokens of a row, reused every step.
    likeliest: Vec<(TokenId, f32)>,
    // The tokens the last fast-forward committed.
    forced: Vec<TokenId>,
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
            recent: Recent::new(sampling.penalties),
            end_tokens: compiled.end_tokens(),
            env: compiled.tok_env(),
            check,
            stats: Stats::default(),
            likeliest: Vec::new(),
            forced: Vec::new(),
            error: None,
        }
    }

    /// Whether [`Self::penalize`] changes anything: the repetition penalties are set.
    pub fn penalized(&self) -> bool {
        !self.recent.is_off()
    }

    /// Applies the repetition penalties for this generation's latest tokens to `logits`, in
    /// place: what llama.cpp's chain does first, before the grammar's choice among what is
    /// left. The caller does it before [`Self::step`] when [`Self::penalized`]: `step` itself
    /// reads the row without writing it, so that the unpenalized path needs no mutable row.
    pub fn penalize(&mut self, logits: &mut [f32]) {
        self.recent.penalize(logits);
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
        self.recent.accept(token);
        if self.matcher.is_stopped() { Step::Last(token) } else { Step::Token(token) }
    }

    /// The tokens the grammar forces next, at most `max` of them, committed as if sampled:
    /// text no other token could continue (a key's quote and colon, an enum's tail). Called
    /// after a step returned [`Step::Token`], so that the caller decodes them together with
    /// that token instead of one step each. Empty where nothing is forced, after an error
    /// (which the next step reports), and for a vocabulary built without forcing
    /// ([`crate::Vocabulary::with_forcing`]). Forced text is tokenized by the vocabulary's
    /// trie, longest token first; the last bytes that a later token might extend are left to
    /// the next step (llguidance chops them), so a forced run never ends mid-token.
    /// [`Self::is_complete`] says whether the output ends with them.
    pub fn fast_forward(&mut self, max: usize) -> &[TokenId] {
        self.forced.clear();
        if self.error.is_some() || max == 0 || self.matcher.is_stopped() {
            return &self.forced;
        }
        let started = Instant::now();
        let mut forced = self.matcher.compute_ff_tokens();
        // An end token is never forced as text: the output ends by the grammar's own stop.
        if let Some(end) = forced.iter().position(|t| self.end_tokens.contains(t)) {
            forced.truncate(end);
        }
        forced.truncate(max);
        let committed = if forced.is_empty() { Ok(()) } else { self.matcher.consume_tokens(&forced) };
        lap(&mut self.stats.forward_ns, started);
        if let Err(err) = committed {
            self.fail(&err.to_string());
            return &self.forced;
        }
        for &token in &forced {
            self.recent.accept(token);
        }
        self.stats.forced += u64::try_from(forced.len()).unwrap_or(u64::MAX);
        self.forced = forced;
        &self.forced
    }

    /// Whether the grammar is complete: the output ends after what was committed so far.
    pub fn is_complete(&self) -> bool {
        self.error.is_none() && self.matcher.is_stopped()
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
        if self.check == Check::EveryMask || self.sampler.needs_mask() {
            return self.masked(logits);
        }
        let mut clock = Instant::now();
        let Some(best) = Sampler::best(logits) else { return self.masked(logits) };
        clock = lap(&mut self.stats.sample_ns, clock);
        // The masked argmax: the first allowed token in order of likelihood, if it is among
        // the few likeliest (a draw's floor is set by it, so temperature > 0 needs it too).
        let verdict = self.verdict(best.0);
        lap(&mut self.stats.check_ns, clock);
        let top = match verdict {
            Verdict::Allowed => best,
            Verdict::Ask => return self.masked(logits),
            Verdict::Refused => match self.likeliest_allowed(logits, best) {
                Some(top) => top,
                None => return self.masked(logits),
            },
        };
        clock = Instant::now();
        let drawing = self.sampler.propose(logits, top);
        lap(&mut self.stats.sample_ns, clock);
        if !drawing {
            return Ok(top.0);
        }
        for _ in 0..DRAWS {
            let clock = Instant::now();
            let token = self.sampler.redraw();
            let clock = lap(&mut self.stats.sample_ns, clock);
            let verdict = if token == top.0 { Verdict::Allowed } else { self.verdict(token) };
            lap(&mut self.stats.check_ns, clock);
            match verdict {
                Verdict::Allowed => return Ok(token),
                Verdict::Refused => {}
                Verdict::Ask => {
                    let mask = self.mask()?;
                    return if mask.is_allowed(token) { Ok(token) } else { self.sample_masked(logits, &mask) };
                }
            }
        }
        self.masked(logits)
    }

    /// The most likely allowed token after `best` (refused), if it is among the few likeliest
    /// and no token before it needs the mask to tell.
    fn likeliest_allowed(&mut self, logits: &[f32], best: (TokenId, f32)) -> Option<(TokenId, f32)> {
        let clock = Instant::now();
        let mut likeliest = std::mem::take(&mut self.likeliest);
        Sampler::likeliest(logits, best.1, LIKELIEST_SPAN, LIKELIEST_CHECKS, &mut likeliest);
        let clock = lap(&mut self.stats.sample_ns, clock);
        let mut found = None;
        for &(token, logit) in likeliest.iter().filter(|&&(token, _)| token != best.0) {
            match self.verdict(token) {
                Verdict::Allowed => found = Some((token, logit)),
                Verdict::Ask => {}
                Verdict::Refused => continue,
            }
            break;
        }
        self.likeliest = likeliest;
        lap(&mut self.stats.check_ns, clock);
        found
    }

    /// Whether the grammar allows `token` now, as its mask would say. Text tokens are
    /// checked by pushing their bytes through the lexer and parser that the mask's trie walk
    /// uses, so the answer is the mask's (a unit test compares them on every token at every
    /// state of the corpus). End tokens, control tokens and empty tokens reach the mask by
    /// other routes: the check only ever says they are allowed, and leaves a "no" to the mask.
    fn verdict(&mut self, token: TokenId) -> Verdict {
        let end = self.end_tokens.contains(&token);
        let allowed = if end {
            self.matcher.is_accepting().unwrap_or(false)
        } else {
            self.matcher.validate_tokens(&[token]).is_ok_and(|n| n == 1)
        };
        let trie = self.env.tok_trie();
        if allowed {
            Verdict::Allowed
        } else if end || trie.is_special_token(token) || trie.token(token).is_empty() {
            Verdict::Ask
        } else {
            Verdict::Refused
        }
    }

    fn masked(&mut self, logits: &[f32]) -> Result<TokenId, String> {
        let mask = self.mask()?;
        self.sample_masked(logits, &mask)
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

#[cfg(test)]
#[path = "forward_tests.rs"]
mod forward_tests;
