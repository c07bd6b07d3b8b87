use serde_json::{Value, json};

use super::*;
use crate::toy::{self, END};
use crate::{Grammar, Vocabulary};

/// Runs a constraint to its end with `logits_for(step)` and returns the text and final step.
fn run(vocab: &Vocabulary, grammar: &Grammar, sampling: Sampling, mut logits_for: impl FnMut(usize) -> Vec<f32>) -> (Vec<u8>, Step) {
    let compiled = vocab.compile(grammar).unwrap();
    let mut c = Constraint::new(&compiled, sampling);
    let mut out = Vec::new();
    for i in 0..400 {
        match c.step(&logits_for(i)) {
            Step::Token(t) => out.push(t),
            Step::Last(t) => {
                out.push(t);
                return (toy::text(&out), Step::Last(t));
            }
            other => return (toy::text(&out), other),
        }
    }
    panic!("no end after 400 steps: {:?}", String::from_utf8_lossy(&toy::text(&out)));
}

fn noise(seed: u64, n: usize) -> impl FnMut(usize) -> Vec<f32> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    move |_| {
        (0..n)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 8.0 - 4.0
            })
            .collect()
    }
}

#[test]
fn random_logits_still_give_valid_json() {
    let vocab = toy::vocabulary();
    let schema = json!({
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 0, "maximum": 999},
            "ok": {"type": "boolean"},
            "tag": {"enum": ["a", "b"]}
        },
        "required": ["n", "ok", "tag"],
        "additionalProperties": false
    });
    let g = Grammar::JsonSchema(schema);
    for seed in 0..30 {
        let (text, last) = run(&vocab, &g, Sampling { temperature: 1.0, seed, min_p: 0.05 }, noise(seed, vocab.n_vocab()));
        assert!(matches!(last, Step::Last(_) | Step::End), "{last:?}");
        let v: Value = serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(&text)));
        let n = v["n"].as_u64().unwrap();
        assert!(n <= 999);
        assert!(v["ok"].is_boolean());
        assert!(v["tag"] == "a" || v["tag"] == "b");
        assert_eq!(v.as_object().unwrap().len(), 3);
    }
}

#[test]
fn the_output_uses_our_separators() {
    let vocab = toy::vocabulary();
    let g = Grammar::JsonSchema(json!({"type": "object", "properties": {"a": {"const": 1}, "b": {"const": 2}}, "required": ["a", "b"], "additionalProperties": false}));
    let (text, _) = run(&vocab, &g, Sampling { temperature: 0.0, seed: 0, min_p: 0.05 }, |_| vec![0.0; vocab.n_vocab()]);
    assert_eq!(String::from_utf8(text).unwrap(), r#"{"a": 1, "b": 2}"#);
}

#[test]
fn a_complete_value_ends_with_its_last_token() {
    let vocab = toy::vocabulary();
    let g = Grammar::JsonSchema(json!({"enum": ["yes"]}));
    let (text, last) = run(&vocab, &g, Sampling { temperature: 0.0, seed: 0, min_p: 0.05 }, |_| vec![0.0; vocab.n_vocab()]);
    assert_eq!(text, b"\"yes\"");
    assert!(matches!(last, Step::Last(_)), "{last:?}");
}

#[test]
fn the_end_token_is_allowed_only_where_the_grammar_may_end() {
    let vocab = toy::vocabulary();
    // A Lark grammar that may stop after any number of "a"s: the end token is always allowed
    // once one "a" was written, never before.
    let g = Grammar::Lark("start: /a+/".into());
    let mut favour_end = vec![0.0; vocab.n_vocab()];
    favour_end[END as usize] = 10.0;
    let (text, last) = run(&vocab, &g, Sampling { temperature: 0.0, seed: 0, min_p: 0.05 }, |_| favour_end.clone());
    assert_eq!(text, b"a");
    assert_eq!(last, Step::End);
}

#[test]
fn an_impossible_step_is_a_lasting_error_state() {
    let vocab = toy::vocabulary();
    let compiled = vocab.compile(&Grammar::JsonSchema(json!({"type": "boolean"}))).unwrap();
    let mut c = Constraint::new(&compiled, Sampling { temperature: 0.0, seed: 0, min_p: 0.05 });
    assert_eq!(c.step(&[]), Step::Error);
    assert!(c.error().unwrap().contains("no token"));
    assert_eq!(c.step(&vec![0.0; vocab.n_vocab()]), Step::Error);
}

#[test]
fn generations_from_one_compiled_grammar_are_independent() {
    let vocab = toy::vocabulary();
    let compiled = vocab.compile(&Grammar::JsonSchema(json!({"type": "boolean"}))).unwrap();
    let zeros = vec![0.0; vocab.n_vocab()];
    let mut first = Constraint::new(&compiled, Sampling { temperature: 0.0, seed: 0, min_p: 0.05 });
    let step = first.step(&zeros);
    assert!(matches!(step, Step::Token(_) | Step::Last(_)), "{step:?}");
    // The first generation moved on; a second one starts from the start state all the same.
    let mut second = Constraint::new(&compiled, Sampling { temperature: 0.0, seed: 0, min_p: 0.05 });
    assert_eq!(second.step(&zeros), step);
}

#[test]
fn dates_are_real_days() {
    let vocab = toy::vocabulary();
    let g = Grammar::JsonSchema(json!({"type": "string", "format": "date"}));
    for seed in 0..200 {
        let (text, _) = run(&vocab, &g, Sampling { temperature: 1.0, seed, min_p: 0.0 }, noise(seed, vocab.n_vocab()));
        let s = String::from_utf8(text).unwrap();
        let (y, rest) = s.trim_matches('"').split_at(4);
        let (y, m, d): (u32, u32, u32) = (y.parse().unwrap(), rest[1..3].parse().unwrap(), rest[4..6].parse().unwrap());
        let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        let days = [31, if leap { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][m as usize - 1];
        assert!((1..=days).contains(&d), "{s}");
    }
}
