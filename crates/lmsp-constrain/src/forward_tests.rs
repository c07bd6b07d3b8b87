//! Fast-forward: forced tokens committed in runs keep the grammar state in step with the text.

use serde_json::{Value, json};

use crate::toy;
use crate::{Constraint, Grammar, Sampling, Step, TokenId, Vocabulary};

fn greedy() -> Sampling {
    Sampling { temperature: 0.0, seed: 0, min_p: 0.05, ..Sampling::default() }
}

/// Runs to the end, fast-forwarding at most `max` tokens after each sampled one: the tokens,
/// the steps taken, and the tokens forced.
fn run(vocab: &Vocabulary, grammar: &Grammar, sampling: Sampling, max: usize, mut logits_for: impl FnMut(usize) -> Vec<f32>) -> (Vec<TokenId>, u64, u64) {
    let compiled = vocab.compile(grammar).unwrap();
    let mut c = Constraint::new(&compiled, sampling);
    let mut out = Vec::new();
    for i in 0..400 {
        match c.step(&logits_for(i)) {
            Step::Token(t) => {
                out.push(t);
                out.extend_from_slice(c.fast_forward(max));
                if c.is_complete() {
                    break;
                }
            }
            Step::Last(t) => {
                out.push(t);
                break;
            }
            Step::End => break,
            Step::Error => panic!("{:?}", c.error()),
        }
    }
    assert!(c.error().is_none());
    (out, c.stats().steps, c.stats().forced)
}

/// Zeros, but a quote above all: strings end at once, the rest goes to the lowest allowed id.
fn quotes(n: usize) -> impl FnMut(usize) -> Vec<f32> {
    move |_| {
        let mut row = vec![0.0; n];
        row[toy::byte(b'"') as usize] = 5.0;
        row
    }
}

fn object() -> Grammar {
    Grammar::JsonSchema(json!({
        "type": "object",
        "properties": {"name": {"type": "string"}, "ok": {"type": "boolean"}, "tag": {"enum": ["alpha", "beta"]}},
        "required": ["name", "ok", "tag"],
        "additionalProperties": false
    }))
}

#[test]
fn forced_keys_cost_no_steps_and_the_text_is_the_same() {
    let plain = toy::vocabulary();
    let forcing = toy::forcing_vocabulary();
    let n = plain.n_vocab();
    let (without, steps_without, forced_without) = run(&plain, &object(), greedy(), usize::MAX, quotes(n));
    let (with, steps_with, forced_with) = run(&forcing, &object(), greedy(), usize::MAX, quotes(n));
    // A vocabulary built without forcing never forces: today's behaviour, token for token.
    assert_eq!(forced_without, 0);
    assert!(forced_with > 5, "{forced_with}");
    assert_eq!(steps_with + forced_with, with.len() as u64);
    assert!(steps_with < steps_without, "{steps_with} vs {steps_without}");
    let text = String::from_utf8(toy::text(&with)).unwrap();
    assert_eq!(text, String::from_utf8(toy::text(&without)).unwrap());
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v.as_object().unwrap().len(), 3);
}

#[test]
fn a_run_stops_at_its_bound_and_the_grammar_goes_on_from_there() {
    let vocab = toy::forcing_vocabulary();
    let n = vocab.n_vocab();
    let (all, _, _) = run(&vocab, &object(), greedy(), usize::MAX, quotes(n));
    for max in [1, 2, 3] {
        let compiled = vocab.compile(&object()).unwrap();
        let mut c = Constraint::new(&compiled, greedy());
        let first = c.step(&quotes(n)(0));
        assert!(matches!(first, Step::Token(_)), "{first:?}");
        assert!(c.fast_forward(max).len() <= max);
        // The same output, bound or not: what was not forced now is forced (or chosen) later.
        let (bounded, _, forced) = run(&vocab, &object(), greedy(), max, quotes(n));
        assert_eq!(toy::text(&bounded), toy::text(&all), "max {max}");
        assert!(forced > 0);
    }
    let compiled = vocab.compile(&object()).unwrap();
    let mut c = Constraint::new(&compiled, greedy());
    c.step(&quotes(n)(0));
    assert!(c.fast_forward(0).is_empty());
}

#[test]
fn a_run_that_completes_the_grammar_ends_the_output() {
    let vocab = toy::forcing_vocabulary();
    let compiled = vocab.compile(&Grammar::JsonSchema(json!({"enum": ["alphabet"]}))).unwrap();
    let mut c = Constraint::new(&compiled, greedy());
    let Step::Token(first) = c.step(&vec![0.0; vocab.n_vocab()]) else { panic!("the first token ends nothing") };
    let mut out = vec![first];
    out.extend_from_slice(c.fast_forward(usize::MAX));
    assert!(c.is_complete());
    assert_eq!(toy::text(&out), b"\"alphabet\"");
    assert_eq!(c.step(&vec![0.0; vocab.n_vocab()]), Step::End);
}

#[test]
fn random_logits_with_fast_forward_still_give_valid_json() {
    let vocab = toy::forcing_vocabulary();
    let n = vocab.n_vocab();
    for seed in 0..30u64 {
        let mut state: u64 = seed + 1;
        let noise = move |_| {
            (0..n)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ((state >> 40) as f32 / (1u64 << 24) as f32) * 8.0 - 4.0
                })
                .collect()
        };
        let sampling = Sampling { temperature: 1.0, seed, min_p: 0.05, ..Sampling::default() };
        let (out, _, forced) = run(&vocab, &object(), sampling, usize::MAX, noise);
        let text = toy::text(&out);
        let v: Value = serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(&text)));
        assert!(v["name"].is_string() && v["ok"].is_boolean());
        assert!(v["tag"] == "alpha" || v["tag"] == "beta");
        assert!(forced > 0);
    }
}
