//! Incremental parsing per the WHATWG HTML "event stream interpretation".

use std::mem;

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Event {
    /// The last event id at dispatch time; `None` if the stream never set one.
    /// As the spec says, it persists across events until an `id` field changes it.
    pub id: Option<String>,
    /// The event type; `"message"` when the frame had no `event` field.
    pub event: String,
    /// The data lines joined with LF.
    pub data: String,
    /// The reconnection time in milliseconds, if the stream ever set one.
    pub retry: Option<u64>,
}

/// What [`Parser::feed`] yields.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Item {
    /// A complete event, dispatched by a blank line.
    Event(Event),
    /// A comment line's text after the `:` (one leading space dropped, as for
    /// field values). Browsers ignore these; callers may want keep-alives.
    Comment(String),
}

/// An incremental SSE parser: feed it chunks as they arrive, split anywhere.
#[derive(Debug, Clone, Default)]
pub struct Parser {
    /// Bytes of a line whose end has not arrived yet.
    partial: Vec<u8>,
    /// Whether a line has completed, i.e. the stream start (and its BOM) is behind.
    started: bool,
    /// The previous chunk ended in CR, so an LF opening the next chunk belongs
    /// to that CRLF and must not end a second, empty line.
    pending_cr: bool,
    data: String,
    event_type: String,
    last_event_id: Option<String>,
    retry: Option<u64>,
}

impl Parser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses `chunk` and returns the events and comments it completed.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<Item> {
        let mut items = Vec::new();
        self.feed_into(chunk, &mut items);
        items
    }

    /// Like [`Parser::feed`], but appends to `items` so that a caller can reuse
    /// one vector across chunks.
    pub fn feed_into(&mut self, chunk: &[u8], items: &mut Vec<Item>) {
        let mut rest = chunk;
        if self.pending_cr && !rest.is_empty() {
            self.pending_cr = false;
            if rest[0] == b'\n' {
                rest = &rest[1..];
            }
        }
        while let Some(pos) = memchr::memchr2(b'\r', b'\n', rest) {
            let line = &rest[..pos];
            let mut after = &rest[pos + 1..];
            if rest[pos] == b'\r' {
                match after.first() {
                    Some(b'\n') => after = &after[1..],
                    None => self.pending_cr = true,
                    Some(_) => {}
                }
            }
            if self.partial.is_empty() {
                self.process_line(line, items);
            } else {
                // Taken out and put back so the buffer's capacity is reused.
                let mut buf = mem::take(&mut self.partial);
                buf.extend_from_slice(line);
                self.process_line(&buf, items);
                buf.clear();
                self.partial = buf;
            }
            rest = after;
        }
        self.partial.extend_from_slice(rest);
    }

    /// The last event id buffer, as the next event would report it.
    pub fn last_event_id(&self) -> Option<&str> {
        self.last_event_id.as_deref()
    }

    /// The reconnection time in milliseconds, if the stream set one.
    pub fn retry(&self) -> Option<u64> {
        self.retry
    }

    fn process_line(&mut self, raw: &[u8], items: &mut Vec<Item>) {
        let mut raw = raw;
        if !self.started {
            self.started = true;
            raw = raw.strip_prefix(BOM).unwrap_or(raw);
        }
        // Decoding line by line equals decoding the stream: CR and LF are ASCII,
        // never part of a multi-byte sequence, and a sequence cut by a line end
        // is invalid either way (one U+FFFD per maximal subpart, in both cases).
        let line = String::from_utf8_lossy(raw);
        if line.is_empty() {
            self.dispatch(items);
            return;
        }
        if let Some(comment) = line.strip_prefix(':') {
            items.push(Item::Comment(strip_one_space(comment).to_owned()));
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, strip_one_space(value)),
            None => (&*line, ""),
        };
        match field {
            "event" => {
                self.event_type.clear();
                self.event_type.push_str(value);
            }
            "data" => {
                self.data.push_str(value);
                self.data.push('\n');
            }
            "id" if !value.contains('\0') => match &mut self.last_event_id {
                Some(id) => {
                    id.clear();
                    id.push_str(value);
                }
                None => self.last_event_id = Some(value.to_owned()),
            },
            // An empty value is not a number, so it is ignored like "12a".
            "retry" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                // All digits, so the only possible failure is overflow.
                self.retry = Some(value.parse().unwrap_or(u64::MAX));
            }
            _ => {}
        }
    }

    fn dispatch(&mut self, items: &mut Vec<Item>) {
        if self.data.is_empty() {
            self.event_type.clear();
            return;
        }
        if self.data.ends_with('\n') {
            self.data.pop();
        }
        let event = if self.event_type.is_empty() {
            "message".to_owned()
        } else {
            mem::take(&mut self.event_type)
        };
        items.push(Item::Event(Event {
            id: self.last_event_id.clone(),
            event,
            data: mem::take(&mut self.data),
            retry: self.retry,
        }));
    }
}

fn strip_one_space(value: &str) -> &str {
    value.strip_prefix(' ').unwrap_or(value)
}

#[cfg(test)]
#[path = "parse_tests.rs"]
mod tests;
