//! Repetition penalties: llama.cpp's `penalties` sampler, applied to a logits row in place.
//!
//! Under a grammar the row is sampled here rather than by a llama.cpp sampler chain, so the
//! penalties must be the same arithmetic as llama.cpp's (`llama_sampler_penalties_apply`) for
//! a request to mean the same thing with and without a grammar.

use std::collections::VecDeque;

use toktrie::TokenId;

/// llama.cpp's penalty settings; the defaults leave every logit as it is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Penalties {
    /// How many of the latest tokens are looked at (0: none, penalties off).
    pub last_n: usize,
    /// Divides a positive logit of a recent token, multiplies a negative one (1: off).
    pub repeat: f32,
    /// Subtracted from a recent token's logit once per time it was seen (0: off).
    pub frequency: f32,
    /// Subtracted once from the logit of a token seen at all (0: off).
    pub presence: f32,
}

impl Default for Penalties {
    fn default() -> Self {
        Self { last_n: 64, repeat: 1.0, frequency: 0.0, presence: 0.0 }
    }
}

impl Penalties {
    /// Whether these settings change nothing (llama.cpp then leaves the stage out too).
    pub fn is_off(&self) -> bool {
        let neutral = self.repeat == 1.0 && self.frequency == 0.0 && self.presence == 0.0;
        self.last_n == 0 || neutral
    }
}

/// The latest tokens a generation chose (its own output, not its prompt), at most
/// `last_n`, and the penalties to apply for them.
#[derive(Debug, Clone)]
pub struct Recent {
    penalties: Penalties,
    tokens: VecDeque<TokenId>,
    // Scratch for counting, reused every step.
    sorted: Vec<TokenId>,
}

impl Recent {
    /// An empty window.
    pub fn new(penalties: Penalties) -> Self {
        Self { penalties, tokens: VecDeque::new(), sorted: Vec::new() }
    }

    /// Whether [`Self::penalize`] changes anything.
    pub fn is_off(&self) -> bool {
        self.penalties.is_off()
    }

    /// Records a chosen token, forgetting the oldest past `last_n` (llama.cpp's ring buffer).
    pub fn accept(&mut self, token: TokenId) {
        if self.is_off() {
            return;
        }
        if self.tokens.len() >= self.penalties.last_n {
            self.tokens.pop_front();
        }
        self.tokens.push_back(token);
    }

    /// Applies the penalties for the window's tokens to `row`, in place; a token past the row's
    /// end is ignored.
    pub fn penalize(&mut self, row: &mut [f32]) {
        if self.is_off() || self.tokens.is_empty() {
            return;
        }
        self.sorted.clear();
        self.sorted.extend(&self.tokens);
        self.sorted.sort_unstable();
        for run in self.sorted.chunk_by(|a, b| a == b) {
            if let Some(logit) = row.get_mut(run[0] as usize) {
                *logit = penalized(*logit, run.len(), self.penalties);
            }
        }
    }
}

/// A logit after the penalties for a token seen `count` (> 0) times lately: exactly
/// `llama_sampler_penalties_apply`'s formula.
fn penalized(logit: f32, count: usize, p: Penalties) -> f32 {
    // Dividing a negative logit would make the token likelier: llama.cpp multiplies it.
    let scaled = if logit <= 0.0 { logit * p.repeat } else { logit / p.repeat };
    scaled - count as f32 * p.frequency - p.presence
}

#[cfg(test)]
#[path = "penalty_tests.rs"]
mod tests;
