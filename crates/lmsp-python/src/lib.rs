//! `lmsp._core`: Python bindings for `lmsp-sse`, `lmsp-events` and `lmsp-constrain`.
//!
//! Only type and error conversion lives here; behaviour belongs to the pure
//! Rust crates, which know nothing of Python.

mod constrain;
mod errors;
mod log;
mod sse;

use pyo3::prelude::*;

#[pymodule]
fn _core(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(sse::encode_frame, module)?)?;
    module.add_function(wrap_pyfunction!(sse::encode_comment, module)?)?;
    module.add_function(wrap_pyfunction!(constrain::prepared_json_schema, module)?)?;
    module.add_function(wrap_pyfunction!(constrain::narrowed_json_schema, module)?)?;
    module.add_function(wrap_pyfunction!(constrain::greedy_at, module)?)?;
    module.add_class::<sse::SseEvent>()?;
    module.add_class::<sse::SseParser>()?;
    module.add_class::<log::PyEventLog>()?;
    module.add_class::<constrain::PyVocabulary>()?;
    module.add_class::<constrain::PyCompiledGrammar>()?;
    module.add_class::<constrain::PyConstraint>()?;
    module.add_class::<constrain::PyGrammarProbe>()?;
    errors::register(module)
}
