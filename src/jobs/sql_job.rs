//! Running one SQL job: find the driving input's new or changed partitions, expose them as
//! `{input}_new`, run the job's SQL over the whole lake, write the result, record the
//! partitions in `_job_runs`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Field, Fields, Schema};
use datafusion::prelude::{DataFrame, SessionContext};
use deltalake::protocol::SaveMode;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::json;

use super::runs::{self, RunRecord};
use super::{JobSpec, JobSummary, Registry, RunOptions};
use crate::lake::{writer_properties, Codec, Lake, TableWriter};

/// How a job's result reaches its output table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WriteMode {
    /// The output is partitioned like the input; the rows of each processed partition
    /// replace that partition's files, in one commit.
    ReplacePartitions,
    /// Delta MERGE on `keys`: update matched rows (only by newer rows, with `newer_by`),
    /// insert the others.
    Upsert,
    /// Every row whose `keys` are in the `touched` query's result is replaced by the result
    /// rows for those keys (which may be none), in one commit.
    ReplaceKeys,
    /// The result replaces the whole table (for jobs with `partition_key = "*"`).
    Overwrite,
}

#[derive(Debug, Clone, Deserialize)]
pub struct WriteSpec {
    pub mode: WriteMode,
    #[serde(default)]
    pub keys: Vec<String>,
    #[serde(default)]
    pub newer_by: Option<String>,
    #[serde(default)]
    pub touched: Option<String>,
    /// Named single-number queries run after the write and reported (e.g. PRs whose merge
    /// state is unknown).
    #[serde(default)]
    pub report: BTreeMap<String, String>,
}

/// FNV-1a, stable across runs and versions (unlike std's hasher), for input fingerprints.
fn fnv1a(data: impl IntoIterator<Item = u8>, mut h: u64) -> u64 {
    for b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// For each partition value of `table`, a fingerprint of the files that hold it.
fn partition_fingerprints(table: &deltalake::DeltaTable, key: &str) -> Result<BTreeMap<String, String>> {
    let mut files: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in table.snapshot()?.log_data().iter() {
        let value = f.partition_values_map().get(key).cloned().flatten().unwrap_or_else(|| "__null__".to_string());
        files.entry(value).or_default().push(f.path().to_string());
    }
    Ok(files
        .into_iter()
        .map(|(k, mut paths)| {
            paths.sort();
            let h = paths.iter().fold(0xcbf29ce484222325u64, |h, p| fnv1a(p.bytes().chain([0]), h));
            (k, format!("{:016x}:{}", h, paths.len()))
        })
        .collect())
}

/// One fingerprint of the current files of `inputs` (those that exist) and of `extra`.
pub async fn inputs_fingerprint(lake: &Lake, inputs: &[String], extra: &str) -> Result<String> {
    let mut h = fnv1a(extra.bytes(), 0xcbf29ce484222325);
    for name in inputs {
        if lake.has_table(name) {
            let t = lake.open_table(name).await?;
            for (_, fp) in partition_fingerprints(&t, "__none__")? {
                h = fnv1a(name.bytes().chain(fp.bytes()), h);
            }
        }
    }
    Ok(format!("{h:016x}"))
}

/// Types that DataFusion produces for reading but Delta tables should store plainly.
fn storage_type(t: &DataType) -> DataType {
    match t {
        DataType::Utf8View | DataType::LargeUtf8 => DataType::Utf8,
        DataType::BinaryView | DataType::LargeBinary => DataType::Binary,
        DataType::List(f) | DataType::LargeList(f) | DataType::ListView(f) => {
            DataType::List(Arc::new(Field::new(f.name(), storage_type(f.data_type()), f.is_nullable())))
        }
        DataType::Struct(fields) => DataType::Struct(Fields::from(
            fields
                .iter()
                .map(|f| Field::new(f.name(), storage_type(f.data_type()), f.is_nullable()))
                .collect::<Vec<_>>(),
        )),
        DataType::Null => DataType::Utf8,
        other => other.clone(),
    }
}

/// Casts every column to its storage type, keeping names and order.
fn normalize(df: DataFrame) -> Result<DataFrame> {
    use datafusion::logical_expr::{cast, col};
    let exprs: Vec<_> = df
        .schema()
        .fields()
        .iter()
        .map(|f| {
            let c = col(datafusion::common::Column::from_name(f.name()));
            let t = storage_type(f.data_type());
            if &t == f.data_type() {
                c
            } else {
                cast(c, t).alias(f.name())
            }
        })
        .collect();
    Ok(df.select(exprs)?)
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// A scalar integer query.
async fn scalar(ctx: &SessionContext, sql: &str) -> Result<i64> {
    let batches = ctx.sql(sql).await?.collect().await?;
    let b = batches.first().context("query returned no batch")?;
    let v = arrow::compute::cast(b.column(0), &DataType::Int64)?;
    let v = v.as_primitive::<arrow::datatypes::Int64Type>();
    Ok(if v.is_empty() || v.is_null(0) { 0 } else { v.value(0) })
}

pub async fn run(lake: &Lake, registry: &Registry, job: &JobSpec, opts: &RunOptions) -> Result<JobSummary> {
    let mut summary = JobSummary { job: job.name.clone(), ..Default::default() };
    let input = job.driving_input.as_deref().context("no driving_input")?;
    let write = job.write.as_ref().context("no [write] section")?;
    let output = job.outputs.first().context("no output table")?;
    if !lake.has_table(input) {
        summary.skipped_reason = Some(format!("its input table `{input}` does not exist yet"));
        return Ok(summary);
    }
    let input_table = lake.open_table(input).await?;
    let pk = &job.partition_key;
    let config = match &opts.curation {
        Some(c) => c.clone(),
        None => crate::config::CurationConfig::load(None)?,
    };
    let parts = if pk == "*" {
        // The job reads its inputs as a whole: one "partition", fingerprinted by the files of
        // every input that exists and by the config.
        BTreeMap::from([("__all__".to_string(), inputs_fingerprint(lake, &job.inputs, &format!("{config:?}")).await?)])
    } else {
        partition_fingerprints(&input_table, pk)?
    };
    let done = runs::latest_ok(lake, &job.name).await?;
    let todo: Vec<(String, String)> = parts
        .into_iter()
        .filter(|(p, _)| opts.since.as_ref().is_none_or(|s| p >= s) && opts.until.as_ref().is_none_or(|u| p <= u))
        .filter(|(p, fp)| done.get(p).and_then(|r| r.detail.get("fingerprint")).and_then(|v| v.as_str()) != Some(fp))
        .collect();
    summary.partitions = todo.iter().map(|(p, _)| p.clone()).collect();

    let ctx = lake.session().await?;
    register_config(&ctx, &config)?;
    for name in &job.optional_inputs {
        if !lake.has_table(name) {
            let schema = crate::schema::builtin_arrow_schema(name)
                .with_context(|| format!("optional input `{name}` has no known schema"))?;
            let empty = datafusion::datasource::MemTable::try_new(schema, vec![vec![]])?;
            ctx.register_table(name.as_str(), Arc::new(empty))?;
        }
    }
    let last_run = done.values().map(|r| r.finished_at).max().unwrap_or(0);
    ctx.register_table(
        "job_last_run",
        ctx.sql(&format!("SELECT arrow_cast({last_run}, 'Timestamp(Microsecond, Some(\"UTC\"))') AS last_run_at"))
            .await?
            .into_view(),
    )?;
    let due_anyway = match &job.also_due_when {
        Some(q) if todo.is_empty() => scalar(&ctx, q).await.context("also_due_when")? > 0,
        _ => false,
    };
    if todo.is_empty() && !due_anyway {
        return Ok(summary);
    }
    let input_schema = input_table.snapshot()?.snapshot().arrow_schema();
    let literal = |v: &str| match input_schema.field_with_name(pk).map(|f| f.data_type().clone()) {
        Ok(DataType::Date32) => format!("DATE {}", quote(v)),
        _ => quote(v),
    };
    let list: Vec<String> = summary.partitions.iter().map(|p| literal(p)).collect();
    let filter = if pk == "*" {
        "true".to_string()
    } else if list.is_empty() {
        "false".to_string()
    } else {
        format!("{pk} IN ({})", list.join(", "))
    };
    let new_view = ctx.sql(&format!("SELECT * FROM {input} WHERE {filter}")).await?;
    ctx.register_table(format!("{input}_new").as_str(), new_view.into_view())?;

    let file = job.sql.as_deref().context("no sql file")?;
    let sql = registry.sql(file).with_context(|| format!("no SQL file {file}"))?;
    let result = normalize(ctx.sql(sql).await.with_context(|| format!("planning {file}"))?)?;
    let schema: Schema = result.schema().as_arrow().clone();

    let (rows, version) = match write.mode {
        WriteMode::ReplacePartitions => write_partitions(lake, output, result, pk, &summary.partitions).await?,
        WriteMode::Upsert => upsert(lake, output, result, &schema, write).await?,
        WriteMode::ReplaceKeys => replace_keys(lake, &ctx, output, result, &schema, write).await?,
        WriteMode::Overwrite => overwrite(lake, output, result, &schema).await?,
    };
    summary.rows_out = rows;

    let mut records: Vec<RunRecord> = todo
        .iter()
        .map(|(p, fp)| {
            RunRecord::ok(
                &job.name,
                p,
                0,
                rows,
                0,
                version,
                json!({"fingerprint": fp, "output": output, "rows_in_run": rows}),
            )
        })
        .collect();
    if due_anyway {
        // No input partition changed, but `also_due_when` held: record the run itself so
        // that `job_last_run` moves on.
        records.push(RunRecord::ok(&job.name, "__also_due", 0, rows, 0, version, json!({"output": output})));
        summary.notes.insert("run_because_also_due".into(), 1);
    }
    runs::record_all(lake, &records).await?;

    if !write.report.is_empty() {
        let ctx = lake.session().await?;
        for (name, q) in &write.report {
            for (k, v) in report(&ctx, q).await.with_context(|| format!("report `{name}`"))? {
                summary.notes.insert(if k.is_empty() { name.clone() } else { format!("{name}:{k}") }, v);
            }
        }
    }
    Ok(summary)
}

/// A report query: one number, or (label, number) rows.
async fn report(ctx: &SessionContext, sql: &str) -> Result<Vec<(String, i64)>> {
    let batches = ctx.sql(sql).await?.collect().await?;
    let mut out = Vec::new();
    for b in &batches {
        let (label, value) = match b.num_columns() {
            1 => (None, b.column(0)),
            _ => (Some(arrow::compute::cast(b.column(0), &DataType::Utf8)?), b.column(1)),
        };
        let v = arrow::compute::cast(value, &DataType::Int64)?;
        let v = v.as_primitive::<arrow::datatypes::Int64Type>();
        for r in 0..b.num_rows() {
            let k = label.as_ref().map_or(String::new(), |l| l.as_string::<i32>().value(r).to_string());
            out.push((k, if v.is_null(r) { 0 } else { v.value(r) }));
        }
    }
    if out.is_empty() {
        out.push((String::new(), 0));
    }
    Ok(out)
}

/// Makes the curation config visible to SQL: `config_filters` (one row of thresholds),
/// `config_decontaminate(repo)`, and the filter UDFs built from it.
fn register_config(ctx: &SessionContext, config: &crate::config::CurationConfig) -> Result<()> {
    use arrow::array::{BooleanArray, Int64Array, StringArray};
    let f = &config.filters;
    let thresholds = RecordBatch::try_from_iter(vec![
        ("min_files", Arc::new(Int64Array::from(vec![f.min_files])) as arrow::array::ArrayRef),
        ("max_files", Arc::new(Int64Array::from(vec![f.max_files]))),
        ("max_changed_lines", Arc::new(Int64Array::from(vec![f.max_changed_lines]))),
        ("min_issue_chars", Arc::new(Int64Array::from(vec![f.min_issue_chars]))),
        ("require_linked_issue", Arc::new(BooleanArray::from(vec![f.require_linked_issue]))),
    ])?;
    ctx.register_batch("config_filters", thresholds)?;
    let repos = RecordBatch::try_from_iter(vec![(
        "repo",
        Arc::new(StringArray::from_iter_values(f.decontaminate.iter())) as arrow::array::ArrayRef,
    )])?;
    ctx.register_batch("config_decontaminate", repos)?;
    let predicates = Arc::new(crate::filters::Predicates::new(f)?);
    for u in crate::filters::udf::filter_udfs(predicates) {
        ctx.register_udf(u);
    }
    Ok(())
}

/// Replaces the whole output table with the result.
async fn overwrite(lake: &Lake, output: &str, result: DataFrame, schema: &Schema) -> Result<(u64, Option<i64>)> {
    let batches: Vec<RecordBatch> = result.collect().await?;
    let rows = batches.iter().map(|b| b.num_rows() as u64).sum();
    Ok((rows, rewrite(lake, output, schema, batches).await?))
}

/// Writes `batches` as the whole content of `output`, re-tagged with `schema` (same columns and
/// storage types, the declared names and nullability). Returns the new table version.
async fn rewrite(lake: &Lake, output: &str, schema: &Schema, batches: Vec<RecordBatch>) -> Result<Option<i64>> {
    let schema = Arc::new(schema.clone());
    let batches: Vec<RecordBatch> = batches
        .into_iter()
        .map(|b| RecordBatch::try_new(schema.clone(), b.columns().to_vec()))
        .collect::<Result<_, _>>()?;
    let table = lake.ensure_table(output, &schema, &[]).await?;
    let table = table
        .write(batches)
        .with_save_mode(SaveMode::Overwrite)
        .await
        .with_context(|| format!("rewriting `{output}`"))?;
    Ok(table.version().map(|v| v as i64))
}

/// Replaces the output's files of each processed partition with the result's rows.
async fn write_partitions(
    lake: &Lake,
    output: &str,
    result: DataFrame,
    pk: &str,
    parts: &[String],
) -> Result<(u64, Option<i64>)> {
    let schema: Schema = result.schema().as_arrow().clone();
    if schema.index_of(pk).is_err() {
        bail!("the SQL result has no partition column `{pk}`");
    }
    let mut table = lake.ensure_table(output, &schema, &[pk]).await?;
    let mut writer = TableWriter::new(lake, output, "", &schema, Some(pk), writer_properties(&[], &[], Codec::Zstd))?
        .keyed_by_partition();
    let mut stream = result.execute_stream().await?;
    let mut rows = 0u64;
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        rows += batch.num_rows() as u64;
        writer.write(&batch)?;
    }
    let files = writer.finish()?;
    let version =
        lake.replace_keys(&mut table, parts, files, format!("{pk} IN (processed partitions)"), HashMap::new()).await?;
    Ok((rows, version))
}

/// Delta MERGE of the result into the output on the key columns.
async fn upsert(
    lake: &Lake,
    output: &str,
    result: DataFrame,
    schema: &Schema,
    write: &WriteSpec,
) -> Result<(u64, Option<i64>)> {
    let rows = result.clone().count().await? as u64;
    if rows == 0 {
        return Ok((0, None));
    }
    let version = lake.upsert(output, result, schema, &write.keys, write.newer_by.as_deref()).await?;
    Ok((rows, version))
}

/// Rewrites the output with the rows of touched keys replaced by the result's rows.
async fn replace_keys(
    lake: &Lake,
    ctx: &SessionContext,
    output: &str,
    result: DataFrame,
    schema: &Schema,
    write: &WriteSpec,
) -> Result<(u64, Option<i64>)> {
    let touched_sql = write.touched.as_deref().context("replace_keys needs a `touched` query")?;
    if write.keys.is_empty() {
        bail!("replace_keys needs `keys`");
    }
    let new_rows: Vec<RecordBatch> = result.collect().await?;
    let rows = new_rows.iter().map(|b| b.num_rows() as u64).sum();
    let mut batches = new_rows;
    if lake.has_table(output) {
        ctx.register_table("__touched", ctx.sql(touched_sql).await?.into_view())?;
        let on = write.keys.iter().map(|k| format!("o.{k} = t.{k}")).collect::<Vec<_>>().join(" AND ");
        let cols = schema.fields().iter().map(|f| format!("o.{}", f.name())).collect::<Vec<_>>().join(", ");
        let kept = ctx
            .sql(&format!("SELECT {cols} FROM {output} o WHERE NOT EXISTS (SELECT 1 FROM __touched t WHERE {on})"))
            .await?;
        batches.extend(normalize(kept)?.collect().await?);
    }
    Ok((rows, rewrite(lake, output, schema, batches).await?))
}
