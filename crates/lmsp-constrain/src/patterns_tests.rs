use serde_json::{Value, json};

use super::*;
use crate::{Grammar, toy};

fn refusal(schema: &Value) -> String {
    check_patterns(schema).unwrap_err().message
}

#[test]
fn a_pattern_ecma_262_rejects_is_refused_where_it_is() {
    let message = refusal(&json!({"type": "object", "properties": {"code": {"type": "string", "pattern": "foo**"}}}));
    assert!(message.contains(r#"pattern "foo**" at /properties/code/pattern"#), "{message}");
    assert!(message.contains("ECMA-262"), "{message}");
}

#[test]
fn pattern_properties_keys_are_patterns_too() {
    let message = refusal(&json!({"type": "object", "patternProperties": {"^a/b{2,1}$": {"type": "string"}}}));
    assert!(message.contains("at /patternProperties/^a~1b{2,1}$"), "{message}");
}

#[test]
fn patterns_inside_arrays_and_definitions_are_found() {
    let message = refusal(&json!({"anyOf": [{"type": "null"}, {"$ref": "#/$defs/d"}], "$defs": {"d": {"items": {"pattern": "[z-a]"}}}}));
    assert!(message.contains("/$defs/d/items/pattern"), "{message}");
    assert!(refusal(&json!({"anyOf": [{"type": "null"}, {"pattern": "(?i)x"}]})).contains("/anyOf/1/pattern"));
}

#[test]
fn valid_and_legacy_patterns_pass() {
    // `\-` outside a class and `]` alone are Annex B forms that real schemas carry.
    for pattern in [r"^[a-z0-9\-_]+$", r"^\d{3}-\d{4}$", r"a\-b", "]", r"^\S+@\S+\.\S+$", r"(?<year>\d{4})"] {
        assert!(check_patterns(&json!({"pattern": pattern})).is_ok(), "{pattern}");
    }
}

#[test]
fn values_are_not_schemas() {
    let schema = json!({"const": {"pattern": "foo**"}, "enum": [{"pattern": "**"}], "default": {"pattern": "("},
                        "examples": [{"patternProperties": {"(": 1}}]});
    assert!(check_patterns(&schema).is_ok());
}

#[test]
fn a_property_named_pattern_is_a_schema_not_a_regex() {
    assert!(check_patterns(&json!({"properties": {"pattern": {"type": "string"}}})).is_ok());
}

#[test]
fn compiling_a_schema_refuses_its_bad_pattern_before_the_engine_reads_it() {
    let vocab = toy::vocabulary();
    let err = vocab.compile(&Grammar::JsonSchema(json!({"type": "string", "pattern": "foo**"}))).unwrap_err();
    assert!(err.message.contains(r#"pattern "foo**" at /pattern"#), "{err}");
    assert_eq!(vocab.cached_grammars(), 0);
}
