//! Grammars in, compiled start states out.

use std::sync::{Arc, Mutex};

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{Value, json};
use toktrie::{TokEnv, TokenId};

use crate::error::CompileError;
use crate::patterns::check_patterns;

/// What a generation's output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum Grammar {
    /// The whole output is one JSON value valid against this schema.
    JsonSchema(Value),
    /// A Lark grammar in llguidance's dialect (it may embed `%json {…}` schemas).
    Lark(String),
}

/// The separators our JSON is written with: what small models saw most in training, and one
/// fixed form, so the model cannot spend its budget on whitespace.
const JSON_OPTIONS: &str = r#"{"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}"#;

impl Grammar {
    pub(crate) fn cache_key(&self) -> String {
        match self {
            Self::JsonSchema(schema) => format!("json:{schema}"),
            Self::Lark(text) => format!("lark:{text}"),
        }
    }

    fn to_llguidance(&self) -> TopLevelGrammar {
        match self {
            Self::JsonSchema(schema) => TopLevelGrammar::from_json_schema(prepared_json_schema(schema)),
            Self::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
        }
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

/// Replaces `format: date` / `date-time` by an exact pattern wherever the schema has no
/// pattern of its own; values (`const`, `enum`, `default`, `examples`) are left alone.
fn exact_dates(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            let pattern = match map.get("format").and_then(Value::as_str) {
                Some("date") => Some(format!("^{DAY}$")),
                Some("date-time") => Some(format!("^{DAY}[tT]{TIME}$")),
                _ => None,
            };
            if let (Some(pattern), false) = (pattern, map.contains_key("pattern")) {
                map.remove("format");
                map.insert("pattern".into(), Value::String(pattern));
            }
            for (key, value) in map.iter_mut() {
                if !matches!(key.as_str(), "const" | "enum" | "default" | "examples") {
                    exact_dates(value);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(exact_dates),
        _ => {}
    }
}

/// The schema as we compile it: exact dates, and our JSON options in `x-guidance`. A Lark
/// grammar embeds its `%json` schemas in this form too.
pub fn prepared_json_schema(schema: &Value) -> Value {
    let mut schema = schema.clone();
    exact_dates(&mut schema);
    // A client's own `x-guidance` could switch on `lenient`, which ignores the keywords we
    // promise to refuse: ours always wins.
    if let Value::Object(map) = &mut schema {
        map.insert("x-guidance".into(), json_options());
    }
    schema
}

fn json_options() -> Value {
    serde_json::from_str(JSON_OPTIONS).unwrap_or_else(|_| json!({}))
}

/// A grammar compiled for one vocabulary, at its start state. Every generation clones it.
pub struct Compiled {
    // llguidance's matcher is Send but not Sync; cloning it is all we do under this lock.
    start: Mutex<Matcher>,
    end_tokens: Arc<[TokenId]>,
    env: TokEnv,
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiled").finish_non_exhaustive()
    }
}

impl Compiled {
    pub(crate) fn new(factory: &ParserFactory, grammar: &Grammar) -> Result<Self, CompileError> {
        if let Grammar::JsonSchema(schema) = grammar {
            check_patterns(schema)?;
        }
        let parser = factory.create_parser(grammar.to_llguidance());
        let mut matcher = Matcher::new(parser);
        if let Some(err) = matcher.get_error() {
            return Err(CompileError::new(err));
        }
        // The first mask builds the lexer's start states: a grammar too costly to start is
        // refused here, before the request is accepted, not at its first token.
        if let Err(err) = matcher.compute_mask() {
            return Err(CompileError::new(err.to_string()));
        }
        let end_tokens = factory.tok_env().tok_trie().eos_tokens().into();
        Ok(Self { start: Mutex::new(matcher), end_tokens, env: factory.tok_env().clone() })
    }

    pub(crate) fn start(&self) -> Matcher {
        self.start.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn end_tokens(&self) -> Arc<[TokenId]> {
        self.end_tokens.clone()
    }

    pub(crate) fn tok_env(&self) -> TokEnv {
        self.env.clone()
    }
}
