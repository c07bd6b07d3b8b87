//! Ring throughput: append + framing, and replay, in events per second.
//!
//! `cargo bench -p lmsp-events` measures; run without `--bench` (as
//! `cargo test --benches` does) it only checks each workload once, quickly.

#![allow(
    clippy::print_stdout,
    reason = "a benchmark reports its figures on stdout"
)]

use std::{
    hint::black_box,
    time::{Duration, Instant},
};

use lmsp_events::{EventLog, Limits, SharedLog};

const DELTA: &str = "response.output_text.delta";
/// The service's delta head: two 26-character ULIDs, as `EventBuilder` makes it.
const HEAD: &[u8] = br#"{"response_id":"resp_01J8M6Q4W2T7N5R3V9X1Z8B0DF","item_id":"msg_01J8M6Q4W5C8H2K9P3S7Y1A6ZE","delta":"#;
const TOKENS: [&str; 8] = [
    " local",
    " model",
    "s",
    " stream",
    ",",
    " \"quoted\"",
    "\n",
    " é",
];

struct Run {
    events: usize,
    rounds: usize,
}

/// The best of `rounds` timings of `work`, which handles `events` events.
fn measure(name: &str, run: &Run, events: usize, mut work: impl FnMut()) {
    work(); // warm-up: page in memory, settle the ring at its bounds
    let best = (0..run.rounds)
        .map(|_| {
            let start = Instant::now();
            work();
            start.elapsed()
        })
        .min()
        .unwrap_or(Duration::MAX);
    let per_event = best.as_secs_f64() / events as f64;
    println!(
        "{name:<44} {:>8.2} M events/s  {:>7.1} ns/event  ({events} events, best of {})",
        1e-6 / per_event,
        per_event * 1e9,
        run.rounds,
    );
}

/// One per-token append, as the service makes it; nobody waits in these runs.
fn push(log: &mut EventLog, i: usize) -> u64 {
    let (id, wakers) = log.append_text(DELTA, HEAD, TOKENS[i % 8], b"}").unwrap();
    wakers.wake_all();
    id
}

/// A log already past its count bound, so every append also drops one.
fn full_log() -> EventLog {
    let mut log = EventLog::new();
    for i in 0..=Limits::DEFAULT_MAX_EVENTS {
        push(&mut log, i);
    }
    log
}

fn append_text(run: &Run) {
    let mut log = full_log();
    measure(
        "append_text + framing (at the bounds)",
        run,
        run.events,
        || {
            for i in 0..run.events {
                black_box(push(&mut log, i));
            }
        },
    );
    assert_eq!(log.retained(), Limits::DEFAULT_MAX_EVENTS);
}

fn append_json(run: &Run) {
    let mut log = full_log();
    let data = br#"{"response_id":"resp_01J8M6Q4W2T7N5R3V9X1Z8B0DF","item_id":"msg_01J8M6Q4W5C8H2K9P3S7Y1A6ZE","delta":" local"}"#;
    measure(
        "append ready JSON + framing (at the bounds)",
        run,
        run.events,
        || {
            for _ in 0..run.events {
                let (id, wakers) = log.append(DELTA, data).unwrap();
                wakers.wake_all();
                black_box(id);
            }
        },
    );
}

fn append_fresh(run: &Run) {
    // A normal response: a new log per response, 1,000 tokens each.
    let responses = (run.events / 1_000).max(1);
    measure(
        "append_text, fresh log per 1,000 events",
        run,
        responses * 1_000,
        || {
            for _ in 0..responses {
                let mut log = EventLog::new();
                for i in 0..1_000 {
                    black_box(push(&mut log, i));
                }
            }
        },
    );
}

fn append_shared(run: &Run) {
    let log = SharedLog::new();
    measure(
        "SharedLog append_text (mutex, wakers)",
        run,
        run.events,
        || {
            for i in 0..run.events {
                black_box(log.append_text(DELTA, HEAD, TOKENS[i % 8], b"}").unwrap());
            }
        },
    );
}

fn replay(run: &Run) {
    let log = full_log();
    let kept = log.retained();
    let first = log.first_id() - 1;
    // Where a reader's frames go: a reused buffer, as a socket write copies them.
    let mut out = Vec::with_capacity(log.retained_bytes());
    let passes = (run.events / kept).max(1);
    measure(
        "replay: read_after + copy out, whole ring",
        run,
        passes * kept,
        || {
            for _ in 0..passes {
                out.clear();
                let (last, frames) = log.read_after(black_box(first)).unwrap();
                out.extend_from_slice(frames);
                black_box((last, &out));
            }
        },
    );
    measure(
        "replay: entries_after (id, name, data)",
        run,
        passes * kept,
        || {
            for _ in 0..passes {
                for entry in log.entries_after(black_box(first)).unwrap() {
                    black_box(entry);
                }
            }
        },
    );
}

fn follow(run: &Run) {
    // The live pattern: a reader copies out what is new every 16 appends
    // (one wake-up per catch-up, not one per event).
    let mut log = full_log();
    let mut out = Vec::new();
    let mut cursor = log.last_id();
    measure(
        "follow: append_text, read every 16 + copy",
        run,
        run.events,
        || {
            for i in 0..run.events {
                if push(&mut log, i) % 16 == 0 {
                    out.clear();
                    let (last, frames) = log.read_after(cursor).unwrap();
                    out.extend_from_slice(frames);
                    cursor = last;
                    black_box(&out);
                }
            }
        },
    );
}

fn main() {
    let bench = std::env::args().any(|arg| arg == "--bench");
    let run = if bench {
        Run {
            events: 2_000_000,
            rounds: 7,
        }
    } else {
        Run {
            events: 2_000,
            rounds: 1,
        }
    };
    append_text(&run);
    append_json(&run);
    append_fresh(&run);
    append_shared(&run);
    replay(&run);
    follow(&run);
}
