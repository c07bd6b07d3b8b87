//! `Vocabulary`, `CompiledGrammar` and `Constraint`: grammar-constrained sampling, stepped
//! by the scheduler thread on the logits buffer llama.cpp hands out.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use pyo3::{
    exceptions::{PyTypeError, PyValueError},
    prelude::*,
    sync::MutexExt,
    types::{PyBytes, PyString},
};

use lmsp_constrain::{
    Check, Compiled, Constraint, Grammar, Penalties, Probe, Sampler, Sampling, Step, Token, Vocabulary,
};

use crate::errors::GrammarError;

/// A model's vocabulary for constrained sampling; compiles and caches grammars.
#[pyclass(module = "lmsp._core", name = "Vocabulary", frozen)]
pub(crate) struct PyVocabulary(Arc<Vocabulary>);

#[pymethods]
impl PyVocabulary {
    /// `tokens[i]` is token i: `bytes` for a text token, `str` (its name) for a control
    /// token. `end` lists the end-of-generation token ids. With `fast_forward`, generations
    /// under its grammars can commit forced text in runs (`Constraint._fast_forward`).
    #[new]
    #[pyo3(signature = (tokens, end, *, fast_forward = false))]
    #[allow(clippy::needless_pass_by_value)] // pyo3 extracts arguments as owned values
    fn new(py: Python<'_>, tokens: Vec<Bound<'_, PyAny>>, end: Vec<u32>, fast_forward: bool) -> PyResult<Self> {
        let tokens = tokens
            .iter()
            .map(|t| {
                if let Ok(b) = t.cast::<PyBytes>() {
                    Ok(Token::Text(b.as_bytes().to_vec()))
                } else if let Ok(s) = t.cast::<PyString>() {
                    Ok(Token::Special(s.to_str()?.to_owned()))
                } else {
                    Err(PyTypeError::new_err("a token is bytes (text) or str (a control token's name)"))
                }
            })
            .collect::<PyResult<Vec<_>>>()?;
        let vocab = py
            .detach(|| Vocabulary::with_forcing(&tokens, &end, fast_forward))
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(Self(Arc::new(vocab)))
    }

    #[getter]
    fn n_vocab(&self) -> usize {
        self.0.n_vocab()
    }

    /// How many compiled grammars the cache holds (it is bounded).
    #[getter]
    fn cached_grammars(&self) -> usize {
        self.0.cached_grammars()
    }

    /// Compiles a JSON schema given as JSON text; raises `GrammarError` naming what cannot
    /// be enforced. Releases the GIL: a compile takes milliseconds.
    fn compile_json_schema(&self, py: Python<'_>, schema: &str) -> PyResult<PyCompiledGrammar> {
        // serde_json stops at 128 levels of nesting: deeper is refused like any other schema.
        let schema: serde_json::Value = serde_json::from_str(schema)
            .map_err(|e| GrammarError::new_err(format!("the schema could not be read: {e}")))?;
        self.compile(py, &Grammar::JsonSchema(schema))
    }

    /// Compiles a grammar in llguidance's Lark dialect (it may embed `%json {…}`).
    fn compile_lark(&self, py: Python<'_>, grammar: &str) -> PyResult<PyCompiledGrammar> {
        self.compile(py, &Grammar::Lark(grammar.to_owned()))
    }
}

impl PyVocabulary {
    fn compile(&self, py: Python<'_>, grammar: &Grammar) -> PyResult<PyCompiledGrammar> {
        let vocab = self.0.clone();
        let n_vocab = vocab.n_vocab();
        py.detach(|| vocab.compile(grammar))
            .map(|compiled| PyCompiledGrammar { compiled, n_vocab })
            .map_err(|e| GrammarError::new_err(e.message))
    }
}

/// A JSON schema (JSON text) as the engine compiles it, for embedding in a Lark grammar's
/// `%json`: exact date formats and the service's JSON layout.
#[pyfunction]
pub(crate) fn prepared_json_schema(schema: &str) -> PyResult<String> {
    let schema: serde_json::Value = serde_json::from_str(schema)
        .map_err(|e| GrammarError::new_err(format!("the schema could not be read: {e}")))?;
    Ok(lmsp_constrain::prepared_json_schema(&schema).to_string())
}

/// A JSON schema (JSON text) narrowed as the service narrows what a client sends, before
/// anything is left to the check of the finished value (`lmsp_constrain::narrow`).
#[pyfunction]
pub(crate) fn narrowed_json_schema(schema: &str) -> PyResult<String> {
    let mut schema: serde_json::Value = serde_json::from_str(schema)
        .map_err(|e| GrammarError::new_err(format!("the schema could not be read: {e}")))?;
    lmsp_constrain::narrow(&mut schema);
    Ok(schema.to_string())
}

/// A grammar compiled for one vocabulary; each generation starts its own `Constraint`.
#[pyclass(module = "lmsp._core", name = "CompiledGrammar", frozen)]
pub(crate) struct PyCompiledGrammar {
    compiled: Arc<Compiled>,
    n_vocab: usize,
}

#[pymethods]
impl PyCompiledGrammar {
    /// A generation under this grammar, sampled as llama.cpp's chain would sample among the
    /// tokens it allows: repetition penalties over the last `penalty_last_n` tokens of its own
    /// output, then `top_k` (0: off), `top_p` (1: off), `min_p` (0: off), `temperature` (0:
    /// greedy) and a draw seeded by `seed`. `mask_every_token` computes the full token mask at
    /// every step instead of checking the sampled token first: the same outputs, slower; the
    /// reference the fast path is tested against (top-k and top-p always mask: a draw from
    /// the whole row cannot stand for theirs).
    #[pyo3(signature = (
        *, temperature, seed, min_p, top_k = 0, top_p = 1.0, repeat_penalty = 1.0, frequency_penalty = 0.0,
        presence_penalty = 0.0, penalty_last_n = 64, mask_every_token = false,
    ))]
    #[allow(clippy::too_many_arguments)] // keyword arguments, one per llama.cpp setting
    fn start(
        &self,
        temperature: f32,
        seed: u64,
        min_p: f32,
        top_k: usize,
        top_p: f32,
        repeat_penalty: f32,
        frequency_penalty: f32,
        presence_penalty: f32,
        penalty_last_n: usize,
        mask_every_token: bool,
    ) -> PyConstraint {
        let check = if mask_every_token { Check::EveryMask } else { Check::SampledToken };
        let penalties =
            Penalties { last_n: penalty_last_n, repeat: repeat_penalty, frequency: frequency_penalty, presence: presence_penalty };
        let sampling = Sampling { temperature, seed, min_p, top_k, top_p, penalties };
        let constraint = Constraint::with_check(&self.compiled, sampling, check);
        PyConstraint { constraint: Mutex::new(constraint), n_vocab: self.n_vocab }
    }

    /// A reader of texts under this grammar, from its start: for conformance runs.
    #[pyo3(name = "_probe")]
    fn probe(&self) -> PyGrammarProbe {
        PyGrammarProbe(Mutex::new(self.compiled.probe()))
    }
}

/// Whether a text is (a prefix of) a sentence of a grammar; `fork` copies it.
#[pyclass(module = "lmsp._core", name = "GrammarProbe", frozen)]
pub(crate) struct PyGrammarProbe(Mutex<Probe>);

#[pymethods]
impl PyGrammarProbe {
    /// Reads `text`; false (and the probe is spent) when the grammar refuses it.
    fn feed(&self, py: Python<'_>, text: &[u8]) -> bool {
        self.lock(py).feed(text)
    }

    /// Whether what was read so far is a whole sentence.
    fn accepting(&self, py: Python<'_>) -> bool {
        self.lock(py).accepting()
    }

    /// An independent copy, at the same point.
    fn fork(&self, py: Python<'_>) -> Self {
        Self(Mutex::new(self.lock(py).clone()))
    }
}

impl PyGrammarProbe {
    /// Waits for the lock without holding the GIL its holder may need back.
    fn lock<'a>(&'a self, py: Python<'_>) -> std::sync::MutexGuard<'a, Probe> {
        self.0.lock_py_attached(py).unwrap_or_else(PoisonError::into_inner)
    }
}

/// One generation's grammar state and sampler. Used by one thread, the model's scheduler.
#[pyclass(module = "lmsp._core", name = "Constraint", frozen)]
pub(crate) struct PyConstraint {
    constraint: Mutex<Constraint>,
    // The length of every logits row this generation may be stepped on.
    n_vocab: usize,
}

#[pymethods]
impl PyConstraint {
    /// One token from the `n_vocab` floats at address `logits` (llama.cpp's row for this
    /// sequence, valid until its next decode): returns `(token, done)`. `token` is -1 when
    /// there is nothing to emit; `done` means the output ends now. After an error, `error`
    /// says why (and the result is `(-1, True)`). With repetition penalties set, they are
    /// written into the row first (llama.cpp rewrites the row at the next decode).
    ///
    /// Private to the scheduler, the one caller that holds a live logits row: an address is
    /// not something Python can check, so it stays out of the public API.
    #[pyo3(name = "_step_at")]
    fn step_at(&self, py: Python<'_>, logits: usize, n_vocab: usize) -> PyResult<(i64, bool)> {
        if n_vocab != self.n_vocab {
            return Err(PyValueError::new_err(format!(
                "the logits row has {n_vocab} entries; the grammar's vocabulary has {}",
                self.n_vocab
            )));
        }
        if logits == 0 || logits % std::mem::align_of::<f32>() != 0 {
            return Err(PyValueError::new_err("logits must be a non-null, aligned float pointer"));
        }
        // The lock is taken and dropped while detached, so no thread ever waits for it while
        // holding the GIL that its holder needs back.
        let step = py.detach(|| {
            let mut constraint = self.constraint.lock().unwrap_or_else(PoisonError::into_inner);
            if constraint.penalized() {
                // SAFETY: as for `logits_row` below; and nothing else reads or writes the row
                // while this call runs: the one thread that decodes into it is this caller's.
                #[allow(unsafe_code)]
                let row = unsafe { logits_row_mut(logits, n_vocab) };
                constraint.penalize(row);
                constraint.step(row)
            } else {
                // SAFETY: the address is not null and aligned (checked above), and the
                // scheduler, the one caller, passes what `llama_get_logits_ith` returned for a
                // batch entry of the context it alone decodes, with the model's vocabulary size
                // (checked above against this grammar's): llama.cpp keeps those `n_vocab`
                // floats alive and unchanged until the next `llama_decode`, which the same
                // thread cannot run before this call returns. The slice does not outlive it.
                #[allow(unsafe_code)]
                let row = unsafe { logits_row(logits, n_vocab) };
                constraint.step(row)
            }
        });
        Ok(match step {
            Step::Token(t) => (i64::from(t), false),
            Step::Last(t) => (i64::from(t), true),
            Step::End | Step::Error => (-1, true),
        })
    }

    /// After a step that returned a token and not `done`: the tokens the grammar forces next
    /// (at most `max`), committed as if sampled, and whether the output ends with them:
    /// `(tokens, done)`. `([], False)` where nothing is forced or the vocabulary was built
    /// without `fast_forward`. Private to the scheduler, which decodes them in one run.
    #[pyo3(name = "_fast_forward")]
    fn fast_forward(&self, py: Python<'_>, max: usize) -> (Vec<u32>, bool) {
        let mut constraint = self.constraint.lock_py_attached(py).unwrap_or_else(PoisonError::into_inner);
        let forced = constraint.fast_forward(max).to_vec();
        (forced, constraint.is_complete())
    }

    /// Where this generation's steps spent their time: `steps`, `masks` (steps that computed
    /// the full token mask), `forced` (tokens fast-forwarded), and nanoseconds in `sample_ns`,
    /// `check_ns`, `mask_ns`, `commit_ns`, `forward_ns`.
    #[getter]
    fn stats(&self, py: Python<'_>) -> BTreeMap<&'static str, u64> {
        let constraint = self.constraint.lock_py_attached(py).unwrap_or_else(PoisonError::into_inner);
        let s = constraint.stats();
        BTreeMap::from([
            ("steps", s.steps),
            ("masks", s.masks),
            ("sample_ns", s.sample_ns),
            ("check_ns", s.check_ns),
            ("mask_ns", s.mask_ns),
            ("commit_ns", s.commit_ns),
            ("forced", s.forced),
            ("forward_ns", s.forward_ns),
        ])
    }

    /// Why the grammar could not be followed, or `None`.
    #[getter]
    fn error(&self, py: Python<'_>) -> Option<String> {
        let constraint = self.constraint.lock_py_attached(py).unwrap_or_else(PoisonError::into_inner);
        constraint.error().map(str::to_owned)
    }
}

/// The likeliest token of the `n_vocab` floats at address `logits` (the lowest id on a tie,
/// as llama.cpp's greedy sampler picks): free text at temperature 0, read where llama.cpp
/// left the row instead of copied into a candidates array first, with the GIL held (it takes
/// microseconds; releasing it would hand the event loop the GIL in the middle of a step).
///
/// Private to the scheduler, for the reason `Constraint._step_at` is: the address is a live
/// logits row only the decoding thread can vouch for.
#[pyfunction]
#[pyo3(name = "_greedy_at")]
pub(crate) fn greedy_at(logits: usize, n_vocab: usize) -> PyResult<i64> {
    if logits == 0 || logits % std::mem::align_of::<f32>() != 0 || n_vocab == 0 {
        return Err(PyValueError::new_err("logits must be a non-null, aligned float pointer to a non-empty row"));
    }
    // SAFETY: as in `PyConstraint::step_at`: the scheduler passes what `llama_get_logits_ith`
    // returned for a batch entry of the context it alone decodes, with the model's vocabulary
    // size; those floats stay alive and unchanged until its next `llama_decode`, which cannot
    // run before this call returns. The slice does not outlive this call.
    #[allow(unsafe_code)]
    let row = unsafe { logits_row(logits, n_vocab) };
    Ok(Sampler::best(row).map_or(-1, |(token, _)| i64::from(token)))
}

/// The logits row as a slice, without copying it.
///
/// # Safety
/// `address` points to `n` initialised, aligned `f32`s that nothing writes or frees for `'a`.
#[allow(unsafe_code)]
unsafe fn logits_row<'a>(address: usize, n: usize) -> &'a [f32] {
    // SAFETY: what the caller promises, above.
    unsafe { std::slice::from_raw_parts(address as *const f32, n) }
}

/// The logits row as a mutable slice, without copying it.
///
/// # Safety
/// As for [`logits_row`], and nothing else reads or writes those floats for `'a`.
#[allow(unsafe_code)]
unsafe fn logits_row_mut<'a>(address: usize, n: usize) -> &'a mut [f32] {
    // SAFETY: what the caller promises, above.
    unsafe { std::slice::from_raw_parts_mut(address as *mut f32, n) }
}
