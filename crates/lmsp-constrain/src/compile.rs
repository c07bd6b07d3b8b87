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

/// The schema as we compile it: with our JSON options in `x-guidance`. A Lark grammar embeds
/// its `%json` schemas in this form too. Narrowing (`narrow`) is the caller's, on the schema as
/// the client gave it: by the time a schema is compiled, keywords left to the check of the
/// finished value may be gone, and what they ask for would be invisible to it.
pub fn prepared_json_schema(schema: &Value) -> Value {
    let mut schema = schema.clone();
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

    /// A reader of texts under this grammar, from its start.
    pub fn probe(&self) -> Probe {
        Probe { matcher: self.start(), env: self.env.clone() }
    }
}

/// Whether a text is (a prefix of) a sentence of a grammar, read byte by byte as the model
/// would write it: for conformance runs and tests, where no model samples. Cloning forks it.
#[derive(Clone)]
pub struct Probe {
    matcher: Matcher,
    env: TokEnv,
}

impl Probe {
    /// Reads `text` (tokenized by the vocabulary's greedy longest match); false, and the probe
    /// is spent, when the grammar refuses a token of it.
    pub fn feed(&mut self, text: &[u8]) -> bool {
        let tokens = self.env.tokenize_bytes(text);
        matches!(self.matcher.try_consume_tokens(&tokens), Ok(n) if n == tokens.len()) && !self.matcher.is_error()
    }

    /// Whether what was read so far is a whole sentence.
    pub fn accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }
}
