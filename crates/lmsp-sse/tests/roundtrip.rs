//! Properties: what the encoder writes, the parser reads back, however the
//! bytes are split into chunks.

use lmsp_sse::{Event, Item, Parser, encode_comment, encode_event};
use proptest::prelude::*;

/// Text that favours the three line ends, which the encoder must split on.
fn text_with_line_ends() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        3 => any::<char>().prop_map(String::from),
        1 => Just("\n".to_owned()),
        1 => Just("\r".to_owned()),
        1 => Just("\r\n".to_owned()),
    ];
    prop_oneof![
        prop::collection::vec(piece, 0..40).prop_map(|pieces| pieces.concat()),
        any::<String>(),
    ]
}

fn event_name() -> impl Strategy<Value = String> {
    "[^\r\n]{1,20}"
}

fn normalize(data: &str) -> String {
    data.replace("\r\n", "\n").replace('\r', "\n")
}

#[derive(Debug, Clone)]
enum Frame {
    Event(Option<u64>, String, String),
    Comment(String),
}

fn frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        4 => (any::<Option<u64>>(), event_name(), text_with_line_ends())
            .prop_map(|(id, name, data)| Frame::Event(id, name, data)),
        1 => "[^\r\n]{0,10}".prop_map(Frame::Comment),
    ]
}

fn encode(frames: &[Frame]) -> Vec<u8> {
    let mut out = Vec::new();
    for frame in frames {
        match frame {
            Frame::Event(id, name, data) => encode_event(&mut out, *id, Some(name), data).unwrap(),
            Frame::Comment(text) => encode_comment(&mut out, text),
        }
    }
    out
}

fn feed_chunks(bytes: &[u8], cuts: &[usize]) -> Vec<Item> {
    let mut parser = Parser::new();
    let mut items = Vec::new();
    let mut start = 0;
    for &cut in cuts.iter().chain([&bytes.len()]) {
        items.extend(parser.feed(&bytes[start..cut]));
        start = cut;
    }
    items
}

proptest! {
    #[test]
    fn parse_of_encode_is_identity(
        id in any::<Option<u64>>(),
        name in event_name(),
        data in text_with_line_ends(),
    ) {
        let mut out = Vec::new();
        encode_event(&mut out, id, Some(&name), &data).unwrap();
        let expected = Event {
            id: id.map(|id| id.to_string()),
            event: name,
            data: normalize(&data),
            retry: None,
        };
        prop_assert_eq!(Parser::new().feed(&out), vec![Item::Event(expected)]);
    }

    #[test]
    fn every_two_way_split_parses_like_the_whole(
        frames in prop::collection::vec(frame(), 1..4),
    ) {
        let bytes = encode(&frames);
        let whole = Parser::new().feed(&bytes);
        prop_assert_eq!(whole.len(), frames.len());
        for cut in 0..=bytes.len() {
            prop_assert_eq!(&feed_chunks(&bytes, &[cut]), &whole, "cut at {}", cut);
        }
    }

    #[test]
    fn random_splits_parse_like_the_whole(
        frames in prop::collection::vec(frame(), 1..8),
        cut_seeds in prop::collection::vec(any::<prop::sample::Index>(), 0..30),
    ) {
        let bytes = encode(&frames);
        let mut cuts: Vec<usize> = cut_seeds.iter().map(|i| i.index(bytes.len() + 1)).collect();
        cuts.sort_unstable();
        prop_assert_eq!(feed_chunks(&bytes, &cuts), Parser::new().feed(&bytes));
    }

    #[test]
    fn byte_at_a_time_parses_like_the_whole(
        frames in prop::collection::vec(frame(), 1..4),
    ) {
        let bytes = encode(&frames);
        let cuts: Vec<usize> = (0..=bytes.len()).collect();
        prop_assert_eq!(feed_chunks(&bytes, &cuts), Parser::new().feed(&bytes));
    }

    #[test]
    fn arbitrary_bytes_split_anywhere_parse_the_same(
        bytes in prop::collection::vec(
            prop_oneof![Just(b'\r'), Just(b'\n'), Just(b':'), Just(b' '), any::<u8>(),
                        Just(b'd'), Just(b'a'), Just(b't')],
            0..64,
        ),
        cut in any::<prop::sample::Index>(),
    ) {
        let whole = Parser::new().feed(&bytes);
        let cut = cut.index(bytes.len() + 1);
        prop_assert_eq!(feed_chunks(&bytes, &[cut]), whole);
    }
}

proptest! {
    #[test]
    fn spans_point_at_name_and_unbroken_data(
        id in any::<Option<u64>>(),
        name in proptest::option::of(event_name()),
        data in text_with_line_ends(),
    ) {
        let mut out = b"earlier frames".to_vec();
        let spans = lmsp_sse::encode_event_spans(&mut out, id, name.as_deref(), &data).unwrap();
        prop_assert_eq!(spans.event.map(|r| out[r].to_vec()), name.map(String::into_bytes));
        let unbroken = !data.contains(['\r', '\n']);
        prop_assert_eq!(spans.data.is_some(), unbroken);
        if let Some(range) = spans.data {
            prop_assert_eq!(&out[range], data.as_bytes());
        }
    }
}
