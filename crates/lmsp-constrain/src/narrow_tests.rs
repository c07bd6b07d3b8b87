use serde_json::{Value, json};

use super::*;

fn narrowed(mut schema: Value) -> Value {
    narrow(&mut schema);
    schema
}

/// Whether the subschema at `at` was closed to undeclared keys.
fn closed(schema: &Value, at: &str) -> bool {
    schema.pointer(at).unwrap().get("additionalProperties") == Some(&Value::Bool(false))
}

#[test]
fn an_object_that_declares_its_keys_gets_only_those() {
    let s = narrowed(json!({"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {}}}}}));
    assert!(closed(&s, ""));
    assert!(closed(&s, "/properties/a"));
    assert!(closed(&narrowed(json!({"properties": {"a": {}}, "required": ["a"], "title": "t"})), ""));
}

#[test]
fn a_schema_that_asks_for_other_keys_keeps_them() {
    for schema in [
        json!({"properties": {"a": {}}, "additionalProperties": true}),
        json!({"properties": {"a": {}}, "additionalProperties": {"type": "string"}}),
        json!({"properties": {"a": {}}, "patternProperties": {"^x": {}}}),
        json!({"properties": {"a": {}}, "required": ["a", "b"]}),
        json!({"properties": {"a": {}}, "minProperties": 2}),
        json!({"properties": {"a": {}}, "dependentRequired": {"a": ["b"]}}),
        json!({"type": "array", "properties": {"a": {}}}),
    ] {
        assert_eq!(narrowed(schema.clone()), schema);
    }
}

#[test]
fn merged_subschemas_stay_open() {
    // Each member's keys are undeclared for the other: closing either would refuse {a, b}.
    let s = narrowed(json!({"allOf": [{"properties": {"a": {}}, "required": ["a"]}, {"properties": {"b": {"properties": {"c": {}}}}}]}));
    assert!(!closed(&s, "/allOf/0") && !closed(&s, "/allOf/1") && !closed(&s, "/allOf/1/properties/b"));
    // A branch beside the object's own keys is intersected with them.
    let s = narrowed(json!({"properties": {"a": {}}, "required": ["a"], "anyOf": [{"properties": {"b": {}}}]}));
    assert!(!closed(&s, "") && !closed(&s, "/anyOf/0"));
    // A key both a property and a pattern name takes both schemas; a negation or a condition
    // would widen if what is inside were narrowed.
    let s = narrowed(json!({"properties": {"ab": {"properties": {"x": {}}}}, "patternProperties": {"^a": {"properties": {"y": {}}}}}));
    assert!(!closed(&s, "/properties/ab") && !closed(&s, "/patternProperties/^a"));
    for key in ["not", "if", "then", "else", "contains"] {
        let s = narrowed(json!({key: {"properties": {"x": {}}}}));
        assert!(!closed(&s, &format!("/{key}")), "{key}");
    }
    let s = narrowed(json!({"dependentSchemas": {"a": {"properties": {"x": {}}}}}));
    assert!(!closed(&s, "/dependentSchemas/a"));
    // A branch alone is a whole answer: closed.
    let s = narrowed(json!({"type": "object", "anyOf": [{"properties": {"b": {}}}, {"properties": {"c": {}}}]}));
    assert!(closed(&s, "/anyOf/0") && closed(&s, "/anyOf/1"));
}

#[test]
fn a_ref_target_is_closed_only_where_it_is_not_merged() {
    let defs = json!({"base": {"properties": {"a": {}}}, "leaf": {"properties": {"z": {}}}});
    let s = narrowed(json!({"$defs": defs, "allOf": [{"$ref": "#/$defs/base"}, {"properties": {"b": {}}}], "properties": {"l": {"$ref": "#/$defs/leaf"}}}));
    assert!(!closed(&s, "/$defs/base"));
    assert!(closed(&s, "/$defs/leaf"));
    // Beside other keywords, a `$ref` is merged with them.
    let s = narrowed(json!({"definitions": {"base": {"properties": {"a": {}}}}, "$ref": "#/definitions/base", "properties": {"b": {}}}));
    assert!(!closed(&s, "/definitions/base"));
    // A recursive schema is walked once.
    let s = narrowed(json!({"properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}}));
    assert!(closed(&s, ""));
}

#[test]
fn refs_that_cannot_be_followed_here_leave_every_object_open() {
    for reference in ["other.json#/a", "#anchor", "#/$defs/a%20b"] {
        let schema = json!({"properties": {"a": {"$ref": reference}}, "$defs": {"a b": {}}});
        assert_eq!(narrowed(schema.clone()), schema, "{reference}");
    }
    let schema = json!({"properties": {"a": {"$id": "inner", "properties": {"b": {}}}}});
    assert_eq!(narrowed(schema.clone()), schema);
}

#[test]
fn values_are_not_schemas() {
    let schema = json!({"const": {"properties": {"a": {}}, "type": "integer"}, "default": {"type": "integer"}});
    assert_eq!(narrowed(schema.clone()), schema);
}

#[test]
fn integers_without_a_bound_get_the_64_bit_range() {
    let s = narrowed(json!({"type": "integer"}));
    assert_eq!((s["minimum"].as_i64(), s["maximum"].as_i64()), (Some(INTEGER_MIN), Some(i64::MAX)));
    let s = narrowed(json!({"type": "integer", "minimum": 0}));
    assert_eq!((s["minimum"].as_i64(), s["maximum"].as_i64()), (Some(0), Some(i64::MAX)));
    let s = narrowed(json!({"type": "integer", "exclusiveMaximum": 10}));
    assert_eq!((s["minimum"].as_i64(), s.get("maximum")), (Some(INTEGER_MIN), None));
    // A bound past ours leaves the other side as it was: never an empty range.
    let s = narrowed(json!({"type": "integer", "minimum": 1e20}));
    assert_eq!(s, json!({"type": "integer", "minimum": 1e20}));
    let s = narrowed(json!({"type": "number"}));
    assert_eq!(s, json!({"type": "number"}));
}

#[test]
fn integers_named_or_bounded_elsewhere_are_left_alone() {
    // The values a `const` or an `enum` names may lie past any bound of ours.
    for schema in [json!({"type": "integer", "const": 1e20}), json!({"type": "integer", "enum": [1e20, 2]})] {
        assert_eq!(narrowed(schema.clone()), schema);
    }
    // A member of an `allOf` is intersected with the others, whose bounds could lie past ours.
    let schema = json!({"allOf": [{"type": "integer"}, {"minimum": 1e20}]});
    assert_eq!(narrowed(schema.clone()), schema);
    let schema = json!({"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n", "minimum": 1e20});
    assert_eq!(narrowed(schema.clone()), schema);
}

#[test]
fn objects_with_values_or_dynamic_references_stay_open() {
    for schema in [
        json!({"properties": {"a": {}}, "const": {"a": 1, "b": 2}}),
        json!({"properties": {"a": {}}, "enum": [{"b": 2}]}),
        json!({"$dynamicAnchor": "node", "properties": {"kids": {"items": {"$dynamicRef": "#node"}}}}),
        json!({"properties": {"n": {"type": "integer"}, "x": {"$recursiveRef": "#"}}}),
    ] {
        assert_eq!(narrowed(schema.clone()), schema);
    }
}

#[test]
fn a_property_named_like_a_keyword_is_narrowed_as_a_schema() {
    let s = narrowed(json!({"properties": {"default": {"type": "integer"}, "not": {"format": "date"}}}));
    assert_eq!(s["properties"]["default"]["maximum"].as_i64(), Some(i64::MAX));
    assert!(s["properties"]["not"].get("pattern").is_some());
}

#[test]
fn nothing_under_not_or_if_is_narrowed() {
    // Narrower there would be wider as a whole: `not` a 15-digit integer allows a 16-digit one.
    for key in ["not", "if"] {
        let schema = json!({key: {"type": "integer"}, "properties": {"d": {key: {"format": "date"}}}});
        let s = narrowed(schema.clone());
        assert_eq!((&s[key], &s["properties"]["d"]), (&schema[key], &schema["properties"]["d"]), "{key}");
    }
}
