use proptest::prelude::*;
use toktrie::SimpleVob;

use super::*;

fn mask(n: usize, allowed: &[u32]) -> SimpleVob {
    let mut m = SimpleVob::alloc(n);
    for &t in allowed {
        m.allow_token(t);
    }
    m
}

fn greedy() -> Sampler {
    Sampler::new(Sampling { temperature: 0.0, seed: 0, min_p: 0.0, ..Sampling::default() })
}

#[test]
fn greedy_takes_the_best_allowed_token() {
    let logits = [5.0, 1.0, 3.0, 9.0];
    assert_eq!(greedy().sample(&logits, &mask(4, &[0, 1, 2])), Some(0));
    assert_eq!(greedy().sample(&logits, &mask(4, &[1, 2])), Some(2));
    assert_eq!(greedy().sample(&logits, &mask(4, &[0, 1, 2, 3])), Some(3));
}

#[test]
fn greedy_ties_go_to_the_lowest_id_and_nan_never_wins() {
    let logits = [f32::NAN, 2.0, 2.0, f32::NAN];
    assert_eq!(greedy().sample(&logits, &mask(4, &[0, 1, 2, 3])), Some(1));
}

#[test]
fn nothing_allowed_gives_none() {
    assert_eq!(greedy().sample(&[1.0, 2.0], &mask(2, &[])), None);
    // Mask entries past the logits (the mask is rounded up to whole words) do not count.
    assert_eq!(greedy().sample(&[1.0, 2.0], &mask(64, &[40])), None);
}

#[test]
fn the_same_seed_gives_the_same_choices() {
    let logits: Vec<f32> = (0..100).map(|i| (i % 7) as f32).collect();
    let all = mask(100, &(0..100).collect::<Vec<_>>());
    let run = |seed| {
        let mut s = Sampler::new(Sampling { temperature: 1.0, seed, min_p: 0.0, ..Sampling::default() });
        (0..50).map(|_| s.sample(&logits, &all).unwrap()).collect::<Vec<_>>()
    };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8));
}

#[test]
fn temperature_sampling_follows_the_softmax() {
    // p = softmax([0, ln 3]) = [0.25, 0.75]
    let logits = [0.0, 3f32.ln(), 100.0];
    let m = mask(3, &[0, 1]);
    let mut s = Sampler::new(Sampling { temperature: 1.0, seed: 42, min_p: 0.0, ..Sampling::default() });
    let n = 20_000;
    let ones = (0..n).filter(|_| s.sample(&logits, &m) == Some(1)).count();
    let p = ones as f64 / n as f64;
    assert!((p - 0.75).abs() < 0.02, "p = {p}");
}

#[test]
fn a_low_temperature_sharpens_the_choice() {
    let logits = [0.0, 1.0];
    let m = mask(2, &[0, 1]);
    let mut s = Sampler::new(Sampling { temperature: 0.05, seed: 1, min_p: 0.0, ..Sampling::default() });
    assert!((0..1000).all(|_| s.sample(&logits, &m) == Some(1)));
}

#[test]
fn min_p_drops_the_unlikely_tokens() {
    // p(0) / p(1) = e^-3 ≈ 0.05: just under min_p 0.06, just over 0.04.
    let logits = [0.0, 3.0];
    let m = mask(2, &[0, 1]);
    let mut strict = Sampler::new(Sampling { temperature: 2.0, seed: 3, min_p: 0.06, ..Sampling::default() });
    assert!((0..2000).all(|_| strict.sample(&logits, &m) == Some(1)));
    let mut loose = Sampler::new(Sampling { temperature: 2.0, seed: 3, min_p: 0.04, ..Sampling::default() });
    assert!((0..2000).any(|_| loose.sample(&logits, &m) == Some(0)));
}

proptest! {
    #[test]
    fn only_allowed_tokens_are_chosen(
        logits in prop::collection::vec(-50.0f32..50.0, 1..300),
        allowed in prop::collection::vec(any::<u16>(), 0..40),
        temperature in 0.0f32..2.0,
        seed in any::<u64>(),
        min_p in 0.0f32..0.5,
    ) {
        let n = logits.len();
        let allowed: Vec<u32> = allowed.into_iter().map(|t| u32::from(t) % n as u32).collect();
        let m = mask(n, &allowed);
        let mut s = Sampler::new(Sampling { temperature, seed, min_p, ..Sampling::default() });
        match s.sample(&logits, &m) {
            Some(t) => prop_assert!(allowed.contains(&t)),
            None => prop_assert!(allowed.is_empty()),
        }
    }

    // Rows across several of the scans' blocks and lanes, with a remainder, ties, NaN and
    // infinities in them.
    #[test]
    fn the_whole_rows_best_is_the_first_largest_logit(
        logits in prop::collection::vec(prop_oneof![
            400 => (-100i16..100).prop_map(f32::from),
            2 => Just(f32::NAN),
            2 => Just(f32::NEG_INFINITY),
            1 => Just(f32::INFINITY),
        ], 0..700),
    ) {
        let all = mask(logits.len(), &(0..logits.len() as u32).collect::<Vec<_>>());
        prop_assert_eq!(Sampler::best(&logits).map(|b| b.0), greedy().sample(&logits, &all));
        if let Some((id, l)) = Sampler::best(&logits) {
            prop_assert!(l.to_bits() == logits[id as usize].to_bits());
        }
    }
}

#[test]
fn the_whole_rows_best_is_the_greedy_choice_of_a_full_mask() {
    for logits in [vec![5.0, 1.0, 3.0, 9.0], vec![f32::NAN, 2.0, 2.0, f32::NAN], vec![f32::NAN; 3], vec![f32::NEG_INFINITY; 40], (0..100).map(|i| (i % 17) as f32).collect()] {
        let all = mask(logits.len(), &(0..logits.len() as u32).collect::<Vec<_>>());
        assert_eq!(Sampler::best(&logits).map(|b| b.0), greedy().sample(&logits, &all), "{logits:?}");
    }
    assert_eq!(Sampler::best(&[]), None);
}

#[test]
fn the_likeliest_come_best_first_lowest_id_first_among_equals() {
    let logits: Vec<f32> = (0..100).map(|i| (i % 10) as f32).collect();
    let mut out = Vec::new();
    Sampler::likeliest(&logits, 9.0, 1.5, 5, &mut out);
    assert_eq!(out.iter().map(|t| t.0).collect::<Vec<_>>(), [9, 19, 29, 39, 49]);
    Sampler::likeliest(&logits, 9.0, 1.5, 100, &mut out);
    assert_eq!(out.len(), 20);
    assert!(out[..10].iter().all(|t| t.1 == 9.0) && out[10..].iter().all(|t| t.1 == 8.0));
}

#[test]
fn the_likeliest_of_a_flat_row_are_its_best_few() {
    let logits: Vec<f32> = (0..5000).map(|i| ((i * 7919) % 1000) as f32 / 100.0).collect();
    let mut expected: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, &l)| (i as u32, l)).collect();
    expected.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut out = Vec::new();
    Sampler::likeliest(&logits, 9.99, 12.0, 16, &mut out);
    assert_eq!(out, expected[..16]);
}

fn draws(sampling: Sampling, logits: &[f32], m: &SimpleVob, n: usize) -> std::collections::BTreeSet<TokenId> {
    let mut s = Sampler::new(sampling);
    (0..n).map(|_| s.sample(logits, m).unwrap()).collect()
}

#[test]
fn top_k_keeps_the_likeliest_allowed_tokens() {
    // Token 4 is the likeliest but refused: top-k counts among the allowed tokens, as
    // llama.cpp's chain runs after the grammar.
    let logits = [3.0, 2.9, 2.8, 2.7, 9.0];
    let m = mask(5, &[0, 1, 2, 3]);
    let two = Sampling { top_k: 2, ..Sampling::default() };
    assert_eq!(draws(two, &logits, &m, 2000), [0, 1].into());
    assert_eq!(draws(Sampling::default(), &logits, &m, 2000), [0, 1, 2, 3].into());
    let one = Sampling { top_k: 1, seed: 9, ..Sampling::default() };
    assert!(!Sampler::new(one).needs_mask(), "top-k 1 is greedy");
    assert_eq!(draws(one, &logits, &m, 100), [0].into());
}

#[test]
fn top_p_keeps_the_smallest_likeliest_set_that_reaches_it() {
    // p = [0.5, 0.25, 0.125, 0.125]: 0.5 needs one token, 0.6 two, 0.8 three.
    let logits = [3.0, 2.0, 1.0, 1.0].map(|l: f32| l * 2f32.ln());
    let m = mask(4, &[0, 1, 2, 3]);
    for (top_p, kept) in [(0.5, vec![0]), (0.6, vec![0, 1]), (0.8, vec![0, 1, 2])] {
        let got = draws(Sampling { top_p, ..Sampling::default() }, &logits, &m, 3000);
        assert_eq!(got, kept.into_iter().collect(), "top_p {top_p}");
    }
    // Among what top-k kept: 0.6 of [0.5, 0.25] renormalised is the first token alone.
    let both = Sampling { top_k: 2, top_p: 0.6, ..Sampling::default() };
    assert_eq!(draws(both, &logits, &m, 2000), [0].into());
}

#[test]
fn top_k_and_min_p_cut_the_same_order() {
    // min_p 0.2 keeps tokens 0 and 1 (e^-1 > 0.2 > e^-2); top_k 3 would keep three.
    let logits = [0.0, -1.0, -2.0, -3.0];
    let m = mask(4, &[0, 1, 2, 3]);
    let both = Sampling { top_k: 3, min_p: 0.2, ..Sampling::default() };
    assert_eq!(draws(both, &logits, &m, 2000), [0, 1].into());
}

proptest! {
    #[test]
    fn top_k_and_top_p_choose_only_allowed_tokens(
        logits in prop::collection::vec(-50.0f32..50.0, 1..300),
        allowed in prop::collection::vec(any::<u16>(), 1..40),
        seed in any::<u64>(),
        top_k in 0usize..5,
        top_p in 0.05f32..1.0,
    ) {
        let n = logits.len();
        let allowed: Vec<u32> = allowed.into_iter().map(|t| u32::from(t) % n as u32).collect();
        let m = mask(n, &allowed);
        let mut s = Sampler::new(Sampling { seed, top_k, top_p, ..Sampling::default() });
        let token = s.sample(&logits, &m).unwrap();
        prop_assert!(allowed.contains(&token));
        if top_k > 0 {
            let better = allowed.iter().collect::<std::collections::BTreeSet<_>>().into_iter().filter(|&&t| logits[t as usize] > logits[token as usize]).count();
            prop_assert!(better < top_k);
        }
    }
}
