//! `lmsp._core`: Python bindings for `lmsp-sse` and `lmsp-events`.
//!
//! Only type and error conversion lives here; behaviour belongs to the pure
//! Rust crates, which know nothing of Python.

mod errors;
mod log;
mod sse;

use pyo3::prelude::*;

#[pymodule]
fn _core(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(sse::encode_frame, module)?)?;
    module.add_function(wrap_pyfunction!(sse::encode_comment, module)?)?;
    module.add_class::<sse::SseEvent>()?;
    module.add_class::<sse::SseParser>()?;
    module.add_class::<log::PyEventLog>()?;
    errors::register(module)
}
