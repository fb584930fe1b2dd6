//! The native half of the Python package `swelake_reward`: the reward of the
//! `swelake-reward` crate behind the signatures Python trainers call.
//!
//! - The reference's entry points (`calculate_search_replace_reward`, `calculate_reward`,
//!   `calculate_reward_unidiff`) under their names and arguments, returning `(reward, metadata)`
//!   as `swerl.core.reward` does, so a script switches by changing its import.
//! - verl's `compute_score(data_source, solution_str, ground_truth, extra_info=None)`, reading
//!   the `ground_truth` of swelake's seed shards.
//! - Batch calls that score many cases on N threads with the GIL released.
//!
//! The TRL reward function is plain Python (`python/swelake_reward/__init__.py`): it only
//! unpacks TRL's columns and calls `compute_score_batch`.
//!
//! Bad input raises: `TypeError` for a value of the wrong type, `ValueError` for a ground
//! truth or case that does not parse. Nothing here panics on input.

use std::collections::BTreeMap;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};
use serde::Deserialize;
use swelake_reward::detailed::{self, Detailed};
use swelake_reward::{search_replace_reward, unidiff_reward, RewardError};

type Files = BTreeMap<String, String>;

/// Files as the seed writes them: a JSON object path → content, or (as in the shards'
/// `context`/`oracle` columns) a list of `{path, content}`.
#[derive(Deserialize)]
#[serde(untagged)]
enum FilesJson {
    Map(Files),
    Pairs(Vec<PathContent>),
}

#[derive(Deserialize)]
struct PathContent {
    path: String,
    content: String,
}

impl From<FilesJson> for Files {
    fn from(f: FilesJson) -> Files {
        match f {
            FilesJson::Map(m) => m,
            FilesJson::Pairs(v) => v.into_iter().map(|p| (p.path, p.content)).collect(),
        }
    }
}

/// `reward_model.ground_truth` of the seed: `{"kind": "search_replace", "context", "oracle"}`,
/// or `{"kind": "unidiff", "oracle_patches": [...]}` for answers written as unified diffs.
#[derive(Deserialize)]
struct GroundTruthJson {
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    context: Option<FilesJson>,
    #[serde(default)]
    oracle: Option<FilesJson>,
    #[serde(default)]
    oracle_patches: Option<Vec<String>>,
}

enum GroundTruth {
    SearchReplace { context: Files, oracle: Files },
    Unidiff { oracle_patches: Vec<String> },
}

impl GroundTruth {
    fn parse(text: &str) -> Result<GroundTruth, String> {
        let g: GroundTruthJson =
            serde_json::from_str(text).map_err(|e| format!("ground_truth is not a swelake ground truth: {e}"))?;
        match g.kind.as_deref().unwrap_or("search_replace") {
            "search_replace" => match (g.context, g.oracle) {
                (Some(c), Some(o)) => Ok(GroundTruth::SearchReplace { context: c.into(), oracle: o.into() }),
                _ => Err("ground_truth of kind search_replace needs `context` and `oracle`".to_string()),
            },
            "unidiff" => match g.oracle_patches {
                Some(oracle_patches) => Ok(GroundTruth::Unidiff { oracle_patches }),
                None => Err("ground_truth of kind unidiff needs `oracle_patches`".to_string()),
            },
            other => Err(format!("ground_truth has unknown kind {other:?} (search_replace, unidiff)")),
        }
    }

    fn score(&self, solution: &str) -> f64 {
        match self {
            GroundTruth::SearchReplace { context, oracle } => plain_search_replace(context, oracle, solution),
            GroundTruth::Unidiff { oracle_patches } => unidiff_reward(oracle_patches, &[solution.to_string()]).reward,
        }
    }
}

/// The fast reward: as the reference's current version, 1.0 when neither side changes a file.
fn plain_search_replace(context: &Files, oracle: &Files, output: &str) -> f64 {
    match search_replace_reward(context, oracle, output) {
        Ok(r) => r.reward,
        Err(RewardError::NoChanges) => 1.0,
    }
}

/// A ground truth from Python: the JSON text the shards hold, or the same as a dict.
fn ground_truth(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<GroundTruth> {
    let text: String = if let Ok(s) = obj.cast::<PyString>() {
        s.to_str()?.to_owned()
    } else if obj.is_instance_of::<PyDict>() {
        py.import("json")?.call_method1("dumps", (obj,))?.extract()?
    } else {
        return Err(PyTypeError::new_err(format!(
            "ground_truth must be a JSON string or a dict, not {}",
            obj.get_type().name()?
        )));
    };
    GroundTruth::parse(&text).map_err(PyValueError::new_err)
}

/// A model's answer: a string (Python raises before scoring anything else).
fn answer(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<String> {
    match obj.cast::<PyString>() {
        Ok(s) => Ok(s.to_str()?.to_owned()),
        Err(_) => Err(PyTypeError::new_err(format!("{what} must be a str, not {}", obj.get_type().name()?))),
    }
}

/// The reference's metadata dict of one reward.
fn metadata<'py>(py: Python<'py>, d: &Detailed) -> PyResult<Bound<'py, PyDict>> {
    let meta = PyDict::new(py);
    if let Some(e) = &d.error {
        meta.set_item("error", e)?;
        return Ok(meta);
    }
    let sims = PyList::empty(py);
    for s in &d.similarities {
        let item = PyDict::new(py);
        item.set_item("path", &s.path)?;
        item.set_item("pred_change", &s.pred_change)?;
        item.set_item("oracle_change", &s.oracle_change)?;
        item.set_item("similarity", s.similarity)?;
        sims.append(item)?;
    }
    meta.set_item("similarities", sims)?;
    if let Some(t) = &d.thought {
        meta.set_item("thought", t)?;
    }
    if let Some(a) = &d.answer {
        meta.set_item("answer", a)?;
    }
    Ok(meta)
}

/// Runs `f` on `threads` threads (all cores when `None`) with the GIL released.
fn parallel<T: Send>(py: Python<'_>, threads: Option<usize>, f: impl FnOnce() -> T + Send) -> PyResult<T> {
    match threads {
        None => Ok(py.detach(f)),
        Some(0) => Err(PyValueError::new_err("num_threads must be at least 1")),
        Some(n) => {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .map_err(|e| PyValueError::new_err(format!("cannot start {n} threads: {e}")))?;
            Ok(py.detach(|| pool.install(f)))
        }
    }
}

/// One reward case, as `swelake reward --input` reads it.
enum Case {
    SearchReplace { context: Files, oracle: Files, output: String },
    Unidiff { oracle_patches: Vec<String>, pred_patches: Vec<String> },
    General { context: Files, oracle: Files, pred: Files },
}

impl Case {
    fn from_py(i: usize, obj: &Bound<'_, PyAny>) -> PyResult<Case> {
        let d = obj.cast::<PyDict>().map_err(|_| PyTypeError::new_err(format!("case {i} is not a dict")))?;
        let get = |key: &str| -> PyResult<Bound<'_, PyAny>> {
            d.get_item(key)?.ok_or_else(|| PyValueError::new_err(format!("case {i} has no `{key}`")))
        };
        let kind: String = match d.get_item("kind")? {
            Some(k) => k.extract()?,
            None => "search_replace".to_string(),
        };
        let err = |key: &str, e: PyErr| PyTypeError::new_err(format!("case {i}: `{key}`: {e}"));
        let files = |key: &str| -> PyResult<Files> { get(key)?.extract().map_err(|e| err(key, e)) };
        let strings = |key: &str| -> PyResult<Vec<String>> { get(key)?.extract().map_err(|e| err(key, e)) };
        Ok(match kind.as_str() {
            "search_replace" => Case::SearchReplace {
                context: files("context")?,
                oracle: files("oracle")?,
                output: answer(&get("output")?, &format!("case {i}: `output`"))?,
            },
            "unidiff" => {
                Case::Unidiff { oracle_patches: strings("oracle_patches")?, pred_patches: strings("pred_patches")? }
            }
            "general" => Case::General { context: files("context")?, oracle: files("oracle")?, pred: files("pred")? },
            other => {
                return Err(PyValueError::new_err(format!(
                    "case {i}: unknown kind {other:?} (search_replace, unidiff, general)"
                )))
            }
        })
    }

    fn score(&self) -> f64 {
        match self {
            Case::SearchReplace { context, oracle, output } => plain_search_replace(context, oracle, output),
            Case::Unidiff { oracle_patches, pred_patches } => unidiff_reward(oracle_patches, pred_patches).reward,
            Case::General { context, oracle, pred } => detailed::reward(context, oracle, pred).reward,
        }
    }
}

/// The SWE-RL reward in Rust, with the values of facebookresearch/swe-rl's `swerl.core.reward`.
#[pymodule]
mod _swelake_reward {
    use pyo3::exceptions::{PyTypeError, PyValueError};
    use pyo3::prelude::*;
    use pyo3::types::PyDict;
    use rayon::prelude::*;
    use swelake_reward::detailed;

    use super::{answer, metadata, parallel, Case, Files};

    /// calculate_search_replace_reward(code_context, oracle_new_content, output) -> (reward, metadata)
    ///
    /// The reference's function: -1.0 and {"error": ...} for a malformed output, else the mean
    /// similarity of the per-file diffs, with {"similarities", "thought", "answer"}.
    #[pyfunction]
    fn calculate_search_replace_reward<'py>(
        py: Python<'py>,
        code_context: Files,
        oracle_new_content: Files,
        output: &Bound<'py, PyAny>,
    ) -> PyResult<(f64, Bound<'py, PyDict>)> {
        let output = answer(output, "output")?;
        let d = py.detach(|| detailed::search_replace_reward(&code_context, &oracle_new_content, &output));
        Ok((d.reward, metadata(py, &d)?))
    }

    /// calculate_reward(code_context, oracle_new_content, pred_new_content) -> (reward, metadata)
    ///
    /// The reference's general form: predicted new file contents instead of an answer.
    #[pyfunction]
    fn calculate_reward<'py>(
        py: Python<'py>,
        code_context: Files,
        oracle_new_content: Files,
        pred_new_content: Files,
    ) -> PyResult<(f64, Bound<'py, PyDict>)> {
        let d = py.detach(|| detailed::reward(&code_context, &oracle_new_content, &pred_new_content));
        Ok((d.reward, metadata(py, &d)?))
    }

    /// calculate_reward_unidiff(oracle_patches, pred_patches) -> (reward, metadata)
    ///
    /// The reference's unified-diff form: two lists of patch texts, split per file as the
    /// `unidiff` package does.
    #[pyfunction]
    fn calculate_reward_unidiff<'py>(
        py: Python<'py>,
        oracle_patches: Vec<String>,
        pred_patches: Vec<String>,
    ) -> PyResult<(f64, Bound<'py, PyDict>)> {
        let d = py.detach(|| detailed::unidiff_reward(&oracle_patches, &pred_patches));
        Ok((d.reward, metadata(py, &d)?))
    }

    /// compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float
    ///
    /// verl's custom reward function: `ground_truth` is `reward_model.ground_truth` of a seed
    /// shard row (JSON text or dict with `context` and `oracle`); `data_source` and
    /// `extra_info` are accepted and not needed.
    #[pyfunction]
    #[pyo3(signature = (data_source, solution_str, ground_truth, extra_info=None))]
    fn compute_score(
        py: Python<'_>,
        data_source: &Bound<'_, PyAny>,
        solution_str: &Bound<'_, PyAny>,
        ground_truth: &Bound<'_, PyAny>,
        extra_info: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<f64> {
        let _ = (data_source, extra_info);
        let solution = answer(solution_str, "solution_str")?;
        let truth = super::ground_truth(py, ground_truth)?;
        Ok(py.detach(|| truth.score(&solution)))
    }

    /// compute_score_batch(solution_strs, ground_truths, num_threads=None) -> list[float]
    ///
    /// `compute_score` over two lists of equal length, on `num_threads` threads (all cores by
    /// default) with the GIL released; results in input order.
    #[pyfunction]
    #[pyo3(signature = (solution_strs, ground_truths, num_threads=None))]
    fn compute_score_batch(
        py: Python<'_>,
        solution_strs: &Bound<'_, PyAny>,
        ground_truths: &Bound<'_, PyAny>,
        num_threads: Option<usize>,
    ) -> PyResult<Vec<f64>> {
        let solutions: Vec<Bound<'_, PyAny>> = solution_strs.try_iter()?.collect::<PyResult<_>>()?;
        let truths: Vec<Bound<'_, PyAny>> = ground_truths.try_iter()?.collect::<PyResult<_>>()?;
        if solutions.len() != truths.len() {
            return Err(PyValueError::new_err(format!(
                "{} solutions but {} ground truths",
                solutions.len(),
                truths.len()
            )));
        }
        let mut work = Vec::with_capacity(solutions.len());
        for (i, (s, g)) in solutions.iter().zip(&truths).enumerate() {
            let s = answer(s, &format!("solution_strs[{i}]"))?;
            let g = super::ground_truth(py, g).map_err(|e| {
                let msg = format!("ground_truths[{i}]: {e}");
                if e.is_instance_of::<PyTypeError>(py) {
                    PyTypeError::new_err(msg)
                } else {
                    PyValueError::new_err(msg)
                }
            })?;
            work.push((s, g));
        }
        parallel(py, num_threads, || work.par_iter().map(|(s, g)| g.score(s)).collect())
    }

    /// score_cases(cases, num_threads=None) -> list[float]
    ///
    /// Reward cases as `swelake reward --input` reads them, as dicts: `{"kind":
    /// "search_replace", "context", "oracle", "output"}`, `{"kind": "unidiff",
    /// "oracle_patches", "pred_patches"}` or `{"kind": "general", "context", "oracle", "pred"}`;
    /// scored on `num_threads` threads (all cores by default) with the GIL released.
    #[pyfunction]
    #[pyo3(signature = (cases, num_threads=None))]
    fn score_cases(py: Python<'_>, cases: &Bound<'_, PyAny>, num_threads: Option<usize>) -> PyResult<Vec<f64>> {
        let cases: Vec<Case> =
            cases.try_iter()?.enumerate().map(|(i, c)| Case::from_py(i, &c?)).collect::<PyResult<_>>()?;
        parallel(py, num_threads, || cases.par_iter().map(Case::score).collect())
    }
}
