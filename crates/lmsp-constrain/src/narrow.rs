//! What a JSON schema is narrowed to before it is compiled. Every value the narrowed schema
//! allows is valid against the schema as given; what is cut away are the values a small model
//! wanders into and does not come back from, so more of its answers finish within the budget.
//!
//! - **Dates** (`format: date`, `date-time`): exactly the real days and seconds 00–59.
//! - **Declared keys.** An object that declares `properties` and says nothing of others gets
//!   only those: llama.cpp's grammar and OpenAI's strict mode do the same, and without it the
//!   embedded model invents keys (`"2022-01-22T14:…"`) until the budget ends. A schema that
//!   wants more keys says so (`additionalProperties`, `patternProperties`).
//! - **Integers** without a bound get the 64-bit range (as far as the engine, which reads bounds
//!   as doubles, can write it: `-(2^63 - 1024)` to `2^63 - 1`): without a bound the model writes
//!   `1000000000…` to the budget; a 64-bit id still fits.
//!
//! Keys are closed, and integers bounded, only where nothing else can bring a key or a bound
//! in: never in a subschema that is intersected with another (an `allOf` member, the target of
//! a `$ref` beside other keywords, a branch of an `anyOf` beside them, a `dependentSchemas`
//! entry), where the other side's keys would count as undeclared and its bounds could lie past
//! ours; nor under `not` or `if`, where narrowing would widen the whole; nor beside a `const` or
//! an `enum`, whose values may lie outside. Nothing but dates is narrowed where a reference
//! cannot be followed here (`$dynamicRef`, another document, an anchor).
//!
//! This runs on the schema as the client gave it, before anything is dropped for the grammar
//! (lmsp.engine.schema_check): a keyword the grammar leaves to the check of the finished value
//! (`dependentRequired`, `if`/`then`, `minProperties`) still keeps its object open here.

use std::collections::HashSet;

use serde_json::{Map, Value};

use crate::patterns::{VALUES, pointer_token};

/// Keywords that say nothing about which keys an object may have.
const NEUTRAL: [&str; 12] = [
    "$schema", "$id", "$comment", "$defs", "definitions", "title", "description", "default", "examples", "deprecated",
    "readOnly", "type",
];

/// An object with any of these gets keys some other way than `properties`, or has a rule on
/// them the grammar cannot see: it is left open.
const OPENERS: [&str; 19] = [
    "additionalProperties", "patternProperties", "unevaluatedProperties", "minProperties", "allOf", "anyOf", "oneOf",
    "$ref", "$dynamicRef", "not", "if", "then", "else", "dependencies", "dependentSchemas", "dependentRequired",
    "propertyNames", "const", "enum",
];

/// References whose target is only known while validating: nothing is narrowed beside them.
const DYNAMIC: [&str; 2] = ["$dynamicRef", "$recursiveRef"];

/// The bounds an integer without one gets: int64's, save the 1,023 lowest values, which the
/// engine cannot write (it reads bounds as doubles: `-(2^63 - 1)` rounds to `-2^63`, whose
/// negation overflows). `i64::MAX` rounds to `2^63` and saturates back, exact.
const INTEGER_MAX: i64 = i64::MAX;
const INTEGER_MIN: i64 = i64::MIN + 1024;

/// Keywords whose values map names (of properties, definitions) to schemas.
const NAMED: [&str; 6] = ["properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"];

/// The schema narrowed in place: declared keys only, bounded integers, exact dates.
pub fn narrow(schema: &mut Value) {
    let walk = Walk::of(schema);
    if let Some(walk) = &walk {
        for at in walk.closable.difference(&walk.merged) {
            if let Some(Value::Object(map)) = schema.pointer_mut(at) {
                map.insert("additionalProperties".into(), Value::Bool(false));
            }
        }
    }
    each_subschema(schema, "", &mut |at, map| {
        exact_dates(map);
        if walk.as_ref().is_some_and(|walk| !walk.merged.contains(at)) {
            bounded_integer(map);
        }
    });
}

/// Calls `f` on every subschema with its JSON pointer, parents first, but values (`const`,
/// `enum`, `default`, `examples`) and what is under `not` or `if`, where a narrower subschema
/// would make the whole wider. A property named like a keyword (`"default"`, `"not"`) is still
/// a schema.
fn each_subschema(schema: &mut Value, at: &str, f: &mut impl FnMut(&str, &mut Map<String, Value>)) {
    match schema {
        Value::Object(map) => {
            f(at, map);
            for (key, value) in map.iter_mut() {
                let here = format!("{at}/{}", pointer_token(key));
                match (key.as_str(), value) {
                    (name, Value::Object(named)) if NAMED.contains(&name) => {
                        for (sub_name, sub) in named.iter_mut() {
                            each_subschema(sub, &format!("{here}/{}", pointer_token(sub_name)), f);
                        }
                    }
                    (name, value) if !VALUES.contains(&name) && name != "not" && name != "if" => {
                        each_subschema(value, &here, f);
                    }
                    _ => {}
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                each_subschema(item, &format!("{at}/{i}"), f);
            }
        }
        _ => {}
    }
}

// llguidance's `date` and `date-time` allow February 29 in every year and a leap second;
// these allow exactly the valid days (Gregorian leap years) and seconds 00–59: a subset of
// RFC 3339, so every output still validates.
const DAY: &str = concat!(
    r"(?:[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))",
    r"|(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)-02-29)"
);
const TIME: &str = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]+)?(?:[zZ]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])";

/// Replaces `format: date` / `date-time` by an exact pattern where the schema has no pattern
/// of its own.
fn exact_dates(map: &mut Map<String, Value>) {
    let pattern = match map.get("format").and_then(Value::as_str) {
        Some("date") => format!("^{DAY}$"),
        Some("date-time") => format!("^{DAY}[tT]{TIME}$"),
        _ => return,
    };
    if !map.contains_key("pattern") {
        map.remove("format");
        map.insert("pattern".into(), Value::String(pattern));
    }
}

#[derive(Default)]
struct Walk {
    /// Subschemas (JSON pointers) that declare their keys and could be closed.
    closable: HashSet<String>,
    /// Subschemas intersected with another one, and everything under them.
    merged: HashSet<String>,
    /// `$ref` targets still to walk as merged.
    targets: Vec<String>,
}

impl Walk {
    /// Which subschemas declare their keys and which are merged; None where a `$ref` cannot be
    /// followed here (not a JSON pointer into this document, a dynamic reference, or a nested
    /// `$id` that moves what `#` means).
    fn of(schema: &Value) -> Option<Self> {
        let mut walk = Self::default();
        walk.schema(schema, "", false)?;
        while let Some(target) = walk.targets.pop() {
            walk.schema(schema.pointer(&target)?, &target, true)?;
        }
        Some(walk)
    }

    /// Walks the subschema `node` at pointer `at`; None when a `$ref` cannot be followed.
    fn schema(&mut self, node: &Value, at: &str, merged: bool) -> Option<()> {
        let Value::Object(map) = node else { return Some(()) };
        if merged && !self.merged.insert(at.to_string()) {
            return Some(()); // walked as merged already (a recursive `$ref`)
        }
        if !at.is_empty() && map.contains_key("$id") || DYNAMIC.iter().any(|k| map.contains_key(*k)) {
            return None;
        }
        // Any keyword beside a combinator or a `$ref` is intersected with what it brings in.
        let beside = map.keys().filter(|k| !NEUTRAL.contains(&k.as_str())).count() > 1;
        if let Some(reference) = map.get("$ref") {
            let target = local_pointer(reference.as_str()?)?;
            if merged || beside {
                self.targets.push(target);
            }
        }
        if closable(map) {
            self.closable.insert(at.to_string());
        }
        for (key, value) in map {
            let here = format!("{at}/{}", pointer_token(key));
            match key.as_str() {
                "allOf" => self.each(value, &here, true)?,
                "anyOf" | "oneOf" => self.each(value, &here, merged || beside)?,
                "prefixItems" | "items" if value.is_array() => self.each(value, &here, merged)?,
                // A key that a pattern matches too takes both schemas.
                "properties" | "patternProperties" => {
                    let both = merged || map.contains_key("properties") && map.contains_key("patternProperties");
                    self.map(value, &here, both)?;
                }
                // Applied beside the object's (or an item's) own keywords where they apply; and
                // closing inside a negation or a condition would widen what the whole allows.
                "dependentSchemas" | "dependencies" => self.map(value, &here, true)?,
                "then" | "else" | "contains" | "not" | "if" => self.schema(value, &here, true)?,
                // Reached through a `$ref` only: walked as merged from there when it is.
                "$defs" | "definitions" => self.map(value, &here, false)?,
                "items" | "additionalItems" | "additionalProperties" | "unevaluatedItems" | "unevaluatedProperties"
                | "propertyNames" => self.schema(value, &here, merged)?,
                _ => {}
            }
        }
        Some(())
    }

    fn map(&mut self, schemas: &Value, at: &str, merged: bool) -> Option<()> {
        for (name, sub) in schemas.as_object().into_iter().flatten() {
            self.schema(sub, &format!("{at}/{}", pointer_token(name)), merged)?;
        }
        Some(())
    }

    fn each(&mut self, list: &Value, at: &str, merged: bool) -> Option<()> {
        for (i, sub) in list.as_array().into_iter().flatten().enumerate() {
            self.schema(sub, &format!("{at}/{i}"), merged)?;
        }
        Some(())
    }
}

fn closable(map: &Map<String, Value>) -> bool {
    let Some(Value::Object(properties)) = map.get("properties") else { return false };
    let object = match map.get("type") {
        None => true,
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(types)) => types.iter().any(|t| t == "object"),
        Some(_) => false,
    };
    let required_declared = match map.get("required") {
        None => true,
        Some(Value::Array(names)) => names.iter().all(|n| n.as_str().is_some_and(|n| properties.contains_key(n))),
        Some(_) => false,
    };
    object && required_declared && !OPENERS.iter().any(|k| map.contains_key(*k))
}

/// `#` or `#/a/b` as the pointer `serde_json` reads (`""`, `"/a/b"`); None for anything else
/// (another document, an anchor, percent-encoding).
fn local_pointer(reference: &str) -> Option<String> {
    let pointer = reference.strip_prefix('#')?;
    (pointer.is_empty() || pointer.starts_with('/') && !pointer.contains('%')).then(|| pointer.to_string())
}

/// `maximum` `INTEGER_MAX` and `minimum` `INTEGER_MIN` on `type: integer` where the schema
/// sets none (and its other bound leaves room), unless a `const` or `enum` names the values.
fn bounded_integer(map: &mut Map<String, Value>) {
    if map.get("type").and_then(Value::as_str) != Some("integer") || map.contains_key("const") || map.contains_key("enum")
    {
        return;
    }
    let bound = |key: &str| map.get(key).and_then(Value::as_f64);
    let low = bound("minimum").or(bound("exclusiveMinimum"));
    let high = bound("maximum").or(bound("exclusiveMaximum"));
    #[allow(clippy::cast_precision_loss)] // compared as the engine reads them: doubles
    let (max, min) = (INTEGER_MAX as f64, INTEGER_MIN as f64);
    if high.is_none() && low.is_none_or(|low| low < max) {
        map.insert("maximum".into(), INTEGER_MAX.into());
    }
    if low.is_none() && high.is_none_or(|high| high > min) {
        map.insert("minimum".into(), INTEGER_MIN.into());
    }
}

#[cfg(test)]
#[path = "narrow_tests.rs"]
mod tests;
