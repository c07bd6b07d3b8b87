//! The ring's bounds, expiry and memory reuse. (covers: R6.4-1, R6.4-3)

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use lmsp_sse::{Item, Parser};

use super::*;

const DELTA: &str = "response.output_text.delta";
const HEAD: &[u8] = br#"{"response_id":"resp_X","item_id":"msg_Y","delta":"#;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn ring(max_events: usize, max_bytes: usize) -> EventLog {
    EventLog::with_limits(Limits {
        max_events,
        max_bytes,
        retention: secs(5),
    })
    .unwrap()
}

fn add(log: &mut EventLog, text: &str) -> u64 {
    let (id, wakers) = log.append_text(DELTA, HEAD, text, b"}").unwrap();
    assert!(wakers.is_empty());
    id
}

fn ids(log: &EventLog, after: u64) -> Vec<u64> {
    log.entries_after(after).unwrap().map(|e| e.id).collect()
}

fn expired(result: Result<(u64, &[u8]), LogError>) -> (u64, u64) {
    match result {
        Err(LogError::HistoryExpired { after, first_id }) => (after, first_id),
        other => panic!("expected HistoryExpired, got {other:?}"),
    }
}

/// The frames, parsed back, must be exactly the kept entries.
fn assert_frames_match_entries(log: &EventLog) {
    let (_, frames) = log.read_after(log.first_id() - 1).unwrap();
    let parsed: Vec<(u64, String, String)> = Parser::new()
        .feed(frames)
        .into_iter()
        .map(|item| match item {
            Item::Event(e) => (e.id.unwrap().parse().unwrap(), e.event, e.data),
            Item::Comment(c) => panic!("unexpected comment {c:?}"),
        })
        .collect();
    let kept: Vec<(u64, String, String)> = log
        .entries_after(log.first_id() - 1)
        .unwrap()
        .map(|e| {
            let data = str::from_utf8(e.data).unwrap();
            // A frame normalizes line breaks to LF; the entry keeps them verbatim.
            (
                e.id,
                e.event.to_owned(),
                data.replace("\r\n", "\n").replace('\r', "\n"),
            )
        })
        .collect();
    assert_eq!(parsed, kept);
}

#[test]
fn zero_limits_are_refused() {
    let limits = Limits {
        max_events: 0,
        ..Limits::default()
    };
    assert!(matches!(
        EventLog::with_limits(limits),
        Err(LogError::InvalidLimit(_))
    ));
    let limits = Limits {
        max_bytes: 0,
        ..Limits::default()
    };
    assert!(matches!(
        EventLog::with_limits(limits),
        Err(LogError::InvalidLimit(_))
    ));
    assert_eq!(*EventLog::new().limits(), Limits::default());
    assert_eq!(Limits::default().max_events, 65_536);
}

#[test]
fn count_bound_drops_the_oldest() {
    let mut log = ring(3, usize::MAX);
    assert_eq!((log.first_id(), log.last_id()), (1, 0));
    for text in ["a", "b", "c", "d", "e"] {
        add(&mut log, text);
    }
    assert_eq!((log.first_id(), log.last_id(), log.retained()), (3, 5, 3));
    assert_eq!(ids(&log, 2), [3, 4, 5]);
    assert_eq!(ids(&log, 4), [5]);
    assert_eq!(expired(log.read_after(1)), (1, 3));
    assert_eq!(expired(log.read_after(0)), (0, 3));
    assert!(matches!(
        log.entries_after(1).map(|e| e.count()),
        Err(LogError::HistoryExpired {
            after: 1,
            first_id: 3
        })
    ));
    let (last, frames) = log.read_after(2).unwrap();
    assert_eq!(last, 5);
    assert!(frames.starts_with(b"id: 3\n"));
    assert_eq!(log.read_after(5).unwrap(), (5, &[][..]));
    assert_eq!(log.read_after(9).unwrap(), (5, &[][..]));
    assert_eq!(log.entry(2), None);
    assert_eq!(log.entry(3).unwrap().id, 3);
    assert_frames_match_entries(&log);
}

#[test]
fn byte_bound_drops_the_oldest_but_keeps_the_newest() {
    let mut probe = ring(1, 1);
    add(&mut probe, "x");
    let frame = probe.retained_bytes();
    let mut log = ring(100, frame * 5 / 2);
    for _ in 0..4 {
        add(&mut log, "x");
    }
    assert_eq!((log.first_id(), log.retained_bytes()), (3, 2 * frame));
    let big = "y".repeat(frame * 10);
    let id = add(&mut log, &big);
    assert_eq!(
        (log.first_id(), log.retained()),
        (id, 1),
        "alone over the bound"
    );
    assert!(log.retained_bytes() > log.limits().max_bytes);
    assert_frames_match_entries(&log);
    add(&mut log, "x");
    assert_eq!(
        log.first_id(),
        id + 1,
        "the big one goes with the next event"
    );
}

#[test]
fn ids_and_frames_stay_right_through_many_wraps() {
    let mut log = ring(7, 600);
    for round in 1..=5_000u64 {
        let text = "w".repeat((round % 13) as usize);
        if round % 5 == 0 {
            // Data with line breaks is kept aside; it must wrap with the rest.
            let data = format!("{{\r\n\"n\": {round}\n}}");
            let (id, _) = log.append("multi", data.as_bytes()).unwrap();
            assert_eq!(log.entry(id).unwrap().data, data.as_bytes());
        } else {
            assert_eq!(add(&mut log, &text), round);
        }
        assert!(log.retained() <= 7);
        assert!(log.retained() == 1 || log.retained_bytes() <= 600);
        if round % 97 == 0 {
            assert_frames_match_entries(&log);
        }
    }
    assert_eq!(log.last_id(), 5_000);
}

#[test]
fn steady_state_appends_reuse_memory() {
    for (max_events, max_bytes) in [(64, usize::MAX), (usize::MAX, 8_192)] {
        let mut log = ring(max_events, max_bytes);
        let spilled = b"{\n}";
        let append = |log: &mut EventLog, i: u64| {
            add(log, "token");
            if i % 10 == 0 {
                let _ = log.append("m", spilled).unwrap();
            }
        };
        // Ids reach six digits first: longer ids make longer frames, which
        // may rightly take more memory.
        for i in 0..100_000 {
            append(&mut log, i);
        }
        let caps = |log: &EventLog| {
            (
                log.frames.capacity(),
                log.spill.capacity(),
                log.slots.capacity(),
            )
        };
        let warm = caps(&log);
        for i in 0..200_000 {
            append(&mut log, i);
        }
        assert_eq!(caps(&log), warm, "no growth at ({max_events}, {max_bytes})");
        let frame = log.retained_bytes() / log.retained();
        let live = log.retained_bytes();
        assert!(warm.0 <= 2 * (live + 4 * frame), "{warm:?} for {live} live");
    }
}

#[test]
fn history_expires_a_retention_after_the_close() {
    let mut log = ring(100, usize::MAX);
    for text in ["a", "b", "c"] {
        add(&mut log, text);
    }
    assert_eq!(log.expires_at(), None);
    assert!(
        !log.expire_if_due(secs(1_000)),
        "an open log never expires by time"
    );
    assert!(log.close(secs(10)).is_empty());
    assert!(log.close(secs(20)).is_empty());
    assert_eq!(log.expires_at(), Some(secs(15)), "the first close stands");
    assert!(!log.expire_if_due(secs(14)));
    assert_eq!(ids(&log, 0), [1, 2, 3]);
    assert!(log.expire_if_due(secs(15)));
    assert!(log.is_expired() && log.is_closed());
    assert_eq!((log.last_id(), log.first_id(), log.retained()), (3, 4, 0));
    assert_eq!(expired(log.read_after(0)), (0, 4));
    assert_eq!(expired(log.read_after(2)), (2, 4));
    assert_eq!(log.read_after(3).unwrap(), (3, &[][..]), "nothing missed");
    assert_eq!(log.entries_after(3).unwrap().count(), 0);
    assert_eq!((log.retained_bytes(), log.frames.capacity()), (0, 0));
    assert!(log.expire_if_due(secs(16)), "stays expired");
    assert!(log.wait_after(3, Box::new(|| ())).is_err());
}

#[test]
fn retention_saturates() {
    let mut log = EventLog::with_limits(Limits {
        retention: Duration::MAX,
        ..Limits::default()
    })
    .unwrap();
    let _ = log.close(secs(1));
    assert_eq!(log.expires_at(), Some(Duration::MAX));
    assert!(!log.expire_if_due(secs(1 << 40)));
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
fn a_reader_whose_events_were_dropped_does_not_wait() {
    let (count, waker) = counter();
    let mut log = ring(2, usize::MAX);
    for text in ["a", "b", "c", "d"] {
        add(&mut log, text);
    }
    assert!(
        log.wait_after(1, waker()).is_err(),
        "read now and learn of the 410"
    );
    assert!(log.read_after(1).is_err());
    assert!(log.wait_after(4, waker()).is_ok());
    for text in ["e", "f", "g"] {
        let (_, wakers) = log.append_text(DELTA, HEAD, text, b"}").unwrap();
        wakers.wake_all();
    }
    assert_eq!(
        count.load(Ordering::SeqCst),
        1,
        "woken once, by the first append"
    );
    assert!(log.read_after(4).is_err(), "fell behind while away");
}

#[test]
fn expiring_an_open_log_wakes_readers_and_appends_go_on() {
    let (count, waker) = counter();
    let mut log = ring(100, usize::MAX);
    add(&mut log, "a");
    assert!(log.wait_after(1, waker()).is_ok());
    let wakers = log.expire();
    assert_eq!(count.load(Ordering::SeqCst), 0, "not called under the log");
    wakers.wake_all();
    assert_eq!(count.load(Ordering::SeqCst), 1);
    assert_eq!(log.waiting(), 0);
    assert_eq!(add(&mut log, "b"), 2);
    assert_eq!((log.first_id(), ids(&log, 1)), (2, vec![2]));
    assert_eq!(expired(log.read_after(0)), (0, 2));
    assert!(log.is_expired());
}

#[test]
fn a_bounded_read_cuts_between_frames_and_reads_the_rest_later() {
    let mut log = ring(4, 1 << 20);
    for text in ["a", "bb", "ccc", "dddd", "eeeee", "ffffff"] {
        add(&mut log, text);
    }
    // Ids 3..=6 are kept; the frames after 2, read in chunks, are the whole read.
    let (_, whole) = log.read_after(2).unwrap();
    let (last, first) = log.read_after_within(2, 1).unwrap();
    assert_eq!(last, 3, "the first frame comes whole even past the bound");
    let bound = 2 * first.len() + 2;
    let (mut after, mut joined, mut reads) = (2, Vec::new(), 0);
    while after < log.last_id() {
        let (last, frames) = log.read_after_within(after, bound).unwrap();
        assert!(last > after && frames.ends_with(b"\n\n"));
        assert!(frames.len() <= bound, "{} > {bound}", frames.len());
        joined.extend_from_slice(frames);
        (after, reads) = (last, reads + 1);
    }
    assert_eq!(joined, whole);
    assert!(reads >= 2, "read in {reads} chunks");
    assert_eq!(log.read_after_within(6, 10).unwrap(), (6, &[][..]));
    assert_eq!(expired(log.read_after_within(1, 10)), (1, 3));
}
