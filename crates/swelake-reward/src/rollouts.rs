//! Scoring a rollout table (`schemas/rollouts.toml`): reads Parquet row group by row group,
//! adds `reward`, `format_error`, `reward_error`, the completion's patch and every mode's
//! reward (the test modes' from a grader the caller gives: see [`modes`]), writes Parquet.
//!
//! Where the code context and oracle come from: inline `context`/`oracle` columns (maps or
//! JSON object strings) when the rollouts carry them, otherwise a lookup by `instance_id` that
//! the caller reads from the seed shards. A row that cannot be scored (unknown instance,
//! malformed map, the reference's assertion case) keeps a NULL reward and says why in
//! `reward_error`; nothing is dropped.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use rayon::prelude::*;

use super::columns::MapColumn;
use super::modes::{self, Answer, Mode, TestOutcome};

/// Path → content maps of one instance.
pub type Files = BTreeMap<String, String>;

/// Totals of a rollout scoring run.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct RolloutSummary {
    pub rows: usize,
    pub scored: usize,
    pub format_errors: usize,
    pub unscoreable: usize,
    pub mean_reward: Option<f64>,
    /// The mode that chose `reward`.
    pub mode: String,
    /// Patches run against their instance's tests (each distinct patch once).
    pub graded: usize,
    pub resolved: usize,
    /// Patches that did not apply.
    pub patch_failed: usize,
}

/// Grades (instance_id, patch) pairs by running the instance's tests; one outcome per pair.
pub type GradeFn<'a> = dyn Fn(&[(String, String)]) -> Vec<TestOutcome> + Sync + 'a;

/// How rows are scored: the mode that chooses `reward`, and the grader the test modes need.
pub struct Scoring<'a> {
    pub mode: Mode,
    pub grader: Option<&'a GradeFn<'a>>,
}

/// Columns this module writes (an input's own are replaced).
const OUTPUT_COLUMNS: [&str; 17] = [
    "reward",
    "format_error",
    "reward_error",
    "reward_mode",
    "reward_similarity",
    "reward_tests",
    "reward_hybrid",
    "similarity",
    "predicted_patch",
    "resolved",
    "f2p_passed",
    "f2p_total",
    "p2p_passed",
    "p2p_total",
    "grade_status",
    "grade_reason",
    "grade_seconds",
];

/// Scores `input` into `output` with the SWE-RL similarity. `seed` (instance_id → context,
/// oracle) is required unless the rollouts carry `context` and `oracle` columns.
pub fn score_rollouts(
    input: &Path,
    output: &Path,
    seed: Option<&HashMap<String, (Files, Files)>>,
    pool: &rayon::ThreadPool,
) -> Result<RolloutSummary> {
    score_rollouts_with(input, output, seed, pool, &Scoring { mode: Mode::Similarity, grader: None })
}

/// One row read as an answer, or why it cannot be scored.
type RowAnswer = Result<(String, Answer), String>;

/// Scores `input` into `output`: every mode's reward that can be had (the test modes' when a
/// grader is given), `reward` the one of `scoring.mode`, the graded patch and its outcome.
pub fn score_rollouts_with(
    input: &Path,
    output: &Path,
    seed: Option<&HashMap<String, (Files, Files)>>,
    pool: &rayon::ThreadPool,
    scoring: &Scoring<'_>,
) -> Result<RolloutSummary> {
    if scoring.mode.runs_tests() && scoring.grader.is_none() {
        bail!("reward mode {} runs the instances' tests: it needs a lake and its repositories", scoring.mode);
    }
    let file = File::open(input).with_context(|| format!("opening {}", input.display()))?;
    let builder =
        ParquetRecordBatchReaderBuilder::try_new(file).with_context(|| format!("reading {}", input.display()))?;
    let in_schema = builder.schema().clone();
    for required in ["instance_id", "group_id", "completion"] {
        if in_schema.index_of(required).is_err() {
            bail!("{}: rollouts need a `{required}` column (see schemas/rollouts.toml)", input.display());
        }
    }
    let inline = in_schema.index_of("context").is_ok() && in_schema.index_of("oracle").is_ok();
    if !inline && seed.is_none() {
        bail!("{}: no `context`/`oracle` columns, so the seed shards are needed to look them up", input.display());
    }
    let kept: Vec<usize> = (0..in_schema.fields().len())
        .filter(|i| !OUTPUT_COLUMNS.contains(&in_schema.field(*i).name().as_str()))
        .collect();
    let tested = scoring.grader.is_some();
    let mut fields: Vec<Field> = kept.iter().map(|i| in_schema.field(*i).clone()).collect();
    fields.push(Field::new("reward", DataType::Float64, true));
    fields.push(Field::new("format_error", DataType::Utf8, true));
    fields.push(Field::new("reward_error", DataType::Utf8, true));
    fields.push(Field::new("reward_mode", DataType::Utf8, false));
    fields.push(Field::new("reward_similarity", DataType::Float64, true));
    fields.push(Field::new("similarity", DataType::Float64, true));
    fields.push(Field::new("predicted_patch", DataType::Utf8, true));
    if tested {
        fields.push(Field::new("reward_tests", DataType::Float64, true));
        fields.push(Field::new("reward_hybrid", DataType::Float64, true));
        fields.push(Field::new("resolved", DataType::Boolean, true));
        for c in ["f2p_passed", "f2p_total", "p2p_passed", "p2p_total"] {
            fields.push(Field::new(c, DataType::Int64, true));
        }
        fields.push(Field::new("grade_status", DataType::Utf8, true));
        fields.push(Field::new("grade_reason", DataType::Utf8, true));
        fields.push(Field::new("grade_seconds", DataType::Float64, true));
    }
    let out_schema = Arc::new(Schema::new(fields));
    let out_file = File::create(output).with_context(|| format!("creating {}", output.display()))?;
    let mut writer = ArrowWriter::try_new(out_file, out_schema.clone(), None)?;

    let mut summary = RolloutSummary { mode: scoring.mode.to_string(), ..Default::default() };
    let mut reward_sum = 0.0;
    for batch in builder.build()? {
        let batch = batch?;
        let ids = arrow::compute::cast(batch.column_by_name("instance_id").expect("checked"), &DataType::Utf8)?;
        let ids = ids.as_string::<i32>();
        let completions = arrow::compute::cast(batch.column_by_name("completion").expect("checked"), &DataType::Utf8)?;
        let completions = completions.as_string::<i32>();
        let (ctx_col, ora_col) = if inline {
            (
                Some(MapColumn::new(batch.column_by_name("context").expect("checked"))?),
                Some(MapColumn::new(batch.column_by_name("oracle").expect("checked"))?),
            )
        } else {
            (None, None)
        };
        let answers: Vec<RowAnswer> = pool.install(|| {
            (0..batch.num_rows())
                .into_par_iter()
                .map(|r| {
                    if completions.is_null(r) {
                        return Err("completion is NULL".to_string());
                    }
                    let id = if ids.is_null(r) { "" } else { ids.value(r) };
                    let looked_up;
                    let (context, oracle): (&Files, &Files) = match (&ctx_col, &ora_col) {
                        (Some(c), Some(o)) => match (c.get(r), o.get(r)) {
                            (Some(c), Some(o)) => {
                                looked_up = (c, o);
                                (&looked_up.0, &looked_up.1)
                            }
                            _ => return Err("context/oracle is NULL or not a path -> content map".into()),
                        },
                        _ => match seed.and_then(|s| s.get(id)) {
                            Some((c, o)) => (c, o),
                            None => return Err(format!("instance_id {id:?} is not in the seed shards")),
                        },
                    };
                    modes::answer(context, oracle, completions.value(r))
                        .map(|a| (id.to_string(), a))
                        .map_err(|e| e.to_string())
                })
                .collect()
        });
        // Every well-formed patch of the batch graded in one call: the grader runs them N
        // at once and each distinct (instance, patch) once.
        let mut outcomes: Vec<Option<TestOutcome>> = vec![None; answers.len()];
        if let Some(grade) = scoring.grader {
            let asked: Vec<(usize, (String, String))> = answers
                .iter()
                .enumerate()
                .filter_map(|(r, a)| match a {
                    Ok((id, ans)) => ans.patch.as_ref().map(|p| (r, (id.clone(), p.clone()))),
                    Err(_) => None,
                })
                .collect();
            let pairs: Vec<(String, String)> = asked.iter().map(|(_, p)| p.clone()).collect();
            let got = grade(&pairs);
            if got.len() != pairs.len() {
                bail!("the grader answered {} outcomes for {} patches", got.len(), pairs.len());
            }
            for ((r, _), o) in asked.iter().zip(got) {
                outcomes[*r] = Some(o);
            }
        }
        let mut rewards: Vec<Option<f64>> = Vec::with_capacity(answers.len());
        let mut errors: Vec<Option<String>> = Vec::with_capacity(answers.len());
        for (a, o) in answers.iter().zip(&outcomes) {
            summary.rows += 1;
            let (reward, err) = match a {
                Ok((_, ans)) => match ans.reward(scoring.mode, o.as_ref()) {
                    Some(v) => (Some(v), None),
                    None => (None, Some(o.as_ref().map_or("not graded".to_string(), |o| o.reason.clone()))),
                },
                Err(e) => (None, Some(e.clone())),
            };
            match reward {
                Some(v) => {
                    summary.scored += 1;
                    reward_sum += v;
                    let malformed = |ans: &Answer| {
                        if scoring.mode.runs_tests() {
                            ans.malformed()
                        } else {
                            ans.format_error.is_some()
                        }
                    };
                    if matches!(a, Ok((_, ans)) if malformed(ans)) {
                        summary.format_errors += 1;
                    }
                }
                None => summary.unscoreable += 1,
            }
            if let Some(o) = o {
                summary.graded += usize::from(o.graded());
                summary.resolved += usize::from(o.resolved);
                summary.patch_failed += usize::from(o.status == "patch_failed");
            }
            rewards.push(reward);
            errors.push(err);
        }
        let ans = |r: usize| answers[r].as_ref().ok().map(|(_, a)| a);
        let n = answers.len();
        let f64s = |f: &dyn Fn(usize) -> Option<f64>| -> ArrayRef { Arc::new(Float64Array::from_iter((0..n).map(f))) };
        let strs =
            |f: &dyn Fn(usize) -> Option<String>| -> ArrayRef { Arc::new(StringArray::from_iter((0..n).map(f))) };
        let mut columns: Vec<ArrayRef> = kept.iter().map(|i| batch.column(*i).clone()).collect();
        columns.push(f64s(&|r| rewards[r]));
        columns.push(strs(&|r| ans(r).and_then(|a| a.format_error.clone())));
        columns.push(strs(&|r| errors[r].clone()));
        columns.push(Arc::new(StringArray::from_iter_values((0..n).map(|_| scoring.mode.as_str()))));
        columns.push(f64s(&|r| ans(r).map(|a| a.reward_similarity)));
        columns.push(f64s(&|r| ans(r).map(|a| a.similarity)));
        columns.push(strs(&|r| ans(r).and_then(|a| a.patch.clone())));
        if tested {
            columns.push(f64s(&|r| ans(r).and_then(|a| a.reward(Mode::Tests, outcomes[r].as_ref()))));
            columns.push(f64s(&|r| ans(r).and_then(|a| a.reward(Mode::Hybrid, outcomes[r].as_ref()))));
            let out = |r: usize| outcomes[r].as_ref();
            columns.push(Arc::new(BooleanArray::from_iter(
                (0..n).map(|r| out(r).filter(|o| o.graded()).map(|o| o.resolved)),
            )));
            for f in [
                |o: &TestOutcome| o.f2p_passed,
                |o: &TestOutcome| o.f2p_total,
                |o: &TestOutcome| o.p2p_passed,
                |o: &TestOutcome| o.p2p_total,
            ] {
                columns.push(Arc::new(Int64Array::from_iter(
                    (0..n).map(|r| out(r).filter(|o| o.graded()).map(|o| i64::from(f(o)))),
                )));
            }
            columns.push(strs(&|r| out(r).map(|o| o.status.clone())));
            columns.push(strs(&|r| out(r).map(|o| o.reason.clone())));
            columns.push(f64s(&|r| out(r).map(|o| o.seconds)));
        }
        writer.write(&RecordBatch::try_new(out_schema.clone(), columns)?)?;
    }
    writer.close()?;
    summary.mean_reward = (summary.scored > 0).then(|| reward_sum / summary.scored as f64);
    Ok(summary)
}
