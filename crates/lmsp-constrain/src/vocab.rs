//! The model's vocabulary as llguidance sees it: a token trie, a parser factory with our
//! limits, and the cache of compiled grammars.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use llguidance::ParserFactory;
use llguidance::api::ParserLimits;
use toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::compile::{Compiled, Grammar};
use crate::error::CompileError;

/// One vocabulary entry, as the model's tokenizer gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Token {
    /// The bytes the token stands for in generated text (may be part of a UTF-8 character).
    Text(Vec<u8>),
    /// A control token such as `<|im_end|>`: a grammar may name it, but text never matches it.
    Special(String),
}

/// A vocabulary that cannot be used for constrained sampling.
#[derive(Debug, thiserror::Error)]
pub enum VocabularyError {
    /// The model has no tokens.
    #[error("the vocabulary is empty")]
    Empty,
    /// An end-of-generation token id is outside the vocabulary.
    #[error("end-of-generation token {0} is outside the vocabulary")]
    BadEndToken(TokenId),
    /// llguidance refused the trie.
    #[error("the grammar engine refused the vocabulary: {0}")]
    Engine(String),
}

/// Compiled grammars kept per vocabulary: a service sees the same few schemas over and over,
/// and a compile costs milliseconds where a step costs microseconds.
const CACHE_ENTRIES: usize = 64;

/// Tighter than llguidance's defaults, which are sized for a server with one grammar at a
/// time: here every step's mask comes out of one scheduler thread shared by all sequences,
/// and the cache holds many grammars at once.
fn limits() -> ParserLimits {
    ParserLimits {
        // ~20 ms of lexer construction at llguidance's measured 50k/ms.
        initial_lexer_fuel: 1_000_000,
        // ~4 ms per token mask at worst (14k/ms): a slow grammar slows only its own output.
        step_lexer_fuel: 50_000,
        step_max_items: 20_000,
        // ~1–2 kB each: at most ~100 MB per grammar in the worst case.
        max_lexer_states: 50_000,
        max_grammar_size: 200_000,
        // The client gets the cause, not the parser's internal state.
        verbose_errors: false,
        ..ParserLimits::default()
    }
}

/// A model's vocabulary, ready to compile grammars. Shared by every sequence of the model.
pub struct Vocabulary {
    factory: ParserFactory,
    n_vocab: usize,
    cache: Mutex<Cache>,
}

#[derive(Default)]
struct Cache {
    tick: u64,
    entries: HashMap<String, (u64, Arc<Compiled>)>,
}

impl Vocabulary {
    /// Builds the token trie from every token of the model, in id order. `end` lists the
    /// end-of-generation tokens: sampling one ends the output, and the grammar allows them
    /// only where its text may end.
    pub fn new(tokens: &[Token], end: &[TokenId]) -> Result<Self, VocabularyError> {
        Self::with_forcing(tokens, end, false)
    }

    /// As [`Self::new`]; with `forcing`, text a grammar forces can be fast-forwarded
    /// ([`crate::Constraint::fast_forward`]): llguidance then tokenizes it by the trie (longest
    /// match first) and treats that as the canonical tokenization, which it need not be for a
    /// BPE model: forced text may come out in other tokens than the model would have chosen.
    /// Without it, no text is ever forced in tokens the model did not choose itself.
    pub fn with_forcing(tokens: &[Token], end: &[TokenId], forcing: bool) -> Result<Self, VocabularyError> {
        let n_vocab = tokens.len();
        let first_end = *end.first().ok_or(VocabularyError::Empty)?;
        if n_vocab == 0 {
            return Err(VocabularyError::Empty);
        }
        if let Some(&bad) = end.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(VocabularyError::BadEndToken(bad));
        }
        let words: Vec<Vec<u8>> = tokens
            .iter()
            .map(|t| match t {
                Token::Text(bytes) => bytes.clone(),
                Token::Special(name) => {
                    let mut w = Vec::with_capacity(name.len() + 1);
                    w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                    w.extend_from_slice(name.as_bytes());
                    w
                }
            })
            .collect();
        let vocab_size = u32::try_from(n_vocab).map_err(|_| VocabularyError::Empty)?;
        let info = TokRxInfo::new(vocab_size, first_end);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(end);
        // Greedy tokenization by the trie is only used for text a grammar forces; the model's
        // own tokenizer sits in Python and must not be called from the scheduler's hot path.
        let env: TokEnv = if forcing { Arc::new(ForcingTokEnv(trie)) } else { Arc::new(ApproximateTokEnv::new(trie)) };
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| VocabularyError::Engine(e.to_string()))?;
        factory.quiet();
        *factory.limits_mut() = limits();
        Ok(Self { factory, n_vocab, cache: Mutex::new(Cache::default()) })
    }

    /// Number of tokens: the length of every logits row this vocabulary samples from.
    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// The compiled start state of `grammar`, from the cache or compiled now (milliseconds:
    /// call it off any event loop). Errors name what the engine could not enforce.
    pub fn compile(&self, grammar: &Grammar) -> Result<Arc<Compiled>, CompileError> {
        let key = grammar.cache_key();
        if let Some(found) = self.cached(&key) {
            return Ok(found);
        }
        let compiled = Arc::new(Compiled::new(&self.factory, grammar)?);
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.tick += 1;
        let tick = cache.tick;
        if cache.entries.len() >= CACHE_ENTRIES && !cache.entries.contains_key(&key) {
            let oldest = cache.entries.iter().min_by_key(|(_, (t, _))| *t).map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                cache.entries.remove(&oldest);
            }
        }
        cache.entries.insert(key, (tick, compiled.clone()));
        Ok(compiled)
    }

    /// How many compiled grammars are cached now (bounded by a fixed capacity).
    pub fn cached_grammars(&self) -> usize {
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).entries.len()
    }

    fn cached(&self, key: &str) -> Option<Arc<Compiled>> {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.tick += 1;
        let tick = cache.tick;
        let entry = cache.entries.get_mut(key)?;
        entry.0 = tick;
        Some(entry.1.clone())
    }
}

/// The trie's greedy tokenization, declared canonical: what llguidance requires before it
/// computes forced tokens (`compute_ff_tokens` returns none for a non-canonical tokenizer).
struct ForcingTokEnv(TokTrie);

impl TokenizerEnv for ForcingTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.0
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.0.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        true
    }
}

#[cfg(test)]
#[path = "vocab_tests.rs"]
mod tests;
