//! Property: any sequence of operations behaves like a plain `Vec` of entries.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use lmsp_events::{EventLog, LogError, Wakers};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Append(String, Vec<u8>),
    AppendText(String, Vec<u8>, String, Vec<u8>),
    FramesAfter(u64),
    EntriesAfter(u64),
    Wait(u64),
    Close,
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
        4 => (name(), bytes()).prop_map(|(n, d)| Op::Append(n, d)),
        4 => (name(), bytes(), any::<String>(), bytes())
            .prop_map(|(n, h, t, tl)| Op::AppendText(n, h, t, tl)),
        2 => (0u64..12).prop_map(Op::FramesAfter),
        1 => (0u64..12).prop_map(Op::EntriesAfter),
        2 => (0u64..12).prop_map(Op::Wait),
        1 => Just(Op::Close),
    ]
}

#[derive(Default)]
struct Model {
    entries: Vec<(String, Vec<u8>)>,
    closed: bool,
    /// Registered wakers, all of which the next append or close hands back.
    waiting: usize,
}

impl Model {
    fn append(&mut self, event: &str, data: Vec<u8>) -> Result<u64, &'static str> {
        if self.closed {
            return Err("closed");
        }
        if std::str::from_utf8(&data).is_err() {
            return Err("utf8");
        }
        if event.is_empty() || event.contains(['\r', '\n']) {
            return Err("sse");
        }
        self.entries.push((event.to_owned(), data));
        Ok(self.entries.len() as u64)
    }

    fn wait(&mut self, after: u64) -> bool {
        let register = !self.closed && after >= self.entries.len() as u64;
        self.waiting += usize::from(register);
        register
    }

    fn frames_after(&self, after: u64) -> Vec<u8> {
        let mut out = Vec::new();
        for (index, (event, data)) in self.entries.iter().enumerate().skip(after as usize) {
            let text = std::str::from_utf8(data).unwrap();
            lmsp_sse::encode_event(&mut out, Some(index as u64 + 1), Some(event), text).unwrap();
        }
        out
    }
}

fn kind(err: &LogError) -> &'static str {
    match err {
        LogError::Closed => "closed",
        LogError::InvalidUtf8(_) => "utf8",
        LogError::Sse(_) => "sse",
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

proptest! {
    #[test]
    fn log_matches_vec_model(ops in prop::collection::vec(op(), 0..40)) {
        let mut log = EventLog::new();
        let mut model = Model::default();
        let woken = Arc::new(AtomicUsize::new(0));
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
                Op::FramesAfter(after) => {
                    let (last, frames) = log.frames_after(after);
                    prop_assert_eq!(last, model.entries.len() as u64);
                    prop_assert_eq!(frames.to_vec(), model.frames_after(after));
                }
                Op::EntriesAfter(after) => {
                    let got: Vec<(u64, String, Vec<u8>)> = log
                        .entries_after(after)
                        .map(|e| (e.id, e.event.to_owned(), e.data.to_vec()))
                        .collect();
                    let want: Vec<(u64, String, Vec<u8>)> = model
                        .entries
                        .iter()
                        .enumerate()
                        .skip(after as usize)
                        .map(|(i, (event, data))| (i as u64 + 1, event.clone(), data.clone()))
                        .collect();
                    prop_assert_eq!(got, want);
                }
                Op::Wait(after) => {
                    let counter = Arc::clone(&woken);
                    let waker = Box::new(move || {
                        counter.fetch_add(1, Ordering::SeqCst);
                    });
                    prop_assert_eq!(log.wait_after(after, waker).is_ok(), model.wait(after));
                    prop_assert_eq!(log.waiting(), model.waiting);
                }
                Op::Close => {
                    wake(log.close(), &mut model, &woken)?;
                    model.closed = true;
                }
            }
            prop_assert_eq!(log.last_id(), model.entries.len() as u64);
            prop_assert_eq!(log.is_closed(), model.closed);
        }
        let (_, all) = log.frames_after(0);
        prop_assert_eq!(all.to_vec(), model.frames_after(0));
    }
}
