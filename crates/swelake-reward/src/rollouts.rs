//! Scoring a rollout table (`schemas/rollouts.toml`): reads Parquet row group by row group,
//! adds `reward`, `format_error` and `reward_error`, writes Parquet.
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
use arrow::array::{Array, ArrayRef, AsArray, Float64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use rayon::prelude::*;

use super::columns::MapColumn;
use super::search_replace_reward;

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
}

const OUTPUT_COLUMNS: [&str; 3] = ["reward", "format_error", "reward_error"];

/// Scores `input` into `output`. `seed` (instance_id → context, oracle) is required unless the
/// rollouts carry `context` and `oracle` columns.
pub fn score_rollouts(
    input: &Path,
    output: &Path,
    seed: Option<&HashMap<String, (Files, Files)>>,
    pool: &rayon::ThreadPool,
) -> Result<RolloutSummary> {
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
    let mut fields: Vec<Field> = kept.iter().map(|i| in_schema.field(*i).clone()).collect();
    fields.push(Field::new("reward", DataType::Float64, true));
    fields.push(Field::new("format_error", DataType::Utf8, true));
    fields.push(Field::new("reward_error", DataType::Utf8, true));
    let out_schema = Arc::new(Schema::new(fields));
    let out_file = File::create(output).with_context(|| format!("creating {}", output.display()))?;
    let mut writer = ArrowWriter::try_new(out_file, out_schema.clone(), None)?;

    let mut summary = RolloutSummary::default();
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
        let results: Vec<(Option<f64>, Option<String>, Option<String>)> = pool.install(|| {
            (0..batch.num_rows())
                .into_par_iter()
                .map(|r| {
                    if completions.is_null(r) {
                        return (None, None, Some("completion is NULL".to_string()));
                    }
                    let looked_up;
                    let (context, oracle): (&Files, &Files) = match (&ctx_col, &ora_col) {
                        (Some(c), Some(o)) => match (c.get(r), o.get(r)) {
                            (Some(c), Some(o)) => {
                                looked_up = (c, o);
                                (&looked_up.0, &looked_up.1)
                            }
                            _ => {
                                return (None, None, Some("context/oracle is NULL or not a path -> content map".into()))
                            }
                        },
                        _ => {
                            let id = if ids.is_null(r) { "" } else { ids.value(r) };
                            match seed.and_then(|s| s.get(id)) {
                                Some((c, o)) => (c, o),
                                None => {
                                    return (None, None, Some(format!("instance_id {id:?} is not in the seed shards")))
                                }
                            }
                        }
                    };
                    match search_replace_reward(context, oracle, completions.value(r)) {
                        Ok(rw) => (Some(rw.reward), rw.format_error, None),
                        Err(e) => (None, None, Some(e.to_string())),
                    }
                })
                .collect()
        });
        let mut columns: Vec<ArrayRef> = kept.iter().map(|i| batch.column(*i).clone()).collect();
        for (reward, fe, err) in &results {
            summary.rows += 1;
            match reward {
                Some(v) => {
                    summary.scored += 1;
                    reward_sum += v;
                    if fe.is_some() {
                        summary.format_errors += 1;
                    }
                }
                None => {
                    debug_assert!(err.is_some());
                    summary.unscoreable += 1;
                }
            }
        }
        columns.push(Arc::new(Float64Array::from_iter(results.iter().map(|r| r.0))));
        columns.push(Arc::new(StringArray::from_iter(results.iter().map(|r| r.1.as_deref()))));
        columns.push(Arc::new(StringArray::from_iter(results.iter().map(|r| r.2.as_deref()))));
        writer.write(&RecordBatch::try_new(out_schema.clone(), columns)?)?;
    }
    writer.close()?;
    summary.mean_reward = (summary.scored > 0).then(|| reward_sum / summary.scored as f64);
    Ok(summary)
}
