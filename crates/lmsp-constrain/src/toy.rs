//! A small vocabulary for unit tests: one token per byte, a few multi-byte words, an end token.

use crate::{Token, TokenId, Vocabulary};

/// Token 0 ends generation; tokens 1..=256 are the single bytes 0..=255; then a few words.
pub(crate) const END: TokenId = 0;
pub(crate) const WORDS: &[&str] = &["{\"", "\": ", "true", "false", "yes", "\"name\"", ", "];

pub(crate) fn tokens() -> Vec<Token> {
    let mut tokens = vec![Token::Special("<|end|>".into())];
    tokens.extend((0..=255u8).map(|b| Token::Text(vec![b])));
    tokens.extend(WORDS.iter().map(|w| Token::Text(w.as_bytes().to_vec())));
    tokens
}

pub(crate) fn vocabulary() -> Vocabulary {
    Vocabulary::new(&tokens(), &[END]).expect("the toy vocabulary is valid")
}

/// The same vocabulary, able to fast-forward forced text.
pub(crate) fn forcing_vocabulary() -> Vocabulary {
    Vocabulary::with_forcing(&tokens(), &[END], true).expect("the toy vocabulary is valid")
}

/// The token of one byte.
pub(crate) fn byte(b: u8) -> TokenId {
    TokenId::from(b) + 1
}

/// The bytes of `ids` (the end token contributes nothing).
pub(crate) fn text(ids: &[TokenId]) -> Vec<u8> {
    let tokens = tokens();
    ids.iter()
        .filter_map(|&id| match &tokens[id as usize] {
            Token::Text(b) => Some(b.clone()),
            Token::Special(_) => None,
        })
        .flatten()
        .collect()
}
