//! Wire encoding of frames and comments.

use std::ops::Range;

use crate::SseError;

/// Checks that `name` can be written on one `event:` line.
pub fn validate_event_name(name: &str) -> Result<(), SseError> {
    if name.is_empty() || memchr::memchr2(b'\r', b'\n', name.as_bytes()).is_some() {
        return Err(SseError::InvalidEventName(name.to_owned()));
    }
    Ok(())
}

/// Appends one SSE frame to `out`: `id: N`, `event: NAME`, one `data:` line per
/// line of `data` (split on CRLF, LF and CR), then the blank line that ends it.
///
/// On error nothing is written, so `out` never holds half a frame.
pub fn encode_event(
    out: &mut Vec<u8>,
    id: Option<u64>,
    event: Option<&str>,
    data: &str,
) -> Result<(), SseError> {
    encode_event_spans(out, id, event, data).map(drop)
}

/// Where [`encode_event_spans`] put the parts of a frame, as ranges of `out`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameSpans {
    /// The event name, when one was written.
    pub event: Option<Range<usize>>,
    /// The data, verbatim, when it has no line break (so one `data:` line
    /// holds it whole); `None` when it was split over several lines.
    pub data: Option<Range<usize>>,
}

/// [`encode_event`], also reporting where the name and data landed, so that a
/// caller keeping the frames can index into them instead of keeping copies.
pub fn encode_event_spans(
    out: &mut Vec<u8>,
    id: Option<u64>,
    event: Option<&str>,
    data: &str,
) -> Result<FrameSpans, SseError> {
    if let Some(name) = event {
        validate_event_name(name)?;
    }
    // Frames are mostly one JSON line; reserving for that case avoids regrowth.
    out.reserve(data.len() + event.map_or(0, str::len) + 40);
    if let Some(id) = id {
        out.extend_from_slice(b"id: ");
        out.extend_from_slice(itoa::Buffer::new().format(id).as_bytes());
        out.push(b'\n');
    }
    let event = event.map(|name| {
        out.extend_from_slice(b"event: ");
        let start = out.len();
        out.extend_from_slice(name.as_bytes());
        out.push(b'\n');
        start..start + name.len()
    });
    let mut lines = 0;
    for_each_line(data, |line| {
        lines += 1;
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
    });
    // One line means no line break, so the data sits whole before "\n\n".
    let data = (lines == 1).then(|| out.len() - 1 - data.len()..out.len() - 1);
    out.push(b'\n');
    Ok(FrameSpans { event, data })
}

/// Appends a comment frame (`: text`), typically a keep-alive. A multi-line
/// text becomes one comment line per line; the blank line after it is harmless
/// to parsers because no data is pending between frames.
pub fn encode_comment(out: &mut Vec<u8>, text: &str) {
    out.reserve(text.len() + 4);
    for_each_line(text, |line| {
        out.extend_from_slice(b": ");
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
    });
    out.push(b'\n');
}

/// Calls `f` for each line of `text`, splitting on CRLF, LF and CR. Always
/// yields at least one (possibly empty) line, and a trailing line end yields a
/// final empty line: both are needed for the data to round-trip exactly.
fn for_each_line(text: &str, mut f: impl FnMut(&str)) {
    let bytes = text.as_bytes();
    let mut start = 0;
    while let Some(offset) = memchr::memchr2(b'\r', b'\n', &bytes[start..]) {
        let end = start + offset;
        f(&text[start..end]);
        start = end + 1;
        if bytes[end] == b'\r' && bytes.get(start) == Some(&b'\n') {
            start += 1;
        }
    }
    f(&text[start..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(id: Option<u64>, event: Option<&str>, data: &str) -> String {
        let mut out = Vec::new();
        encode_event(&mut out, id, event, data).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn full_frame() {
        assert_eq!(
            frame(Some(7), Some("response.created"), r#"{"a":1}"#),
            "id: 7\nevent: response.created\ndata: {\"a\":1}\n\n"
        );
    }

    #[test]
    fn id_and_event_are_optional() {
        assert_eq!(frame(None, None, "x"), "data: x\n\n");
        assert_eq!(frame(Some(0), None, "x"), "id: 0\ndata: x\n\n");
        assert_eq!(frame(None, Some("e"), "x"), "event: e\ndata: x\n\n");
        assert_eq!(
            frame(Some(u64::MAX), None, ""),
            format!("id: {}\ndata: \n\n", u64::MAX)
        );
    }

    #[test]
    fn every_line_end_splits_data() {
        assert_eq!(
            frame(None, None, "a\nb\r\nc\rd"),
            "data: a\ndata: b\ndata: c\ndata: d\n\n"
        );
        assert_eq!(frame(None, None, "a\n"), "data: a\ndata: \n\n");
        assert_eq!(frame(None, None, "\r\r\n"), "data: \ndata: \ndata: \n\n");
    }

    #[test]
    fn bad_event_names_write_nothing() {
        for name in ["", "a\nb", "a\rb", "\n"] {
            let mut out = b"keep".to_vec();
            assert_eq!(
                encode_event(&mut out, Some(1), Some(name), "x"),
                Err(SseError::InvalidEventName(name.to_owned()))
            );
            assert_eq!(out, b"keep");
        }
    }

    #[test]
    fn appends_to_existing_bytes() {
        let mut out = b"data: first\n\n".to_vec();
        encode_event(&mut out, None, None, "second").unwrap();
        assert_eq!(out, b"data: first\n\ndata: second\n\n");
    }

    #[test]
    fn spans_locate_name_and_single_line_data() {
        let mut out = b"prefix".to_vec();
        let spans = encode_event_spans(&mut out, Some(42), Some("e.v"), "{\"a\":1}").unwrap();
        assert_eq!(&out[spans.event.unwrap()], b"e.v");
        assert_eq!(&out[spans.data.unwrap()], b"{\"a\":1}");
        let spans = encode_event_spans(&mut out, None, None, "").unwrap();
        assert_eq!(spans.event, None);
        assert_eq!(&out[spans.data.unwrap()], b"");
        let spans = encode_event_spans(&mut out, None, Some("x"), "a\nb").unwrap();
        assert_eq!(&out[spans.event.unwrap()], b"x");
        assert_eq!(spans.data, None);
    }

    #[test]
    fn comments() {
        let mut out = Vec::new();
        encode_comment(&mut out, "keep-alive");
        assert_eq!(out, b": keep-alive\n\n");
        out.clear();
        encode_comment(&mut out, "a\r\nb");
        assert_eq!(out, b": a\n: b\n\n");
        out.clear();
        encode_comment(&mut out, "");
        assert_eq!(out, b": \n\n");
    }
}
