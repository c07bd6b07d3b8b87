//! Choosing a token from a row of logits: from every token (a proposal the grammar then
//! checks), or restricted to the tokens a mask allows.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use toktrie::{SimpleVob, TokenId};

use crate::penalty::Penalties;

/// How a generation samples: llama.cpp's sampler chain (penalties, top_k, top_p, min_p,
/// temperature, draw), applied to the tokens the grammar allows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// 0 (or less) is greedy: the most likely allowed token, the lowest id on a tie.
    pub temperature: f32,
    /// Seeds the generation's random stream: the same seed gives the same tokens.
    pub seed: u64,
    /// Tokens less likely than `min_p` times the best one (before temperature, as llama.cpp's
    /// `min_p` sampler) are never chosen; 0 keeps every allowed token.
    pub min_p: f32,
    /// Only the `top_k` likeliest allowed tokens may be chosen; 0 keeps them all.
    pub top_k: usize,
    /// Only the likeliest allowed tokens whose probabilities (before temperature, among the
    /// `top_k`) first sum to `top_p` may be chosen; 1 keeps them all.
    pub top_p: f32,
    /// Repetition penalties on the logits, before anything else ([`crate::Recent`]).
    pub penalties: Penalties,
}

impl Default for Sampling {
    /// Temperature 1 with every other stage off, seed 0.
    fn default() -> Self {
        Self { temperature: 1.0, seed: 0, min_p: 0.0, top_k: 0, top_p: 1.0, penalties: Penalties::default() }
    }
}

/// A generation's sampler: its random stream, and scratch space reused every step.
#[derive(Debug)]
pub struct Sampler {
    temperature: f32,
    // ln(min_p): the floor below the best logit; -inf keeps all.
    log_min_p: f32,
    top_k: usize,
    top_p: f32,
    rng: SmallRng,
    // The tokens a draw chooses from, with their weights, and the weights' sum.
    candidates: Vec<(TokenId, f32)>,
    total: f32,
}

impl Sampler {
    /// Whether draws are cut to the likeliest allowed tokens (top-k, top-p): a draw from the
    /// whole row cannot stand for the masked draw then ([`Self::propose`] is not exact), so
    /// every step must sample from the mask.
    pub fn needs_mask(&self) -> bool {
        self.temperature > 0.0 && (self.top_k > 0 || self.top_p < 1.0)
    }

    /// A sampler for one generation.
    pub fn new(sampling: Sampling) -> Self {
        Self {
            // Top-k 1 leaves one token to draw: greedy, without the cost of a draw.
            temperature: if sampling.top_k == 1 { 0.0 } else { sampling.temperature },
            log_min_p: if sampling.min_p > 0.0 { sampling.min_p.min(1.0).ln() } else { f32::NEG_INFINITY },
            top_k: sampling.top_k,
            top_p: sampling.top_p,
            rng: SmallRng::seed_from_u64(sampling.seed),
            candidates: Vec::new(),
            total: 0.0,
        }
    }

    /// The most likely token of the whole row (the lowest id on a tie; NaN never wins unless
    /// every logit is NaN, then the last does), or `None` for an empty row: what
    /// [`Self::sample`] chooses at temperature 0 from a mask that allows every token.
    pub fn best(logits: &[f32]) -> Option<(TokenId, f32)> {
        let top = row_max(logits);
        match first_equal(logits, top) {
            Some(i) => Some((i as TokenId, top)),
            // Every logit is NaN: the last one, as the masked argmax takes it.
            None => logits.last().map(|&l| ((logits.len() - 1) as TokenId, l)),
        }
    }

    /// The tokens of the row within `span` of its best logit, likeliest first (the lowest id
    /// first among equals), at most `limit` of them: the order the masked argmax is looked for.
    pub fn likeliest(logits: &[f32], best: f32, span: f32, limit: usize, out: &mut Vec<(TokenId, f32)>) {
        out.clear();
        let mut floor = best - span;
        for (c, chunk) in logits.chunks(LANES).enumerate() {
            if chunk.iter().fold(false, |any, &l| any | (l >= floor)) {
                out.extend(chunk.iter().enumerate().filter(|&(_, &l)| l >= floor).map(|(j, &l)| ((c * LANES + j) as TokenId, l)));
                // A flat row has thousands of tokens within the span: keep the best few as
                // they come, and raise the floor to the last of them.
                if out.len() >= 4 * limit {
                    keep_likeliest(out, limit);
                    floor = out.last().map_or(floor, |t| t.1);
                }
            }
        }
        keep_likeliest(out, limit);
    }

    /// Prepares draws from the whole row as [`Self::sample`] draws from a mask whose best
    /// allowed token is `top`: the same `min_p` floor (set by `top`), the same weights. A draw
    /// ([`Self::redraw`]) that the mask allows then has the masked draw's probability, up to
    /// the share of the row the mask allows; drawing again until one is allowed gives exactly
    /// the masked distribution. At temperature 0 (or a non-finite `top`) there is nothing to
    /// draw: `top` is the masked choice, and this returns `false`.
    pub fn propose(&mut self, logits: &[f32], top: (TokenId, f32)) -> bool {
        let (_, top_logit) = top;
        if self.temperature <= 0.0 || !top_logit.is_finite() {
            return false;
        }
        let inv_t = 1.0 / self.temperature;
        let floor = top_logit + self.log_min_p;
        self.candidates.clear();
        self.total = 0.0;
        let (candidates, total) = (&mut self.candidates, &mut self.total);
        for_each_at_least(logits, floor, |i, l| {
            let w = ((l - top_logit) * inv_t).exp();
            *total += w;
            candidates.push((i as TokenId, w));
        });
        true
    }

    /// One draw from what [`Self::propose`] prepared.
    pub fn redraw(&mut self) -> TokenId {
        let mut target = self.rng.random::<f32>() * self.total;
        for &(token, w) in &self.candidates {
            target -= w;
            if target < 0.0 {
                return token;
            }
        }
        // Rounding can leave a sliver past the last candidate: it belongs to the last one.
        self.candidates.last().map_or(0, |&(token, _)| token)
    }

    /// The chosen token among those `allowed` (entries past the end of `logits` are ignored),
    /// or `None` when the mask allows nothing. Never writes into `logits`.
    pub fn sample(&mut self, logits: &[f32], allowed: &SimpleVob) -> Option<TokenId> {
        let (best, best_logit) = argmax(allowed_logits(logits, allowed))?;
        if self.temperature <= 0.0 || !best_logit.is_finite() {
            return Some(best);
        }
        // Most of a step's cost would be `exp` over tokens that cannot be chosen anyway.
        let floor = best_logit + self.log_min_p;
        self.candidates.clear();
        if self.top_k > 0 || self.top_p < 1.0 {
            self.cut(logits, allowed, best_logit, floor);
        } else {
            let candidates = &mut self.candidates;
            candidates.extend(allowed_logits(logits, allowed).filter(|&(_, l)| l >= floor).map(|(i, l)| (i as TokenId, l)));
        }
        let inv_t = 1.0 / self.temperature;
        self.total = 0.0;
        for (_, w) in &mut self.candidates {
            *w = ((*w - best_logit) * inv_t).exp();
            self.total += *w;
        }
        Some(self.redraw())
    }

    /// Leaves in `candidates` (with their logits) the allowed tokens that top-k, then top-p,
    /// then min-p (`floor`) keep, likeliest first: llama.cpp's chain order, where top-p's
    /// probabilities are those at temperature 1 among what top-k kept.
    fn cut(&mut self, logits: &[f32], allowed: &SimpleVob, best_logit: f32, floor: f32) {
        let pool = &mut self.candidates;
        // Each stage keeps a prefix of the likeliest-first order, so min-p's floor can cut
        // first, except that top-p needs the sum over everything top-k kept.
        let nucleus = self.top_p < 1.0;
        pool.extend(
            allowed_logits(logits, allowed)
                .filter(|&(_, l)| if nucleus { !l.is_nan() } else { l >= floor })
                .map(|(i, l)| (i as TokenId, l)),
        );
        if self.top_k > 0 {
            keep_likeliest(pool, self.top_k);
        }
        let total: f32 = if nucleus { pool.iter().map(|&(_, l)| (l - best_logit).exp()).sum() } else { 0.0 };
        pool.retain(|&(_, l)| l >= floor);
        if self.top_k == 0 {
            keep_likeliest(pool, pool.len());
        }
        if nucleus {
            let mut cumulative = 0.0;
            if let Some(last) = pool.iter().position(|&(_, l)| {
                cumulative += (l - best_logit).exp() / total;
                cumulative >= self.top_p
            }) {
                pool.truncate(last + 1);
            }
        }
    }
}

fn keep_likeliest(tokens: &mut Vec<(TokenId, f32)>, limit: usize) {
    let order = |a: &(TokenId, f32), b: &(TokenId, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if limit > 0 && tokens.len() > limit {
        tokens.select_nth_unstable_by(limit - 1, order);
    }
    tokens.truncate(limit);
    tokens.sort_unstable_by(order);
}

/// Lanes of the scans over a whole row: wide enough for the compiler to use vector
/// instructions (the row is ~50k floats, read once or twice a step).
const LANES: usize = 16;

/// The largest logit of the row, NaN ignored (-inf for an empty or all-NaN row).
fn row_max(logits: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = logits.chunks_exact(LANES);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (m, &l) in lanes.iter_mut().zip(chunk) {
            // A comparison, not `f32::max`: it compiles to one vector max, and a NaN never wins.
            *m = if l > *m { l } else { *m };
        }
    }
    rest.iter().chain(&lanes).fold(f32::NEG_INFINITY, |m, &l| if l > m { l } else { m })
}

/// Where `value` first is in the row, looking closely only at the first block that holds it.
/// A plain `position` compares one float at a time: on 49,152 logits it took 18 µs, against
/// 2 µs for `row_max` and at most 4 µs for this (a release build on the 2-core machine).
fn first_equal(logits: &[f32], value: f32) -> Option<usize> {
    const BLOCK: usize = 16 * LANES;
    let c = logits.chunks(BLOCK).position(|block| block.iter().fold(false, |any, &l| any | (l == value)))?;
    logits[c * BLOCK..].iter().position(|&l| l == value).map(|j| c * BLOCK + j)
}

/// Calls `f(id, logit)` for every entry at or above `floor`, in id order, looking closely
/// only at the chunks that hold one.
fn for_each_at_least(logits: &[f32], floor: f32, mut f: impl FnMut(usize, f32)) {
    for (c, chunk) in logits.chunks(LANES).enumerate() {
        if chunk.iter().fold(false, |any, &l| any | (l >= floor)) {
            for (j, &l) in chunk.iter().enumerate() {
                if l >= floor {
                    f(c * LANES + j, l);
                }
            }
        }
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
