//! Property: any sequence of appends, reads, waits, closes and expiries
//! behaves like a simple model: a `Vec` of every event ever appended, of which
//! the log keeps the longest suffix (since the last expiry) within the limits.
//! (covers: R6.4-1, R6.4-3)

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use lmsp_events::{EventLog, Limits, LogError, Wakers};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Append(String, Vec<u8>),
    AppendText(String, Vec<u8>, String, Vec<u8>),
    ReadAfter(u64),
    EntriesAfter(u64),
    Wait(u64),
    Close,
    Tick(u64),
    ExpireIfDue,
    Expire,
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec!["response.output_text.delta", "response.created", "é"])
            .prop_map(str::to_owned),
        1 => prop::sample::select(vec!["", "a\nb", "a\r"]).prop_map(str::to_owned),
    ]
}

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => any::<String>().prop_map(String::into_bytes),
        1 => prop::collection::vec(any::<u8>(), 0..8),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (name(), bytes()).prop_map(|(n, d)| Op::Append(n, d)),
        8 => (name(), bytes(), any::<String>(), bytes())
            .prop_map(|(n, h, t, tl)| Op::AppendText(n, h, t, tl)),
        4 => (0u64..40).prop_map(Op::ReadAfter),
        2 => (0u64..40).prop_map(Op::EntriesAfter),
        3 => (0u64..40).prop_map(Op::Wait),
        1 => Just(Op::Close),
        2 => (0u64..4).prop_map(Op::Tick),
        2 => Just(Op::ExpireIfDue),
        1 => Just(Op::Expire),
    ]
}

fn limits() -> impl Strategy<Value = Limits> {
    let max_bytes = prop_oneof![1usize..600, Just(usize::MAX)];
    (1usize..8, max_bytes, 0u64..5).prop_map(|(max_events, max_bytes, secs)| Limits {
        max_events,
        max_bytes,
        retention: Duration::from_secs(secs),
    })
}

/// Every event ever appended, as its wire frame, name and data.
struct Appended {
    frame: Vec<u8>,
    event: String,
    data: Vec<u8>,
}

struct Model {
    limits: Limits,
    all: Vec<Appended>,
    /// Events before this index were dropped by an expiry.
    floor: usize,
    /// The index of the oldest kept event.
    first: usize,
    closed_at: Option<u64>,
    expired: bool,
    /// Registered wakers, all of which the next append, close or expire hands back.
    waiting: usize,
}

impl Model {
    fn new(limits: Limits) -> Self {
        Self {
            limits,
            all: Vec::new(),
            floor: 0,
            first: 0,
            closed_at: None,
            expired: false,
            waiting: 0,
        }
    }

    fn last_id(&self) -> u64 {
        self.all.len() as u64
    }

    fn kept(&self) -> &[Appended] {
        &self.all[self.first..]
    }

    fn append(&mut self, event: &str, data: Vec<u8>) -> Result<u64, &'static str> {
        if self.closed_at.is_some() {
            return Err("closed");
        }
        let Ok(text) = std::str::from_utf8(&data) else {
            return Err("utf8");
        };
        let id = self.last_id() + 1;
        let mut frame = Vec::new();
        if lmsp_sse::encode_event(&mut frame, Some(id), Some(event), text).is_err() {
            return Err("sse");
        }
        self.all.push(Appended {
            frame,
            event: event.to_owned(),
            data,
        });
        // The longest suffix within both bounds, and never less than the newest.
        self.first = self.all.len() - 1;
        let mut bytes = self.all[self.first].frame.len();
        while self.first > self.floor {
            let count = self.all.len() - self.first + 1;
            let more = bytes + self.all[self.first - 1].frame.len();
            if count > self.limits.max_events || more > self.limits.max_bytes {
                break;
            }
            self.first -= 1;
            bytes = more;
        }
        Ok(id)
    }

    fn read_after(&self, after: u64) -> Result<(u64, Vec<u8>), (u64, u64)> {
        let first_id = self.first as u64 + 1;
        if after >= self.last_id() {
            return Ok((self.last_id(), Vec::new()));
        }
        if after + 1 < first_id {
            return Err((after, first_id));
        }
        let frames = self.all[after as usize..]
            .iter()
            .map(|a| a.frame.as_slice());
        Ok((self.last_id(), frames.collect::<Vec<_>>().concat()))
    }

    fn expires_at(&self) -> Option<Duration> {
        self.closed_at
            .map(|at| Duration::from_secs(at) + self.limits.retention)
    }

    fn expire(&mut self) {
        self.floor = self.all.len();
        self.first = self.all.len();
        self.expired = true;
    }
}

fn kind(err: &LogError) -> &'static str {
    match err {
        LogError::Closed => "closed",
        LogError::InvalidUtf8(_) => "utf8",
        LogError::Sse(_) => "sse",
        LogError::HistoryExpired { .. } => "expired",
        LogError::InvalidLimit(_) => "limit",
    }
}

/// Checks that `wakers` holds every registered waker, then runs them.
fn wake(wakers: Wakers, model: &mut Model, woken: &AtomicUsize) -> Result<(), TestCaseError> {
    prop_assert_eq!(wakers.len(), model.waiting);
    let before = woken.load(Ordering::SeqCst);
    wakers.wake_all();
    prop_assert_eq!(woken.load(Ordering::SeqCst), before + model.waiting);
    model.waiting = 0;
    Ok(())
}

fn check_append(
    got: Result<(u64, Wakers), LogError>,
    want: Result<u64, &'static str>,
    model: &mut Model,
    woken: &AtomicUsize,
) -> Result<(), TestCaseError> {
    match got {
        Ok((id, wakers)) => {
            prop_assert_eq!(Ok(id), want);
            wake(wakers, model, woken)
        }
        Err(err) => {
            prop_assert_eq!(Err(kind(&err)), want);
            Ok(())
        }
    }
}

fn check_state(log: &EventLog, model: &Model) -> Result<(), TestCaseError> {
    prop_assert_eq!(log.last_id(), model.last_id());
    prop_assert_eq!(log.first_id(), model.first as u64 + 1);
    prop_assert_eq!(log.retained(), model.kept().len());
    let bytes: usize = model.kept().iter().map(|a| a.frame.len()).sum();
    prop_assert_eq!(log.retained_bytes(), bytes);
    prop_assert_eq!(log.is_closed(), model.closed_at.is_some());
    prop_assert_eq!(log.is_expired(), model.expired);
    prop_assert_eq!(log.expires_at(), model.expires_at());
    prop_assert_eq!(log.waiting(), model.waiting);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn ring_matches_model(limits in limits(), ops in prop::collection::vec(op(), 0..60)) {
        let mut log = EventLog::with_limits(limits).unwrap();
        let mut model = Model::new(limits);
        let woken = Arc::new(AtomicUsize::new(0));
        let mut now = 0u64;
        for op in ops {
            match op {
                Op::Append(event, data) => {
                    let got = log.append(&event, &data);
                    let want = model.append(&event, data);
                    check_append(got, want, &mut model, &woken)?;
                }
                Op::AppendText(event, head, text, tail) => {
                    let got = log.append_text(&event, &head, &text, &tail);
                    let data = [head, serde_json::to_vec(&text).unwrap(), tail].concat();
                    let want = model.append(&event, data);
                    check_append(got, want, &mut model, &woken)?;
                }
                Op::ReadAfter(after) => {
                    let got = match log.read_after(after) {
                        Ok((last, frames)) => Ok((last, frames.to_vec())),
                        Err(LogError::HistoryExpired { after, first_id }) => Err((after, first_id)),
                        Err(err) => return Err(TestCaseError::fail(format!("{err:?}"))),
                    };
                    prop_assert_eq!(got, model.read_after(after));
                }
                Op::EntriesAfter(after) => {
                    let got = log.entries_after(after).map(|entries| {
                        entries
                            .map(|e| (e.id, e.event.to_owned(), e.data.to_vec()))
                            .collect::<Vec<_>>()
                    });
                    match model.read_after(after) {
                        Ok(_) => {
                            let want: Vec<(u64, String, Vec<u8>)> = model.all
                                .iter()
                                .enumerate()
                                .skip(after as usize)
                                .map(|(i, a)| (i as u64 + 1, a.event.clone(), a.data.clone()))
                                .collect();
                            prop_assert_eq!(got.ok(), Some(want));
                        }
                        Err(_) => prop_assert_eq!(got.err().map(|e| kind(&e)), Some("expired")),
                    }
                }
                Op::Wait(after) => {
                    let counter = Arc::clone(&woken);
                    let waker = Box::new(move || {
                        counter.fetch_add(1, Ordering::SeqCst);
                    });
                    let register = model.closed_at.is_none() && after >= model.last_id();
                    prop_assert_eq!(log.wait_after(after, waker).is_ok(), register);
                    model.waiting += usize::from(register);
                }
                Op::Close => {
                    wake(log.close(Duration::from_secs(now)), &mut model, &woken)?;
                    model.closed_at.get_or_insert(now);
                }
                Op::Tick(secs) => now += secs,
                Op::ExpireIfDue => {
                    if model.expires_at().is_some_and(|at| Duration::from_secs(now) >= at) {
                        model.expire();
                    }
                    prop_assert_eq!(log.expire_if_due(Duration::from_secs(now)), model.expired);
                }
                Op::Expire => {
                    wake(log.expire(), &mut model, &woken)?;
                    model.expire();
                }
            }
            check_state(&log, &model)?;
        }
        let first = log.first_id();
        let (_, kept) = log.read_after(first - 1).unwrap();
        let want = model.read_after(first - 1).unwrap().1;
        prop_assert_eq!(kept.to_vec(), want);
    }
}
