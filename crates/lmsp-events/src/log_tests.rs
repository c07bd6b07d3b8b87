use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use lmsp_sse::{Item, Parser};

use super::*;

const NOW: Duration = Duration::from_secs(1);

const HEAD: &[u8] = br#"{"response_id":"resp_X","item_id":"msg_Y","delta":"#;

/// Appends where no reader waits, so there are no wakers to run.
fn add(log: &mut EventLog, event: &str, data: &[u8]) -> u64 {
    let (id, wakers) = log.append(event, data).unwrap();
    assert!(wakers.is_empty());
    id
}

fn add_text(log: &mut EventLog, text: &str) -> u64 {
    let (id, wakers) = log
        .append_text("response.output_text.delta", HEAD, text, b"}")
        .unwrap();
    assert!(wakers.is_empty());
    id
}

/// `read_after` on a log that keeps everything.
fn replay(log: &EventLog, after: u64) -> (u64, &[u8]) {
    log.read_after(after).unwrap()
}

fn sample() -> EventLog {
    let mut log = EventLog::new();
    add(&mut log, "response.created", br#"{"id":"resp_X"}"#);
    add_text(&mut log, "Hel");
    add_text(&mut log, "lo\n");
    add(&mut log, "response.completed", b"{\n  \"pretty\": true\n}");
    log
}

fn frame(id: u64, event: &str, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    lmsp_sse::encode_event(
        &mut out,
        Some(id),
        Some(event),
        str::from_utf8(data).unwrap(),
    )
    .unwrap();
    out
}

fn counter() -> (Arc<AtomicUsize>, impl Fn() -> Waker) {
    let count = Arc::new(AtomicUsize::new(0));
    let make = {
        let count = Arc::clone(&count);
        move || -> Waker {
            let count = Arc::clone(&count);
            Box::new(move || {
                count.fetch_add(1, Ordering::SeqCst);
            })
        }
    };
    (count, make)
}

#[test]
fn ids_start_at_one_and_increase_by_one() {
    let mut log = EventLog::new();
    assert_eq!(log.last_id(), 0);
    for expected in 1..=5 {
        assert_eq!(add(&mut log, "e", b"{}"), expected);
        assert_eq!(log.last_id(), expected);
    }
}

#[test]
fn frames_are_encoded_with_lmsp_sse() {
    let log = sample();
    let (last, frames) = replay(&log, 3);
    assert_eq!(last, 4);
    assert_eq!(
        frames,
        b"id: 4\nevent: response.completed\ndata: {\ndata:   \"pretty\": true\ndata: }\n\n"
    );
}

#[test]
fn frames_after_every_cut_is_the_concatenation_of_later_frames() {
    let log = sample();
    let frames: Vec<Vec<u8>> = log
        .entries_after(0)
        .unwrap()
        .map(|e| frame(e.id, e.event, e.data))
        .collect();
    for after in 0..=6 {
        let skip = (after as usize).min(frames.len());
        let (last, got) = replay(&log, after);
        assert_eq!(last, 4);
        assert_eq!(got, frames[skip..].concat(), "after {after}");
    }
}

#[test]
fn entries_round_trip_through_the_parser() {
    let log = sample();
    let parsed: Vec<(u64, String, Vec<u8>)> = Parser::new()
        .feed(replay(&log, 0).1)
        .into_iter()
        .map(|item| match item {
            Item::Event(e) => (e.id.unwrap().parse().unwrap(), e.event, e.data.into_bytes()),
            Item::Comment(c) => panic!("unexpected comment {c:?}"),
        })
        .collect();
    let entries: Vec<(u64, String, Vec<u8>)> = log
        .entries_after(0)
        .unwrap()
        .map(|e| (e.id, e.event.to_owned(), e.data.to_vec()))
        .collect();
    assert_eq!(parsed, entries);
    assert_eq!(entries.len(), 4);
}

#[test]
fn entries_after_and_entry() {
    let log = sample();
    let ids: Vec<u64> = log.entries_after(2).unwrap().map(|e| e.id).collect();
    assert_eq!(ids, [3, 4]);
    assert_eq!(log.entries_after(4).unwrap().count(), 0);
    assert_eq!(log.entries_after(u64::MAX).unwrap().count(), 0);
    let second = log.entry(2).unwrap();
    assert_eq!(second.event, "response.output_text.delta");
    assert_eq!(
        second.data,
        br#"{"response_id":"resp_X","item_id":"msg_Y","delta":"Hel"}"#
    );
    assert_eq!(log.entry(0), None);
    assert_eq!(log.entry(5), None);
}

#[test]
fn append_after_close_errors() {
    let mut log = sample();
    assert!(!log.is_closed());
    assert!(log.close(NOW).is_empty());
    assert!(log.is_closed());
    assert!(matches!(log.append("e", b"{}"), Err(LogError::Closed)));
    assert!(matches!(
        log.append_text("e", b"", "x", b""),
        Err(LogError::Closed)
    ));
    assert!(log.close(NOW).is_empty(), "closing twice is harmless");
    assert_eq!(log.last_id(), 4);
}

#[test]
fn failed_appends_leave_no_trace() {
    let mut log = sample();
    let before = replay(&log, 0).1.to_vec();
    assert!(matches!(
        log.append("e", b"\xFF"),
        Err(LogError::InvalidUtf8(_))
    ));
    assert!(matches!(
        log.append_text("e", b"\xC3", "x", b""),
        Err(LogError::InvalidUtf8(_))
    ));
    assert!(matches!(
        log.append("bad\nname", b"{}"),
        Err(LogError::Sse(_))
    ));
    assert!(matches!(
        log.append_text("", b"", "x", b""),
        Err(LogError::Sse(_))
    ));
    assert_eq!(replay(&log, 0).1, before.as_slice());
    assert_eq!(add(&mut log, "ok", b"1"), 5);
    assert_eq!(log.entry(5).unwrap().data, b"1");
}

#[test]
fn wakers_fire_once_on_next_append() {
    let (count, waker) = counter();
    let mut log = EventLog::new();
    assert!(log.wait_after(0, waker()).is_ok());
    assert!(log.wait_after(0, waker()).is_ok());
    assert_eq!(log.waiting(), 2);
    let (_, wakers) = log.append("e", b"{}").unwrap();
    assert_eq!(count.load(Ordering::SeqCst), 0, "not called under the log");
    assert_eq!(wakers.len(), 2);
    wakers.wake_all();
    assert_eq!(count.load(Ordering::SeqCst), 2);
    let (_, wakers) = log.append("e", b"{}").unwrap();
    assert!(wakers.is_empty(), "wakers are drained, not kept");
}

#[test]
fn wakers_fire_on_close() {
    let (count, waker) = counter();
    let mut log = EventLog::new();
    assert!(log.wait_after(0, waker()).is_ok());
    log.close(NOW).wake_all();
    assert_eq!(count.load(Ordering::SeqCst), 1);
    assert!(log.close(NOW).is_empty());
}

#[test]
fn wakers_are_not_registered_when_data_is_there() {
    let (count, waker) = counter();
    let mut log = EventLog::new();
    add(&mut log, "e", b"{}");
    assert!(log.wait_after(0, waker()).is_err());
    assert!(log.wait_after(1, waker()).is_ok(), "nothing after 1 yet");
    assert!(
        log.wait_after(7, waker()).is_ok(),
        "waiting past the end is allowed"
    );
    assert_eq!(log.waiting(), 2);
    log.close(NOW).wake_all();
    assert!(log.wait_after(1, waker()).is_err(), "closed: read now");
    assert_eq!(count.load(Ordering::SeqCst), 2);
}

#[test]
fn rejected_waker_comes_back_untouched() {
    let (count, waker) = counter();
    let mut log = EventLog::new();
    log.close(NOW).wake_all();
    let Err(back) = log.wait_after(0, waker()) else {
        panic!("registered on a closed log")
    };
    assert_eq!(count.load(Ordering::SeqCst), 0);
    back();
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

#[test]
fn append_text_escapes_into_valid_json() {
    let texts = [
        "plain",
        "say \"hi\"",
        "back\\slash",
        "line\nbreak\r\n",
        "tab\tand\u{0}nul\u{1f}\u{7f}",
        "unicode é 漢字 🎉 \u{2028}\u{2029}",
        "",
    ];
    let mut log = EventLog::new();
    for text in texts {
        let id = add_text(&mut log, text);
        let entry = log.entry(id).unwrap();
        let value: serde_json::Value = serde_json::from_slice(entry.data).unwrap();
        assert_eq!(value["delta"], text);
        assert_eq!(value["item_id"], "msg_Y");
        // JSON strings never hold raw line breaks, so the frame is one data line.
        assert_eq!(replay(&log, id - 1).1.split(|&b| b == b'\n').count(), 5);
    }
}

#[test]
fn numbered_events_carry_their_own_id() {
    let mut log = EventLog::new();
    add(&mut log, "first", b"{}");
    let (id, _) = log
        .append_numbered("d", br#"{"delta":"#, Some("a\"b"), br#","n":"#)
        .unwrap();
    let (other, _) = log
        .append_numbered("e", br#"{"type":"e""#, None, br#","n":"#)
        .unwrap();
    assert_eq!((id, other), (2, 3));
    let value: serde_json::Value = serde_json::from_slice(log.entry(2).unwrap().data).unwrap();
    assert_eq!(value, serde_json::json!({"delta": "a\"b", "n": 2}));
    assert_eq!(log.entry(3).unwrap().data, br#"{"type":"e","n":3}"#);
    assert!(log.close(NOW).is_empty());
    assert!(matches!(
        log.append_numbered("e", b"{", None, b""),
        Err(LogError::Closed)
    ));
}

#[test]
fn shared_log_wakes_readers_from_another_thread() {
    let log = Arc::new(crate::SharedLog::new());
    let (tx, rx) = std::sync::mpsc::channel();
    assert!(
        log.wait_after(0, Box::new(move || tx.send(()).unwrap()))
            .is_ok()
    );
    let producer = {
        let log = Arc::clone(&log);
        std::thread::spawn(move || {
            log.append_text("d", HEAD, "tok", b"}").unwrap();
            log.close(NOW);
        })
    };
    rx.recv().unwrap();
    producer.join().unwrap();
    assert!(log.read(EventLog::is_closed));
    assert_eq!(log.read(EventLog::last_id), 1);
    assert!(matches!(log.append("e", b"{}"), Err(LogError::Closed)));
}
