//! Choosing a token from a row of logits: from every token (a proposal the grammar then
//! checks), or restricted to the tokens a mask allows.

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

    /// The most likely token of the whole row (the lowest id on a tie; NaN never wins unless
    /// every logit is NaN), or `None` for an empty row. With no mask it is what [`Self::sample`]
    /// would choose at temperature 0 from a mask that allows it.
    pub fn best(logits: &[f32]) -> Option<(TokenId, f32)> {
        argmax(logits.iter().copied().enumerate())
    }

    /// A token drawn from the whole row as [`Self::sample`] draws from a mask that allows every
    /// token, given the row's [`Self::best`]: at temperature 0, `best` itself. When the mask
    /// allows `best`, both draws keep the same tokens under `min_p` (its floor is set by the
    /// best allowed token), so an allowed draw here has the masked draw's probability, up to
    /// the share of the row the mask allows.
    pub fn propose(&mut self, logits: &[f32], best: (TokenId, f32)) -> TokenId {
        let (best, best_logit) = best;
        if self.temperature <= 0.0 || !best_logit.is_finite() {
            return best;
        }
        self.draw(logits.iter().copied().enumerate(), best, best_logit)
    }

    /// The chosen token among those `allowed` (entries past the end of `logits` are ignored),
    /// or `None` when the mask allows nothing. Never writes into `logits`.
    pub fn sample(&mut self, logits: &[f32], allowed: &SimpleVob) -> Option<TokenId> {
        let (best, best_logit) = argmax(allowed_logits(logits, allowed))?;
        if self.temperature <= 0.0 || !best_logit.is_finite() {
            return Some(best);
        }
        Some(self.draw(allowed_logits(logits, allowed), best, best_logit))
    }

    fn draw(&mut self, row: impl Iterator<Item = (usize, f32)>, best: TokenId, best_logit: f32) -> TokenId {
        let inv_t = 1.0 / self.temperature;
        // Most of a step's cost would be `exp` over tokens that cannot be chosen anyway.
        let floor = best_logit + self.log_min_p;
        self.candidates.clear();
        let mut total = 0.0f32;
        for (i, l) in row {
            if l >= floor {
                let w = ((l - best_logit) * inv_t).exp();
                total += w;
                self.candidates.push((i as TokenId, w));
            }
        }
        let mut target = self.rng.random::<f32>() * total;
        for &(token, w) in &self.candidates {
            target -= w;
            if target < 0.0 {
                return token;
            }
        }
        // Rounding can leave a sliver past the last candidate: it belongs to the last one.
        self.candidates.last().map_or(best, |&(token, _)| token)
    }
}

/// The allowed entries of the row, in id order; mask entries past the row's end are ignored.
fn allowed_logits<'a>(logits: &'a [f32], allowed: &'a SimpleVob) -> impl Iterator<Item = (usize, f32)> + 'a {
    allowed.iter().map_while(|i| logits.get(i as usize).map(|&l| (i as usize, l)))
}

fn argmax(row: impl Iterator<Item = (usize, f32)>) -> Option<(TokenId, f32)> {
    let mut best: Option<(TokenId, f32)> = None;
    for (i, l) in row {
        // NaN logits never win; the first of equal logits does (as llama.cpp's greedy).
        if best.is_none_or(|(_, b)| l > b || b.is_nan()) {
            best = Some((i as TokenId, l));
        }
    }
    best
}

#[cfg(test)]
#[path = "sample_tests.rs"]
mod tests;
