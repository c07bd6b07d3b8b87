//! A schema's regular expressions, checked in the dialect JSON Schema names (ECMA-262).
//!
//! llguidance reads `pattern` with its own, more lenient regex syntax: `foo**` compiles there
//! and means something no ECMA-262 validator would agree with, so a client's own validator
//! and our output could disagree. Refusing such a pattern is the only answer both sides share.

use serde_json::Value;

use crate::error::CompileError;

/// Keywords whose values are data, not schemas: a `pattern` key inside them is not a regex.
pub(crate) const VALUES: [&str; 4] = ["const", "enum", "default", "examples"];

/// Every `pattern` and `patternProperties` key in `schema` parses as ECMA-262; the error names
/// one that does not and where it is (a JSON pointer into the schema).
pub(crate) fn check_patterns(schema: &Value) -> Result<(), CompileError> {
    let mut stack = vec![(schema, String::new())];
    while let Some((node, at)) = stack.pop() {
        match node {
            Value::Object(map) => {
                for (key, value) in map {
                    if VALUES.contains(&key.as_str()) {
                        continue;
                    }
                    let here = format!("{at}/{}", pointer_token(key));
                    match (key.as_str(), value) {
                        ("pattern", Value::String(pattern)) => check(pattern, &here)?,
                        ("patternProperties", Value::Object(properties)) => {
                            for name in properties.keys() {
                                check(name, &format!("{here}/{}", pointer_token(name)))?;
                            }
                        }
                        _ => {}
                    }
                    stack.push((value, here));
                }
            }
            Value::Array(items) => stack.extend(items.iter().enumerate().map(|(i, v)| (v, format!("{at}/{i}")))),
            _ => {}
        }
    }
    Ok(())
}

fn check(pattern: &str, at: &str) -> Result<(), CompileError> {
    // No flags: JSON Schema gives none, and without `u` the syntax keeps the web's legacy
    // forms (Annex B) that real schemas use, such as `\-` outside a class.
    regress::Regex::with_flags(pattern, "").map(drop).map_err(|err| {
        CompileError::new(format!("pattern {pattern:?} at {at} is not an ECMA-262 regular expression: {err}"))
    })
}

/// RFC 6901: `~` and `/` in a key are escaped in a pointer.
pub(crate) fn pointer_token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
#[path = "patterns_tests.rs"]
mod tests;
