use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::toy;

#[test]
fn empty_vocabulary_and_end_token_outside_it_are_refused() {
    assert!(matches!(Vocabulary::new(&[], &[0]), Err(VocabularyError::Empty)));
    assert!(matches!(Vocabulary::new(&toy::tokens(), &[]), Err(VocabularyError::Empty)));
    let n = toy::tokens().len() as TokenId;
    assert!(matches!(
        Vocabulary::new(&toy::tokens(), &[n]),
        Err(VocabularyError::BadEndToken(t)) if t == n
    ));
}

#[test]
fn the_same_grammar_compiles_once() {
    let vocab = toy::vocabulary();
    let g = Grammar::JsonSchema(json!({"type": "boolean"}));
    let a = vocab.compile(&g).unwrap();
    let b = vocab.compile(&g).unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!(vocab.cached_grammars(), 1);
}

#[test]
fn the_cache_is_bounded_and_keeps_recent_grammars() {
    let vocab = toy::vocabulary();
    let hot = Grammar::JsonSchema(json!({"type": "boolean"}));
    let first = vocab.compile(&hot).unwrap();
    for i in 0..200 {
        vocab.compile(&Grammar::JsonSchema(json!({"const": i}))).unwrap();
        vocab.compile(&hot).unwrap();
    }
    assert_eq!(vocab.cached_grammars(), CACHE_ENTRIES);
    assert!(Arc::ptr_eq(&first, &vocab.compile(&hot).unwrap()));
}

#[test]
fn unsupported_keywords_are_named() {
    let vocab = toy::vocabulary();
    let err = vocab
        .compile(&Grammar::JsonSchema(json!({"type": "object", "unevaluatedProperties": {"type": "string"}, "if": {}})))
        .unwrap_err();
    assert!(err.message.contains("if") || err.message.contains("unevaluatedProperties"), "{err}");
}

#[test]
fn a_client_cannot_switch_on_leniency() {
    let vocab = toy::vocabulary();
    let schema = json!({"type": "string", "if": {}, "x-guidance": {"lenient": true}});
    assert!(vocab.compile(&Grammar::JsonSchema(schema)).is_err());
}

#[test]
fn remote_refs_are_refused() {
    let vocab = toy::vocabulary();
    let schema = json!({"$ref": "https://example.com/schema.json"});
    let err = vocab.compile(&Grammar::JsonSchema(schema)).unwrap_err();
    assert!(err.message.contains("$ref") || err.message.contains("ref"), "{err}");
}

#[test]
fn local_refs_compile() {
    let vocab = toy::vocabulary();
    let schema = json!({
        "$defs": {"flag": {"type": "boolean"}},
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/flag"}},
        "required": ["a"]
    });
    vocab.compile(&Grammar::JsonSchema(schema)).unwrap();
}

#[test]
fn errors_are_one_line() {
    let vocab = toy::vocabulary();
    let err = vocab.compile(&Grammar::Lark("start: (".into())).unwrap_err();
    assert!(!err.message.is_empty() && !err.message.contains('\n'), "{err:?}");
}
