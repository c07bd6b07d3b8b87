//! Choosing a token from a row of logits, restricted to the tokens a mask allows.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use toktrie::{SimpleVob, TokenId};

/// How a generation samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// 0 (or less) is greedy: the most likely allowed token, the lowest id on a tie.
    pub temperature: f32,
    /// Seeds the generation's random stream: the same seed gives the same tokens.
    pub seed: u64,
    /// Tokens less likely than `min_p` times the best one (before temperature, as llama.cpp's
    /// `min_p` sampler) are never chosen; 0 keeps every allowed token.
    pub min_p: f32,
}

/// A generation's sampler: its random stream, and scratch space reused every step.
#[derive(Debug)]
pub struct Sampler {
    temperature: f32,
    // ln(min_p): the floor below the best logit; -inf keeps all.
    log_min_p: f32,
    rng: SmallRng,
    candidates: Vec<(TokenId, f32)>,
}

impl Sampler {
    /// A sampler for one generation.
    pub fn new(sampling: Sampling) -> Self {
        Self {
            temperature: sampling.temperature,
            log_min_p: if sampling.min_p > 0.0 { sampling.min_p.min(1.0).ln() } else { f32::NEG_INFINITY },
            rng: SmallRng::seed_from_u64(sampling.seed),
            candidates: Vec::new(),
        }
    }

    /// The chosen token among those `allowed` (entries past the end of `logits` are ignored),
    /// or `None` when the mask allows nothing. Never writes into `logits`.
    pub fn sample(&mut self, logits: &[f32], allowed: &SimpleVob) -> Option<TokenId> {
        let (best, best_logit) = argmax(logits, allowed)?;
        if self.temperature <= 0.0 || !best_logit.is_finite() {
            return Some(best);
        }
        let inv_t = 1.0 / self.temperature;
        // Most of a step's cost would be `exp` over tokens that cannot be chosen anyway.
        let floor = best_logit + self.log_min_p;
        self.candidates.clear();
        let mut total = 0.0f32;
        allowed.iter_set_entries(|i| {
            if let Some(&l) = logits.get(i) {
                if l >= floor {
                    let w = ((l - best_logit) * inv_t).exp();
                    total += w;
                    self.candidates.push((i as TokenId, w));
                }
            }
        });
        let mut target = self.rng.random::<f32>() * total;
        for &(token, w) in &self.candidates {
            target -= w;
            if target < 0.0 {
                return Some(token);
            }
        }
        // Rounding can leave a sliver past the last candidate: it belongs to the last one.
        self.candidates.last().map(|&(token, _)| token).or(Some(best))
    }
}

fn argmax(logits: &[f32], allowed: &SimpleVob) -> Option<(TokenId, f32)> {
    let mut best: Option<(TokenId, f32)> = None;
    allowed.iter_set_entries(|i| {
        if let Some(&l) = logits.get(i) {
            // NaN logits never win; the first of equal logits does (as llama.cpp's greedy).
            if best.is_none_or(|(_, b)| l > b || b.is_nan()) {
                best = Some((i as TokenId, l));
            }
        }
    });
    best
}

#[cfg(test)]
#[path = "sample_tests.rs"]
mod tests;
