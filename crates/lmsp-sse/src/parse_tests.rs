use super::*;

fn parse(input: &[u8]) -> Vec<Item> {
    Parser::new().feed(input)
}

fn ev(id: Option<&str>, event: &str, data: &str, retry: Option<u64>) -> Item {
    Item::Event(Event {
        id: id.map(str::to_owned),
        event: event.to_owned(),
        data: data.to_owned(),
        retry,
    })
}

fn msg(data: &str) -> Item {
    ev(None, "message", data, None)
}

#[test]
fn simple_event() {
    assert_eq!(
        parse(b"id: 3\nevent: e\ndata: hi\n\n"),
        [ev(Some("3"), "e", "hi", None)]
    );
}

#[test]
fn event_type_defaults_to_message() {
    assert_eq!(parse(b"data: x\n\n"), [msg("x")]);
}

#[test]
fn data_lines_join_with_lf_and_one_trailing_lf_is_stripped() {
    assert_eq!(parse(b"data: a\ndata: b\n\n"), [msg("a\nb")]);
    assert_eq!(parse(b"data: a\ndata:\n\n"), [msg("a\n")]);
    assert_eq!(parse(b"data\n\n"), [msg("")]);
}

#[test]
fn all_three_line_ends() {
    assert_eq!(
        parse(b"data: a\r\ndata: b\rdata: c\n\r\n"),
        [msg("a\nb\nc")]
    );
    assert_eq!(parse(b"data: a\r\r"), [msg("a")]);
}

#[test]
fn cr_and_lf_split_across_chunks_end_one_line() {
    let mut p = Parser::new();
    assert_eq!(p.feed(b"data: a\r"), []);
    // If the LF counted as a line end of its own, this blank line would dispatch.
    assert_eq!(p.feed(b"\ndata: b\r"), []);
    assert_eq!(p.feed(b"\n"), []);
    assert_eq!(p.feed(b"\r"), [msg("a\nb")]);
    assert_eq!(p.feed(b"\n"), []);
}

#[test]
fn empty_chunk_keeps_a_pending_cr() {
    let mut p = Parser::new();
    assert_eq!(p.feed(b"data: a\r"), []);
    assert_eq!(p.feed(b""), []);
    assert_eq!(p.feed(b"\n"), []);
    assert_eq!(p.feed(b"\n"), [msg("a")]);
}

#[test]
fn cr_then_other_byte_in_next_chunk() {
    let mut p = Parser::new();
    assert_eq!(p.feed(b"data: a\r"), []);
    assert_eq!(p.feed(b"\r"), [msg("a")]);
}

#[test]
fn partial_lines_wait_for_their_end() {
    let mut p = Parser::new();
    assert_eq!(p.feed(b"da"), []);
    assert_eq!(p.feed(b"ta: hel"), []);
    assert_eq!(p.feed(b"lo\n"), []);
    assert_eq!(p.feed(b"\n"), [msg("hello")]);
}

#[test]
fn leading_bom_is_stripped_once() {
    assert_eq!(parse(b"\xEF\xBB\xBFdata: x\n\n"), [msg("x")]);
    // A second BOM makes the field name "\u{FEFF}data", which is unknown.
    assert_eq!(parse(b"\xEF\xBB\xBF\xEF\xBB\xBFdata: x\n\n"), []);
    // Only at the start of the stream.
    assert_eq!(parse(b"data: x\n\xEF\xBB\xBFdata: y\n\n"), [msg("x")]);
}

#[test]
fn bom_split_across_chunks() {
    let mut p = Parser::new();
    assert_eq!(p.feed(b"\xEF"), []);
    assert_eq!(p.feed(b"\xBB"), []);
    assert_eq!(p.feed(b"\xBFdata: x\n\n"), [msg("x")]);
}

#[test]
fn invalid_utf8_is_replaced() {
    assert_eq!(parse(b"data: a\xFFb\n\n"), [msg("a\u{FFFD}b")]);
    // A truncated sequence before a line end is one replacement character.
    assert_eq!(parse(b"data: \xE2\x82\ndata: z\n\n"), [msg("\u{FFFD}\nz")]);
}

#[test]
fn utf8_sequence_split_across_chunks() {
    let euro = "€".as_bytes();
    let mut p = Parser::new();
    assert_eq!(p.feed(&[b"data: ".as_slice(), &euro[..1]].concat()), []);
    assert_eq!(p.feed(&euro[1..2]), []);
    assert_eq!(
        p.feed(&[&euro[2..], b"\n\n".as_slice()].concat()),
        [msg("€")]
    );
}

#[test]
fn comments_are_reported_and_do_not_dispatch() {
    assert_eq!(
        parse(b": keep-alive\n:x\n:\ndata: a\n: mid\n\n"),
        [
            Item::Comment("keep-alive".into()),
            Item::Comment("x".into()),
            Item::Comment(String::new()),
            Item::Comment("mid".into()),
            msg("a"),
        ]
    );
}

#[test]
fn value_splits_at_first_colon_and_drops_one_space() {
    assert_eq!(parse(b"data:a:b\n\n"), [msg("a:b")]);
    assert_eq!(parse(b"data:  two\n\n"), [msg(" two")]);
    assert_eq!(parse(b"data: : x\n\n"), [msg(": x")]);
}

#[test]
fn line_without_colon_is_field_with_empty_value() {
    assert_eq!(parse(b"data\ndata\n\n"), [msg("\n")]);
    assert_eq!(parse(b"event\ndata: x\n\n"), [msg("x")]);
    assert_eq!(
        parse(b"id\ndata: x\n\n"),
        [ev(Some(""), "message", "x", None)]
    );
}

#[test]
fn last_event_id_persists_across_events() {
    assert_eq!(
        parse(b"id: 1\ndata: a\n\ndata: b\n\nid: 2\ndata: c\n\nid\ndata: d\n\n"),
        [
            ev(Some("1"), "message", "a", None),
            ev(Some("1"), "message", "b", None),
            ev(Some("2"), "message", "c", None),
            ev(Some(""), "message", "d", None),
        ]
    );
}

#[test]
fn id_set_by_a_frame_without_data_still_persists() {
    assert_eq!(
        parse(b"id: 9\n\ndata: a\n\n"),
        [ev(Some("9"), "message", "a", None)]
    );
}

#[test]
fn id_with_nul_is_ignored() {
    assert_eq!(
        parse(b"id: 1\ndata: a\n\nid: 2\0x\ndata: b\n\n"),
        [
            ev(Some("1"), "message", "a", None),
            ev(Some("1"), "message", "b", None),
        ]
    );
}

#[test]
fn retry_needs_ascii_digits_only() {
    let mut p = Parser::new();
    let items =
        p.feed(b"retry: 1500\ndata: a\n\nretry: 12a\nretry: -1\nretry:\nretry: 1 \ndata: b\n\n");
    assert_eq!(
        items,
        [
            ev(None, "message", "a", Some(1500)),
            ev(None, "message", "b", Some(1500)),
        ]
    );
    assert_eq!(p.retry(), Some(1500));
    assert_eq!(
        parse(b"retry: 99999999999999999999999\ndata: a\n\n"),
        [ev(None, "message", "a", Some(u64::MAX))]
    );
    // Non-ASCII digits (here Arabic-Indic) do not count.
    assert_eq!(parse("retry: ٣\ndata: a\n\n".as_bytes()), [msg("a")]);
}

#[test]
fn unknown_fields_are_ignored() {
    assert_eq!(parse(b"foo: bar\nDATA: x\ndata: y\n\n"), [msg("y")]);
}

#[test]
fn blank_line_without_data_resets_event_type() {
    assert_eq!(parse(b"event: e\n\ndata: x\n\n"), [msg("x")]);
    assert_eq!(parse(b"\n\n\n"), []);
}

#[test]
fn event_type_resets_after_dispatch() {
    assert_eq!(
        parse(b"event: e\ndata: x\n\ndata: y\n\n"),
        [ev(None, "e", "x", None), msg("y")]
    );
}

#[test]
fn incomplete_event_at_end_is_not_dispatched() {
    let mut p = Parser::new();
    assert_eq!(p.feed(b"data: x\n"), []);
    assert_eq!(p.feed(b"data: y"), []);
}

#[test]
fn accessors_track_state() {
    let mut p = Parser::new();
    assert_eq!(p.last_event_id(), None);
    p.feed(b"id: 4\nretry: 10\n");
    assert_eq!(p.last_event_id(), Some("4"));
    assert_eq!(p.retry(), Some(10));
}
