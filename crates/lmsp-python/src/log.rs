//! `EventLog`: the Rust event log behind a mutex, shared by the producer
//! thread and asyncio readers.

use std::sync::{Mutex, MutexGuard, PoisonError};

use pyo3::{
    exceptions::PyTypeError,
    prelude::*,
    sync::MutexExt,
    types::{PyBytes, PyList},
};

use lmsp_events::Waker;

use crate::errors;

/// An append-only log of SSE-framed events for one response; ids start at 1.
/// Thread-safe: a producer thread appends while asyncio readers read and wait.
#[pyclass(module = "lmsp._core", name = "EventLog", frozen)]
#[derive(Debug, Default)]
pub(crate) struct PyEventLog {
    log: Mutex<lmsp_events::EventLog>,
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

#[pymethods]
impl PyEventLog {
    #[new]
    fn new() -> Self {
        Self::default()
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
        Ok(id)
    }

    fn close(&self, py: Python<'_>) {
        let wakers = self.lock(py).close();
        wakers.wake_all();
    }

    #[getter]
    fn closed(&self, py: Python<'_>) -> bool {
        self.lock(py).is_closed()
    }

    #[getter]
    fn last_id(&self, py: Python<'_>) -> u64 {
        self.lock(py).last_id()
    }

    fn frames_after<'py>(&self, py: Python<'py>, after: u64) -> (u64, Bound<'py, PyBytes>) {
        let log = self.lock(py);
        let (last, frames) = log.frames_after(after);
        (last, PyBytes::new(py, frames))
    }

    fn entries_after<'py>(&self, py: Python<'py>, after: u64) -> PyResult<Bound<'py, PyList>> {
        let log = self.lock(py);
        PyList::new(
            py,
            log.entries_after(after)
                .map(|entry| (entry.id, entry.event, PyBytes::new(py, entry.data))),
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
        let closed = if log.is_closed() { "True" } else { "False" };
        format!("EventLog(last_id={}, closed={closed})", log.last_id())
    }
}
