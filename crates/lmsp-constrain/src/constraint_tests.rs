use serde_json::{Value, json};

use super::*;
use crate::toy::{self, END};
use crate::{Grammar, Penalties, Vocabulary};

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
        let (text, last) = run(&vocab, &g, Sampling { temperature: 1.0, seed, min_p: 0.05, ..Sampling::default() }, noise(seed, vocab.n_vocab()));
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
fn random_logits_write_only_declared_keys_and_64_bit_integers() {
    let vocab = toy::vocabulary();
    let mut schema = json!({"type": "object", "properties": {"n": {"type": "integer"}, "m": {"type": "integer"}}});
    crate::narrow(&mut schema); // as the service narrows it, before compiling
    let g = Grammar::JsonSchema(schema);
    for seed in 0..30 {
        let (text, _) = run(&vocab, &g, Sampling { temperature: 1.0, seed, min_p: 0.05, ..Sampling::default() }, noise(seed, vocab.n_vocab()));
        let v: Value = serde_json::from_slice(&text).unwrap();
        for (key, n) in v.as_object().unwrap() {
            assert!(key == "n" || key == "m", "{key}");
            // serde_json reads `-0` as a float: count the digits of the number as written.
            if n.as_f64() == Some(0.0) {
                continue;
            }
            let digits = n.to_string().trim_start_matches('-').to_string();
            assert!(digits.len() <= 19 && n.is_i64(), "{n}");
        }
    }
}

#[test]
fn objects_merged_by_all_of_still_take_both_sides_keys() {
    let vocab = toy::vocabulary();
    let schema = json!({"type": "object", "allOf": [
        {"properties": {"a": {"const": 1}}, "required": ["a"]},
        {"properties": {"b": {"const": 2}}, "required": ["b"]}
    ]});
    // The members stay open to each other's keys; a model that wants to close does so after both.
    let mut close = vec![0.0; vocab.n_vocab()];
    close[toy::byte(b'}') as usize] = 5.0;
    close[END as usize] = 5.0;
    let (text, _) = run(&vocab, &Grammar::JsonSchema(schema), Sampling { temperature: 0.0, seed: 0, min_p: 0.05, ..Sampling::default() }, |_| close.clone());
    assert_eq!(String::from_utf8(text).unwrap(), r#"{"a": 1, "b": 2}"#);
}

#[test]
fn the_output_uses_our_separators() {
    let vocab = toy::vocabulary();
    let g = Grammar::JsonSchema(json!({"type": "object", "properties": {"a": {"const": 1}, "b": {"const": 2}}, "required": ["a", "b"], "additionalProperties": false}));
    let (text, _) = run(&vocab, &g, Sampling { temperature: 0.0, seed: 0, min_p: 0.05, ..Sampling::default() }, |_| vec![0.0; vocab.n_vocab()]);
    assert_eq!(String::from_utf8(text).unwrap(), r#"{"a": 1, "b": 2}"#);
}

#[test]
fn a_complete_value_ends_with_its_last_token() {
    let vocab = toy::vocabulary();
    let g = Grammar::JsonSchema(json!({"enum": ["yes"]}));
    let (text, last) = run(&vocab, &g, Sampling { temperature: 0.0, seed: 0, min_p: 0.05, ..Sampling::default() }, |_| vec![0.0; vocab.n_vocab()]);
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
    let (text, last) = run(&vocab, &g, Sampling { temperature: 0.0, seed: 0, min_p: 0.05, ..Sampling::default() }, |_| favour_end.clone());
    assert_eq!(text, b"a");
    assert_eq!(last, Step::End);
}

#[test]
fn an_impossible_step_is_a_lasting_error_state() {
    let vocab = toy::vocabulary();
    let compiled = vocab.compile(&Grammar::JsonSchema(json!({"type": "boolean"}))).unwrap();
    let mut c = Constraint::new(&compiled, Sampling { temperature: 0.0, seed: 0, min_p: 0.05, ..Sampling::default() });
    assert_eq!(c.step(&[]), Step::Error);
    assert!(c.error().unwrap().contains("no token"));
    assert_eq!(c.step(&vec![0.0; vocab.n_vocab()]), Step::Error);
}

#[test]
fn generations_from_one_compiled_grammar_are_independent() {
    let vocab = toy::vocabulary();
    let compiled = vocab.compile(&Grammar::JsonSchema(json!({"type": "boolean"}))).unwrap();
    let zeros = vec![0.0; vocab.n_vocab()];
    let mut first = Constraint::new(&compiled, Sampling { temperature: 0.0, seed: 0, min_p: 0.05, ..Sampling::default() });
    let step = first.step(&zeros);
    assert!(matches!(step, Step::Token(_) | Step::Last(_)), "{step:?}");
    // The first generation moved on; a second one starts from the start state all the same.
    let mut second = Constraint::new(&compiled, Sampling { temperature: 0.0, seed: 0, min_p: 0.05, ..Sampling::default() });
    assert_eq!(second.step(&zeros), step);
}

#[test]
fn dates_are_real_days() {
    let vocab = toy::vocabulary();
    let g = Grammar::JsonSchema(json!({"type": "string", "format": "date"}));
    for seed in 0..200 {
        let (text, _) = run(&vocab, &g, Sampling { temperature: 1.0, seed, min_p: 0.0, ..Sampling::default() }, noise(seed, vocab.n_vocab()));
        let s = String::from_utf8(text).unwrap();
        let (y, rest) = s.trim_matches('"').split_at(4);
        let (y, m, d): (u32, u32, u32) = (y.parse().unwrap(), rest[1..3].parse().unwrap(), rest[4..6].parse().unwrap());
        let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        let days = [31, if leap { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][m as usize - 1];
        assert!((1..=days).contains(&d), "{s}");
    }
}

/// The service's schema corpus, shared with the Python tests.
fn corpus() -> Vec<(String, Grammar)> {
    let cases: Vec<Value> = serde_json::from_str(include_str!("../../../tests/fixtures/corpus/json_schemas.json")).unwrap();
    cases.into_iter().map(|c| (c["name"].as_str().unwrap().to_owned(), Grammar::JsonSchema(c["schema"].clone()))).collect()
}

/// Lark grammars shaped like the tool-call ones: free text that never holds the opener, then
/// a call with a JSON body.
fn lark_grammars() -> Vec<Grammar> {
    [
        r#"start: TEXT | calls
calls: "<tool_call>\n" %json {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"], "additionalProperties": false} "\n</tool_call>"
TEXT: /(?s:.+)/ & ~/(?s:.*<tool_call>.*)/
"#,
        "start: /a+/",
        "start: \"yes\" | \"no\" | /[0-9]{1,3}/",
    ]
    .into_iter()
    .map(|g| Grammar::Lark(g.to_owned()))
    .collect()
}

#[test]
fn a_checked_token_is_one_the_mask_allows_and_the_mask_allows_no_other() {
    // At every state of random walks through the corpus, the single-token check agrees with
    // the mask on every token of the vocabulary: the fast path chooses from the mask's set.
    let vocab = toy::vocabulary();
    let n = vocab.n_vocab();
    let mut states = 0;
    for (index, grammar) in corpus().into_iter().map(|(_, g)| g).chain(lark_grammars()).enumerate() {
        let compiled = vocab.compile(&grammar).unwrap();
        for seed in 0..3 {
            let mut walk = Constraint::with_check(&compiled, Sampling { temperature: 1.0, seed, min_p: 0.0, ..Sampling::default() }, Check::EveryMask);
            let mut logits = noise(seed + 100 * index as u64, n);
            for _ in 0..120 {
                if walk.matcher.is_stopped() {
                    break;
                }
                let mask = walk.matcher.compute_mask().unwrap();
                for token in 0..n as TokenId {
                    assert_eq!(walk.verdict(token) == Verdict::Allowed, mask.is_allowed(token), "{grammar:?}: token {token} after {:?}", walk.matcher.get_error());
                }
                states += 1;
                if !matches!(walk.step(&logits(0)), Step::Token(_)) {
                    break;
                }
            }
        }
    }
    assert!(states > 1000, "{states}");
}

#[test]
fn greedy_outputs_are_the_full_mask_outputs() {
    let vocab = toy::vocabulary();
    for (name, grammar) in corpus().into_iter().chain(lark_grammars().into_iter().map(|g| (format!("{g:?}"), g))) {
        for seed in 0..4 {
            let sampling = Sampling { temperature: 0.0, seed, min_p: 0.05, ..Sampling::default() };
            let checked = run_with(&vocab, &grammar, sampling, Check::SampledToken, noise(seed, vocab.n_vocab()));
            let masked = run_with(&vocab, &grammar, sampling, Check::EveryMask, noise(seed, vocab.n_vocab()));
            assert_eq!(checked, masked, "{name}");
        }
    }
}

fn run_with(vocab: &Vocabulary, grammar: &Grammar, sampling: Sampling, check: Check, mut logits_for: impl FnMut(usize) -> Vec<f32>) -> (Vec<TokenId>, Step) {
    let compiled = vocab.compile(grammar).unwrap();
    let mut c = Constraint::with_check(&compiled, sampling, check);
    let mut out = Vec::new();
    for i in 0..400 {
        match c.step(&logits_for(i)) {
            Step::Token(t) => out.push(t),
            other => return (out, other),
        }
    }
    (out, Step::Token(0))
}

/// Pearson's chi-square statistic of `counts` against `probabilities` (same order).
fn chi_square(counts: &[u64], probabilities: &[f64]) -> f64 {
    let n: u64 = counts.iter().sum();
    counts.iter().zip(probabilities).map(|(&c, &p)| (c as f64 - n as f64 * p).powi(2) / (n as f64 * p)).sum()
}

/// The token id of one byte in the toy vocabulary.
fn byte(b: u8) -> TokenId {
    TokenId::from(b) + 1
}

#[test]
fn sampled_tokens_follow_the_masked_distribution() {
    // First token of `[abcd]`: a, b, c, d allowed; x and y are refused. min_p 0.05 puts the
    // floor 3.0 below the best *allowed* logit, as the masked sampler does: d is under it.
    let vocab = toy::vocabulary();
    let compiled = vocab.compile(&Grammar::Lark("start: /[abcd]/".into())).unwrap();
    let allowed = [(b'a', 2.0f32), (b'b', 1.0), (b'c', -0.5), (b'd', -1.5)];
    // Best allowed, with refused tokens likely enough to be drawn often; then best refused,
    // where a floor set by the whole row's best (x) would wrongly drop c.
    for refused in [[(b'x', 1.5f32), (b'y', 0.5)], [(b'x', 3.0), (b'y', 2.5)]] {
        let mut logits = vec![-30.0f32; vocab.n_vocab()];
        for &(b, l) in allowed.iter().chain(&refused) {
            logits[byte(b) as usize] = l;
        }
        let weights: Vec<f64> = allowed[..3].iter().map(|&(_, l)| f64::from(l).exp()).collect();
        let total: f64 = weights.iter().sum();
        let expected: Vec<f64> = weights.iter().map(|w| w / total).collect();
        let mut counts = [0u64; 3];
        let draws = 20_000;
        let mut masks = 0;
        for seed in 0..draws {
            let mut c = Constraint::new(&compiled, Sampling { temperature: 1.0, seed, min_p: 0.05, ..Sampling::default() });
            let Step::Last(token) = c.step(&logits) else { panic!("one byte completes the grammar") };
            let i = allowed.iter().position(|&(b, _)| byte(b) == token).unwrap_or_else(|| panic!("token {token} is not allowed"));
            assert!(i < 3, "d is below min_p");
            counts[i] += 1;
            masks += c.stats().masks;
        }
        // df = 2: P(chi² > 30) ≈ 3e-7 under the masked distribution; the seeds are fixed.
        let stat = chi_square(&counts, &expected);
        assert!(stat < 30.0, "chi² = {stat}: {counts:?} against {expected:?}");
        // Refused draws are drawn again: a mask only after several in a row (with x and y
        // holding 3/4 of the row, about 0.75^4 of the steps).
        assert!(masks < draws / 2, "{masks} masks for {draws} draws");
    }
}

#[test]
fn the_full_mask_check_masks_every_step_and_the_sampled_check_few() {
    let vocab = toy::vocabulary();
    let grammar = Grammar::JsonSchema(json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}}, "required": ["name"], "additionalProperties": false}));
    let compiled = vocab.compile(&grammar).unwrap();
    let mut logits = vec![0.0f32; vocab.n_vocab()];
    // A model that likes the JSON it must write, and the letter a.
    for t in [byte(b'{'), byte(b'"'), byte(b'a'), byte(b'}'), byte(b':'), byte(b' ')] {
        logits[t as usize] = 1.0;
    }
    for (check, all_masked) in [(Check::EveryMask, true), (Check::SampledToken, false)] {
        let mut c = Constraint::with_check(&compiled, Sampling { temperature: 0.0, seed: 0, min_p: 0.05, ..Sampling::default() }, check);
        while let Step::Token(_) = c.step(&logits) {}
        let stats = c.stats();
        assert!(stats.steps > 10, "{stats:?}");
        assert_eq!(stats.masks == stats.steps, all_masked, "{stats:?}");
    }
}

#[test]
fn top_k_one_under_a_grammar_is_greedy() {
    let vocab = toy::vocabulary();
    let g = Grammar::JsonSchema(json!({"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string", "maxLength": 8}}, "required": ["n", "s"], "additionalProperties": false}));
    for seed in 0..10 {
        let greedy = run(&vocab, &g, Sampling { temperature: 0.0, ..Sampling::default() }, noise(seed, vocab.n_vocab()));
        let top_1 = run(&vocab, &g, Sampling { temperature: 1.0, seed, top_k: 1, ..Sampling::default() }, noise(seed, vocab.n_vocab()));
        assert_eq!(top_1, greedy);
    }
}

#[test]
fn top_k_under_a_grammar_still_gives_valid_json() {
    let vocab = toy::vocabulary();
    let g = Grammar::JsonSchema(json!({"type": "array", "items": {"type": "integer"}, "maxItems": 5}));
    for seed in 0..20 {
        let sampling = Sampling { temperature: 1.0, seed, top_k: 3, top_p: 0.9, min_p: 0.05, ..Sampling::default() };
        let (text, _) = run(&vocab, &g, sampling, noise(seed, vocab.n_vocab()));
        let v: Value = serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(&text)));
        // A long integer is read back as a float: the text is an integer all the same.
        assert!(v.as_array().is_some_and(|a| a.len() <= 5 && a.iter().all(Value::is_number)), "{v}");
    }
}

#[test]
fn penalties_under_a_grammar_push_the_output_off_a_repeated_token() {
    let vocab = toy::vocabulary();
    // Any string of letters; the logits always favour "a" a little over "b".
    let g = Grammar::Lark(r#"start: /[ab]{12}/"#.into());
    let mut row = vec![-10.0; vocab.n_vocab()];
    row[1 + usize::from(b'a')] = 2.0;
    row[1 + usize::from(b'b')] = 1.0;
    let generate = |penalties: Penalties| {
        let compiled = vocab.compile(&g).unwrap();
        let mut c = Constraint::new(&compiled, Sampling { temperature: 0.0, penalties, ..Sampling::default() });
        let mut out = Vec::new();
        loop {
            let mut logits = row.clone();
            assert_eq!(c.penalized(), !penalties.is_off());
            c.penalize(&mut logits);
            match c.step(&logits) {
                Step::Token(t) => out.push(t),
                Step::Last(t) => break out.push(t),
                other => panic!("{other:?}"),
            }
        }
        String::from_utf8(toy::text(&out)).unwrap()
    };
    assert_eq!(generate(Penalties::default()), "aaaaaaaaaaaa");
    // Once "a" was seen, presence 1.5 puts it below "b"; once both were, "a" leads again.
    let presence = Penalties { presence: 1.5, ..Penalties::default() };
    assert_eq!(generate(presence), "abaaaaaaaaaa");
    // Frequency 1 takes one off per time seen: "a" leads while seen at most once more than
    // "b" (a tie goes to "a", the lower id).
    let frequency = Penalties { frequency: 1.0, ..Penalties::default() };
    assert_eq!(generate(frequency), "aabababababa");
    // Repeat 4 brings a seen "a" to 0.5, below an unseen "b"; then both are divided.
    let repeat = Penalties { repeat: 4.0, ..Penalties::default() };
    assert_eq!(generate(repeat), "abaaaaaaaaaa");
}
