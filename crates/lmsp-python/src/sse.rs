//! `encode_frame`, `encode_comment`, `SseEvent` and `SseParser`.

use std::{cell::RefCell, mem};

use pyo3::{
    exceptions::PyTypeError,
    prelude::*,
    types::{PyBytes, PyString},
};

use crate::errors;

/// Chunks at least this big are parsed with the GIL released; for smaller
/// ones releasing and re-taking it costs more than it frees.
const DETACH_AT: usize = 64 * 1024;

/// A frame buffer that grew past this is dropped after use, so that one huge
/// frame does not pin its memory for the thread's life.
const KEEP_BUFFER_UP_TO: usize = 64 * 1024;

thread_local! {
    /// Frames are built here and copied once into the returned `bytes`, so a
    /// call allocates nothing on the Rust side.
    static FRAME: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Runs `build` on the thread's frame buffer, cleared. Falls back to a fresh
/// buffer if the thread's is in use (a re-entrant call from a finalizer).
fn with_frame_buffer<R>(build: impl FnOnce(&mut Vec<u8>) -> R) -> R {
    FRAME.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            buf.clear();
            let result = build(&mut buf);
            if buf.capacity() > KEEP_BUFFER_UP_TO {
                *buf = Vec::new();
            }
            result
        }
        Err(_) => build(&mut Vec::new()),
    })
}

/// `str` as is; `bytes` must be UTF-8, as SSE is a text protocol.
fn text_of<'a>(data: &'a Bound<'_, PyAny>) -> PyResult<&'a str> {
    if let Ok(bytes) = data.cast::<PyBytes>() {
        return std::str::from_utf8(bytes.as_bytes())
            .map_err(|err| errors::utf8_error(data.py(), err));
    }
    if let Ok(text) = data.cast::<PyString>() {
        return text.to_str();
    }
    Err(PyTypeError::new_err(format!(
        "data must be str or bytes, not {}",
        data.get_type().name()?
    )))
}

/// One SSE frame: `id: N`, `event: NAME`, one `data:` line per line of data.
#[pyfunction]
#[pyo3(signature = (id, event, data))]
pub(crate) fn encode_frame<'py>(
    py: Python<'py>,
    id: Option<u64>,
    event: Option<&str>,
    data: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let data = text_of(data)?;
    with_frame_buffer(|buf| {
        lmsp_sse::encode_event(buf, id, event, data).map_err(|err| errors::sse_error(py, &err))?;
        Ok(PyBytes::new(py, buf))
    })
}

/// A comment frame (`: text`), e.g. a keep-alive.
#[pyfunction]
pub(crate) fn encode_comment<'py>(py: Python<'py>, text: &str) -> Bound<'py, PyBytes> {
    with_frame_buffer(|buf| {
        lmsp_sse::encode_comment(buf, text);
        PyBytes::new(py, buf)
    })
}

/// One parsed event.
#[pyclass(module = "lmsp._core", frozen, eq, hash, get_all)]
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct SseEvent {
    id: Option<String>,
    event: String,
    data: String,
    retry: Option<u64>,
}

impl From<lmsp_sse::Event> for SseEvent {
    fn from(event: lmsp_sse::Event) -> Self {
        let lmsp_sse::Event {
            id,
            event,
            data,
            retry,
        } = event;
        Self {
            id,
            event,
            data,
            retry,
        }
    }
}

#[pymethods]
impl SseEvent {
    #[new]
    #[pyo3(signature = (*, data, event = "message", id = None, retry = None))]
    fn new(data: String, event: &str, id: Option<String>, retry: Option<u64>) -> Self {
        let event = event.to_owned();
        Self {
            id,
            event,
            data,
            retry,
        }
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        // Python's own repr of each field, so quotes and escapes read as in Python.
        let repr = |value: Bound<'_, PyAny>| value.repr().map(|r| r.to_string());
        Ok(format!(
            "SseEvent(id={}, event={}, data={}, retry={})",
            repr(self.id.as_deref().into_pyobject(py)?)?,
            repr(self.event.as_str().into_pyobject(py)?.into_any())?,
            repr(self.data.as_str().into_pyobject(py)?.into_any())?,
            repr(self.retry.into_pyobject(py)?)?,
        ))
    }
}

/// An incremental SSE parser; comments are kept aside for `take_comments`.
#[pyclass(module = "lmsp._core")]
#[derive(Debug, Default)]
pub(crate) struct SseParser {
    parser: lmsp_sse::Parser,
    comments: Vec<String>,
}

#[pymethods]
impl SseParser {
    #[new]
    fn new() -> Self {
        Self::default()
    }

    fn feed(&mut self, py: Python<'_>, chunk: &[u8]) -> Vec<SseEvent> {
        let parser = &mut self.parser;
        let items = if chunk.len() >= DETACH_AT {
            py.detach(|| parser.feed(chunk))
        } else {
            parser.feed(chunk)
        };
        let mut events = Vec::with_capacity(items.len());
        for item in items {
            match item {
                lmsp_sse::Item::Event(event) => events.push(event.into()),
                lmsp_sse::Item::Comment(text) => self.comments.push(text),
            }
        }
        events
    }

    fn take_comments(&mut self) -> Vec<String> {
        mem::take(&mut self.comments)
    }
}
