//! The exception hierarchy of `lmsp._core`, one class per Rust error variant:
//!
//! ```text
//! LmspCoreError(Exception)
//! ├── EventLogClosed                    LogError::Closed
//! ├── EventHistoryExpired               LogError::HistoryExpired
//! ├── GrammarError                      CompileError (a grammar the engine cannot enforce)
//! ├── InvalidLimit(…, ValueError)       LogError::InvalidLimit
//! └── InvalidEvent(…, ValueError)
//!     ├── InvalidEventName              SseError::InvalidEventName
//!     └── InvalidUtf8                   LogError::InvalidUtf8
//! ```

use std::error::Error;

use pyo3::{
    create_exception,
    exceptions::{PyException, PyValueError},
    prelude::*,
    sync::PyOnceLock,
    types::{PyDict, PyTuple, PyType},
};

use lmsp_events::LogError;
use lmsp_sse::SseError;

create_exception!(
    lmsp._core,
    LmspCoreError,
    PyException,
    "Base class of every error raised by lmsp._core."
);
create_exception!(
    lmsp._core,
    EventLogClosed,
    LmspCoreError,
    "The EventLog is closed: its response is over and takes no more events."
);
create_exception!(
    lmsp._core,
    EventHistoryExpired,
    LmspCoreError,
    "Some of the events asked for are no longer kept (410 event_history_expired).\n\n\
     `after` is the id asked to read after; `first_id` the oldest id still kept."
);

create_exception!(
    lmsp._core,
    GrammarError,
    LmspCoreError,
    "A grammar or JSON schema the constraint engine cannot enforce, or one over its limits;\n\
     the message names the keyword or the limit."
);

/// The `InvalidEvent` family and `InvalidLimit` also derive from `ValueError`,
/// so that callers catching bad input the usual way catch these too.
/// `create_exception!` takes a single base, so these classes are made by
/// calling `type` at import time.
struct InvalidClasses {
    invalid_event: Py<PyType>,
    invalid_event_name: Py<PyType>,
    invalid_utf8: Py<PyType>,
    invalid_limit: Py<PyType>,
}

static INVALID: PyOnceLock<InvalidClasses> = PyOnceLock::new();

fn new_class<'py>(
    py: Python<'py>,
    name: &str,
    bases: Bound<'py, PyTuple>,
    doc: &str,
) -> PyResult<Py<PyType>> {
    let namespace = PyDict::new(py);
    namespace.set_item("__module__", "lmsp._core")?;
    namespace.set_item("__doc__", doc)?;
    let class = py.get_type::<PyType>().call1((name, bases, namespace))?;
    Ok(class.cast_into::<PyType>()?.unbind())
}

fn invalid_classes(py: Python<'_>) -> PyResult<&InvalidClasses> {
    INVALID.get_or_try_init(py, || {
        let core_and_value = || {
            PyTuple::new(
                py,
                [
                    py.get_type::<LmspCoreError>(),
                    py.get_type::<PyValueError>(),
                ],
            )
        };
        let base = new_class(
            py,
            "InvalidEvent",
            core_and_value()?,
            "An event that cannot be encoded or logged.",
        )?;
        let child = |name, doc| new_class(py, name, PyTuple::new(py, [base.bind(py)])?, doc);
        Ok(InvalidClasses {
            invalid_event_name: child(
                "InvalidEventName",
                "An SSE event name that is empty or holds CR or LF.",
            )?,
            invalid_utf8: child("InvalidUtf8", "Event data that is not valid UTF-8.")?,
            invalid_event: base,
            invalid_limit: new_class(
                py,
                "InvalidLimit",
                core_and_value()?,
                "An EventLog limit out of range, e.g. max_events=0.",
            )?,
        })
    })
}

/// Adds every exception class to the module.
pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    module.add("LmspCoreError", py.get_type::<LmspCoreError>())?;
    module.add("EventLogClosed", py.get_type::<EventLogClosed>())?;
    module.add("EventHistoryExpired", py.get_type::<EventHistoryExpired>())?;
    module.add("GrammarError", py.get_type::<GrammarError>())?;
    let invalid = invalid_classes(py)?;
    module.add("InvalidEvent", invalid.invalid_event.bind(py))?;
    module.add("InvalidEventName", invalid.invalid_event_name.bind(py))?;
    module.add("InvalidUtf8", invalid.invalid_utf8.bind(py))?;
    module.add("InvalidLimit", invalid.invalid_limit.bind(py))?;
    Ok(())
}

/// The error's message followed by its sources, as Python shows one string.
fn message(err: &dyn Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn invalid(py: Python<'_>, pick: fn(&InvalidClasses) -> &Py<PyType>, text: String) -> PyErr {
    match invalid_classes(py) {
        Ok(classes) => PyErr::from_type(pick(classes).bind(py).clone(), text),
        Err(err) => err,
    }
}

pub(crate) fn sse_error(py: Python<'_>, err: &SseError) -> PyErr {
    match err {
        SseError::InvalidEventName(_) => invalid(py, |c| &c.invalid_event_name, message(err)),
    }
}

pub(crate) fn log_error(py: Python<'_>, err: &LogError) -> PyErr {
    match err {
        LogError::Closed => EventLogClosed::new_err(message(err)),
        LogError::InvalidUtf8(_) => invalid(py, |c| &c.invalid_utf8, message(err)),
        LogError::Sse(sse) => sse_error(py, sse),
        LogError::HistoryExpired { after, first_id } => {
            let err = EventHistoryExpired::new_err(message(err));
            // Kept as numbers too, so the service can build its problem
            // document without parsing the message.
            let value = err.value(py);
            let set = value
                .setattr("after", after)
                .and_then(|()| value.setattr("first_id", first_id));
            set.err().unwrap_or(err)
        }
        LogError::InvalidLimit(_) => invalid(py, |c| &c.invalid_limit, message(err)),
    }
}

/// An out-of-range limit caught while converting arguments, before Rust sees it.
pub(crate) fn invalid_limit(py: Python<'_>, text: String) -> PyErr {
    invalid(py, |c| &c.invalid_limit, text)
}

/// Data passed as bytes to `encode_frame` must be text, like logged data.
pub(crate) fn utf8_error(py: Python<'_>, err: std::str::Utf8Error) -> PyErr {
    log_error(py, &LogError::InvalidUtf8(err))
}
