//! `EventLog`: the Rust event ring behind a mutex, shared by the producer
//! thread and asyncio readers.

use std::{
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use pyo3::{
    exceptions::{PyTypeError, PyValueError},
    prelude::*,
    sync::{MutexExt, PyOnceLock},
    types::{PyBytes, PyList},
};

use lmsp_events::{Limits, LogError, Waker};

use crate::errors;

/// A bounded ring of SSE-framed events for one response; ids start at 1.
/// Thread-safe: a producer thread appends while asyncio readers read and wait.
#[pyclass(module = "lmsp._core", name = "EventLog", frozen)]
#[derive(Debug)]
pub(crate) struct PyEventLog {
    log: Mutex<lmsp_events::EventLog>,
    mirror: Mutex<Option<Arc<Mirror>>>,
}

/// Where `append_text` also writes each text delta, numbered, framed for a
/// second face (the OpenAI one): one call from the producer writes both.
#[derive(Debug)]
struct Mirror {
    log: Py<PyEventLog>,
    event: String,
    head: Vec<u8>,
    tail: Vec<u8>,
}

impl PyEventLog {
    /// Locks without ever blocking while attached to Python: if another thread
    /// holds the lock and needs the GIL back to finish (say, a finalizer ran
    /// while it built a `bytes`), waiting with the GIL held would deadlock.
    fn lock(&self, py: Python<'_>) -> MutexGuard<'_, lmsp_events::EventLog> {
        // Mutations validate before they write, so a poisoned log is consistent.
        self.log
            .lock_py_attached(py)
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// A Python callable as a log waker. Runs on the appending thread once the
/// log is unlocked; an exception cannot reach the appender, who did nothing
/// wrong, so it is reported as unraisable instead.
fn python_waker(waker: Py<PyAny>) -> Waker {
    Box::new(move || {
        Python::attach(|py| {
            if let Err(err) = waker.call0(py) {
                err.write_unraisable(py, Some(waker.bind(py)));
            }
        });
    })
}

static MONOTONIC: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// `now`, or `time.monotonic()`: the clock asyncio's loop uses, so a timer set
/// with `loop.call_at(log.expires_at, ...)` fires when the history is due.
/// The Rust log never reads a clock itself.
fn now_or_monotonic(py: Python<'_>, now: Option<f64>) -> PyResult<Duration> {
    let now = match now {
        Some(now) => now,
        None => MONOTONIC
            .import(py, "time", "monotonic")?
            .call0()?
            .extract()?,
    };
    Duration::try_from_secs_f64(now)
        .map_err(|_| PyValueError::new_err(format!("now must be a finite time >= 0, not {now}")))
}

const _: () = assert!(Limits::DEFAULT_MAX_EVENTS == 65_536);
const _: () = assert!(Limits::DEFAULT_MAX_BYTES == 16_777_216);
const _: () = assert!(Limits::DEFAULT_RETENTION.as_millis() == 300_000);

#[pymethods]
impl PyEventLog {
    #[new]
    // Literal defaults, so that `inspect.signature` (and stubtest) can show
    // them; the assertions below keep them equal to the crate's.
    #[pyo3(signature = (*, max_events = 65_536, max_bytes = 16_777_216, expire_after = 300.0))]
    fn new(
        py: Python<'_>,
        max_events: usize,
        max_bytes: usize,
        expire_after: f64,
    ) -> PyResult<Self> {
        let retention = Duration::try_from_secs_f64(expire_after).map_err(|_| {
            errors::invalid_limit(
                py,
                format!("expire_after must be a finite number of seconds >= 0, not {expire_after}"),
            )
        })?;
        let limits = Limits {
            max_events,
            max_bytes,
            retention,
        };
        let log = lmsp_events::EventLog::with_limits(limits)
            .map_err(|err| errors::log_error(py, &err))?;
        Ok(Self {
            log: Mutex::new(log),
            mirror: Mutex::new(None),
        })
    }

    fn append(&self, py: Python<'_>, event: &str, data: &[u8]) -> PyResult<u64> {
        let appended = self.lock(py).append(event, data);
        let (id, wakers) = appended.map_err(|err| errors::log_error(py, &err))?;
        // The guard was a temporary of the statement above: the log is unlocked.
        wakers.wake_all();
        Ok(id)
    }

    fn append_text(
        &self,
        py: Python<'_>,
        event: &str,
        head: &[u8],
        text: &str,
        tail: &[u8],
    ) -> PyResult<u64> {
        let appended = self.lock(py).append_text(event, head, text, tail);
        let (id, wakers) = appended.map_err(|err| errors::log_error(py, &err))?;
        wakers.wake_all();
        // Never held while the GIL is needed: a clone of the Arc, then unlocked.
        let mirror = self
            .mirror
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(mirror) = mirror {
            let target = mirror.log.get();
            // Attached, as the first append: detaching here to let the reader run measured
            // slower (the producer then waits up to a switch interval for the GIL back).
            let appended =
                target
                    .lock(py)
                    .append_numbered(&mirror.event, &mirror.head, Some(text), &mirror.tail);
            match appended {
                Ok((_, wakers)) => wakers.wake_all(),
                // The mirror's face ended early (shutdown): this log goes on without it.
                Err(LogError::Closed) => {}
                Err(err) => return Err(errors::log_error(py, &err)),
            }
        }
        Ok(id)
    }

    /// Appends an event numbered with its own id (see the crate's `append_numbered`).
    #[pyo3(signature = (event, head, tail, text = None))]
    fn append_numbered(
        &self,
        py: Python<'_>,
        event: &str,
        head: &[u8],
        tail: &[u8],
        text: Option<&str>,
    ) -> PyResult<u64> {
        let appended = self.lock(py).append_numbered(event, head, text, tail);
        let (id, wakers) = appended.map_err(|err| errors::log_error(py, &err))?;
        wakers.wake_all();
        Ok(id)
    }

    /// From now on, each `append_text` also appends its text to `log`, as
    /// `log.append_numbered(event, head, tail, text)` would (skipped once `log`
    /// is closed); `None` stops it.
    #[pyo3(signature = (log, event = String::new(), head = Vec::new(), tail = Vec::new()))]
    fn mirror_text(
        &self,
        log: Option<Py<PyEventLog>>,
        event: String,
        head: Vec<u8>,
        tail: Vec<u8>,
    ) {
        let mirror = log.map(|log| {
            Arc::new(Mirror {
                log,
                event,
                head,
                tail,
            })
        });
        *self.mirror.lock().unwrap_or_else(PoisonError::into_inner) = mirror;
    }

    #[pyo3(signature = (now = None))]
    fn close(&self, py: Python<'_>, now: Option<f64>) -> PyResult<()> {
        let now = now_or_monotonic(py, now)?;
        let wakers = self.lock(py).close(now);
        wakers.wake_all();
        Ok(())
    }

    fn expire(&self, py: Python<'_>) {
        let wakers = self.lock(py).expire();
        wakers.wake_all();
    }

    #[pyo3(signature = (now = None))]
    fn expire_if_due(&self, py: Python<'_>, now: Option<f64>) -> PyResult<bool> {
        let now = now_or_monotonic(py, now)?;
        Ok(self.lock(py).expire_if_due(now))
    }

    #[getter]
    fn closed(&self, py: Python<'_>) -> bool {
        self.lock(py).is_closed()
    }

    #[getter]
    fn expired(&self, py: Python<'_>) -> bool {
        self.lock(py).is_expired()
    }

    #[getter]
    fn expires_at(&self, py: Python<'_>) -> Option<f64> {
        self.lock(py).expires_at().map(|at| at.as_secs_f64())
    }

    #[getter]
    fn last_id(&self, py: Python<'_>) -> u64 {
        self.lock(py).last_id()
    }

    #[getter]
    fn first_id(&self, py: Python<'_>) -> u64 {
        self.lock(py).first_id()
    }

    #[getter]
    fn retained_bytes(&self, py: Python<'_>) -> usize {
        self.lock(py).retained_bytes()
    }

    #[getter]
    fn max_events(&self, py: Python<'_>) -> usize {
        self.lock(py).limits().max_events
    }

    #[getter]
    fn max_bytes(&self, py: Python<'_>) -> usize {
        self.lock(py).limits().max_bytes
    }

    #[getter]
    fn expire_after(&self, py: Python<'_>) -> f64 {
        self.lock(py).limits().retention.as_secs_f64()
    }

    /// `limit`: at most that many bytes, cut between frames (the first whole).
    #[pyo3(signature = (after, limit = None))]
    fn frames_after<'py>(
        &self,
        py: Python<'py>,
        after: u64,
        limit: Option<usize>,
    ) -> PyResult<(u64, Bound<'py, PyBytes>)> {
        let log = self.lock(py);
        let read = match limit {
            Some(limit) => log.read_after_within(after, limit),
            None => log.read_after(after),
        };
        match read {
            Ok((last, frames)) => Ok((last, PyBytes::new(py, frames))),
            Err(err) => Err(errors::log_error(py, &err)),
        }
    }

    fn entries_after<'py>(&self, py: Python<'py>, after: u64) -> PyResult<Bound<'py, PyList>> {
        let log = self.lock(py);
        let entries = log
            .entries_after(after)
            .map_err(|err| errors::log_error(py, &err))?;
        PyList::new(
            py,
            entries.map(|entry| (entry.id, entry.event, PyBytes::new(py, entry.data))),
        )
    }

    fn wait(&self, py: Python<'_>, after: u64, waker: Bound<'_, PyAny>) -> PyResult<bool> {
        if !waker.is_callable() {
            return Err(PyTypeError::new_err("waker must be callable"));
        }
        let registered = self
            .lock(py)
            .wait_after(after, python_waker(waker.unbind()));
        // A refused waker is dropped here, outside the lock.
        Ok(registered.is_ok())
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let log = self.lock(py);
        let flag = |on: bool| if on { "True" } else { "False" };
        format!(
            "EventLog(first_id={}, last_id={}, closed={}, expired={})",
            log.first_id(),
            log.last_id(),
            flag(log.is_closed()),
            flag(log.is_expired()),
        )
    }
}
