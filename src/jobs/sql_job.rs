//! Running one SQL job: find the driving input's new or changed partitions, expose them as
//! `{input}_new`, run the job's SQL over the whole lake, write the result, record the
//! partitions in `_job_runs`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Fields, Schema};
use datafusion::prelude::{DataFrame, SessionContext};
use deltalake::protocol::SaveMode;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::json;

use super::{JobSpec, JobSummary, Partitioning, Registry, RunOptions, Step};
use crate::distributed::{write_on_cluster, ClusterWrite, Engine};
use crate::lake::runs::{self, RunRecord, ALSO_DUE, WHOLE};
use crate::lake::{writer_properties, Codec, Lake, TableWriter};

/// An SQL job: its file, the input whose partitions drive it, and how its result is written.
#[derive(Debug, Clone)]
pub struct SqlStep {
    pub file: String,
    pub driving_input: String,
    pub write: WriteSpec,
    /// A count query; when it is positive the job runs even without new partitions (e.g.
    /// PRs snapshotted since the job's last run). It can read `job_last_run(last_run_at)`.
    pub also_due_when: Option<String>,
    /// DataFusion settings (`datafusion.…` keys) for this job on the local engine: plan
    /// choices that suit one query and not the others, measured per job.
    pub local_settings: BTreeMap<String, String>,
}

/// How a job's result reaches its output table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WriteMode {
    /// The output is partitioned like the input; the rows of each processed partition
    /// replace that partition's files, in one commit.
    ReplacePartitions,
    /// Upsert on `keys` (what a Delta MERGE gives, through `Lake::upsert_rows`): matched rows
    /// are replaced (only by newer rows, with `newer_by`), the others inserted.
    Upsert,
    /// Every row whose `keys` are in the `touched` query's result is replaced by the result
    /// rows for those keys (which may be none), in one commit.
    ReplaceKeys,
    /// The result replaces the whole table (for jobs with `partition_key = "*"`).
    Overwrite,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
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

/// For each partition value of `table`, a fingerprint of the files that hold it.
pub(super) fn partition_fingerprints(table: &deltalake::DeltaTable, key: &str) -> Result<BTreeMap<String, String>> {
    let mut files: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in table.snapshot()?.log_data().iter() {
        let value = f.partition_values_map().get(key).cloned().flatten().unwrap_or_else(|| "__null__".to_string());
        files.entry(value).or_default().push(f.path().to_string());
    }
    Ok(files
        .into_iter()
        .map(|(k, mut paths)| {
            paths.sort();
            let h = paths.iter().fold(crate::hash::OFFSET, |h, p| crate::hash::fnv1a(p.bytes().chain([0]), h));
            (k, format!("{:016x}:{}", h, paths.len()))
        })
        .collect())
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

/// Casts every column to its storage type, keeping names and order; string and binary views
/// stay views, which the writer stores as their plain types ([`crate::lake::written_as`]).
fn normalize(df: DataFrame) -> Result<DataFrame> {
    use datafusion::logical_expr::{cast, col};
    let exprs: Vec<_> = df
        .schema()
        .fields()
        .iter()
        .map(|f| {
            let c = col(datafusion::common::Column::from_name(f.name()));
            let t = storage_type(f.data_type());
            if crate::lake::written_as(f.data_type(), &t) {
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

/// A scalar integer query (NULL, or no row, counts as 0).
async fn scalar(ctx: &SessionContext, sql: &str) -> Result<i64> {
    let v: Vec<Option<i64>> = crate::query::rows(ctx, sql).await?;
    Ok(v.into_iter().next().flatten().unwrap_or(0))
}

pub async fn run(
    lake: &Lake,
    registry: &Registry,
    job: &JobSpec,
    step: &SqlStep,
    opts: &RunOptions,
) -> Result<JobSummary> {
    let mut summary = JobSummary { job: job.name.clone(), ..Default::default() };
    let input = step.driving_input.as_str();
    let input_table = if lake.has_table(input).await? {
        Some(lake.open_table(input).await?)
    } else if job.optional_inputs.iter().any(|o| o == input) {
        // A lake without this input (PRs from git alone, no archive): no partitions, and the
        // job runs when `also_due_when` says so.
        None
    } else {
        summary.skipped_reason = Some(format!("its input table `{input}` does not exist yet"));
        return Ok(summary);
    };
    let parts = match (&job.partitioning, &input_table) {
        // The job reads its inputs as a whole: one "partition", fingerprinted by the files of
        // every input that exists and by the config section it reads.
        (Partitioning::Whole, _) => {
            BTreeMap::from([(WHOLE.to_string(), super::whole_fingerprint(lake, job, opts).await?)])
        }
        (Partitioning::Column(pk), Some(t)) => partition_fingerprints(t, pk)?,
        (Partitioning::Column(_), None) => BTreeMap::new(),
    };
    let done = runs::latest_ok(lake, &job.name).await?;
    let todo: Vec<(String, String)> = parts
        .into_iter()
        .filter(|(p, _)| opts.since.as_ref().is_none_or(|s| p >= s) && opts.until.as_ref().is_none_or(|u| p <= u))
        .filter(|(p, fp)| done.get(p).and_then(|r| r.detail.get("fingerprint")).and_then(|v| v.as_str()) != Some(fp))
        .collect();
    summary.partitions = todo.iter().map(|(p, _)| p.clone()).collect();

    let ctx = session(lake, job, opts).await?;
    if let (Engine::Local, Some(t)) = (&opts.engine, &input_table) {
        // The snapshot the partitions were found in is the one the job reads: opened once, not
        // again by the session (a log replay per open).
        t.update_datafusion_session(&ctx.state())?;
        let provider = t.table_provider().await.with_context(|| format!("reading table `{input}`"))?;
        ctx.register_table(input, provider)?;
    }
    let last_run = done.values().map(|r| r.finished_at).max().unwrap_or(0);
    ctx.register_table(
        "job_last_run",
        ctx.sql(&format!("SELECT arrow_cast({last_run}, 'Timestamp(Microsecond, Some(\"UTC\"))') AS last_run_at"))
            .await?
            .into_view(),
    )?;
    let due_anyway = match &step.also_due_when {
        Some(q) if todo.is_empty() => scalar(&ctx, q).await.context("also_due_when")? > 0,
        _ => false,
    };
    if todo.is_empty() && !due_anyway {
        return Ok(summary);
    }
    // Another run of this job may be on the same partitions: hold them, then look again at
    // what is done (the run this one waited for may have done some).
    let keys = if todo.is_empty() { vec![ALSO_DUE.to_string()] } else { summary.partitions.clone() };
    lake.with_leases(&job.name, &keys, opts.lease_wait, async {
        let done = runs::latest_ok(lake, &job.name).await?;
        let todo: Vec<(String, String)> = todo
            .into_iter()
            .filter(|(p, fp)| {
                done.get(p).and_then(|r| r.detail.get("fingerprint")).and_then(|v| v.as_str()) != Some(fp)
            })
            .collect();
        summary.partitions = todo.iter().map(|(p, _)| p.clone()).collect();
        if todo.is_empty() && !due_anyway {
            return Ok(summary);
        }
        run_held(lake, registry, job, step, &ctx, opts, input_table.as_ref(), todo, due_anyway, summary).await
    })
    .await
}

/// A session over the lake for `job`'s SQL, on the engine of `opts`, with every SQL function
/// and the job's config section.
async fn session(lake: &Lake, job: &JobSpec, opts: &RunOptions) -> Result<SessionContext> {
    let optional: Vec<&str> = job.optional_inputs.iter().map(String::as_str).collect();
    let ctx = match &opts.engine {
        crate::distributed::Engine::Local => {
            let ctx = lake.session_with(&optional).await?;
            crate::udfs::register_all(&ctx);
            ctx
        }
        crate::distributed::Engine::Ballista { scheduler } => {
            crate::distributed::session(lake, scheduler, &optional).await?
        }
    };
    // Every join in sql/ is written with its small side first, which DataFusion makes the
    // build (hashed, held) side. Its statistics-driven swapping can only guess at the size of
    // a CTE or an aggregate, and on a lake of two days it swapped pr_timeline's join to hold
    // the day's 2.5M pushes instead of the PR heads (5.6 GB): locally, the order is the SQL's.
    // Not on Ballista: with the swapping off, its 55 scheduler rejected the executors' task
    // statuses (operator metrics of different lengths) and pull_requests never finished.
    if opts.engine == crate::distributed::Engine::Local {
        ctx.state_ref().write().config_mut().options_mut().optimizer.join_reordering = false;
        if let Step::Sql(step) = &job.step {
            let state = ctx.state_ref();
            let mut state = state.write();
            for (key, value) in &step.local_settings {
                state
                    .config_mut()
                    .options_mut()
                    .set(key, value)
                    .with_context(|| format!("job `{}`: local_settings {key} = {value:?}", job.name))?;
            }
        }
    }
    if job.config.as_deref() == Some("filters") {
        crate::filters::register_sql(&ctx, &opts.curation.filters).await?;
    }
    Ok(ctx)
}

/// The rest of [`run`], with the leases of `todo` held.
#[allow(clippy::too_many_arguments)]
async fn run_held(
    lake: &Lake,
    registry: &Registry,
    job: &JobSpec,
    step: &SqlStep,
    ctx: &SessionContext,
    opts: &RunOptions,
    input_table: Option<&deltalake::DeltaTable>,
    todo: Vec<(String, String)>,
    due_anyway: bool,
    mut summary: JobSummary,
) -> Result<JobSummary> {
    let input = step.driving_input.as_str();
    let write = &step.write;
    let output = job.outputs.first().context("no output table")?;
    let filter = match &job.partitioning {
        Partitioning::Whole => "true".to_string(),
        Partitioning::Column(_) if summary.partitions.is_empty() => "false".to_string(),
        Partitioning::Column(pk) => {
            let input_table = input_table.context("partitions of an input that does not exist")?;
            let input_schema = input_table.snapshot()?.snapshot().arrow_schema();
            let date = matches!(input_schema.field_with_name(pk).map(|f| f.data_type()), Ok(DataType::Date32));
            let list: Vec<String> =
                summary.partitions.iter().map(|p| if date { format!("DATE {}", quote(p)) } else { quote(p) }).collect();
            format!("{pk} IN ({})", list.join(", "))
        }
    };
    let new_view = ctx.sql(&format!("SELECT * FROM {input} WHERE {filter}")).await?;
    ctx.register_table(format!("{input}_new").as_str(), new_view.into_view())?;

    let started = std::time::Instant::now();
    let file = step.file.as_str();
    let sql = registry.sql(file).with_context(|| format!("no SQL file {file}"))?;
    let result = normalize(ctx.sql(sql).await.with_context(|| format!("planning {file}"))?)?;
    let target = Target::of(output, result.schema().as_arrow(), file)?;

    let (rows, version) = match write.mode {
        WriteMode::ReplacePartitions => match &job.partitioning {
            Partitioning::Column(pk) => {
                write_partitions(lake, &opts.engine, output, result, &target, pk, &summary.partitions).await?
            }
            Partitioning::Whole => bail!("write mode replace_partitions needs a partition_key column"),
        },
        WriteMode::Upsert => {
            // The new rows' files are named after the first partition this run processed.
            let file_key = summary.partitions.first().map_or(ALSO_DUE, String::as_str).to_string();
            upsert(lake, output, result, &target, write, &file_key).await?
        }
        WriteMode::ReplaceKeys => replace_keys(lake, ctx, output, result, &target, write).await?,
        WriteMode::Overwrite => overwrite(lake, &opts.engine, output, result, &target).await?,
    };
    summary.rows_out = rows;
    tracing::debug!(job = %job.name, rows, seconds = started.elapsed().as_secs_f64(), "computed, written and committed");

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
        records.push(RunRecord::ok(&job.name, ALSO_DUE, 0, rows, 0, version, json!({"output": output})));
        summary.notes.insert("run_because_also_due".into(), 1);
        summary.partitions.push(ALSO_DUE.into());
    }
    runs::record_all(lake, &records).await?;
    tracing::debug!(job = %job.name, seconds = started.elapsed().as_secs_f64(), "run recorded");

    if !write.report.is_empty() {
        // Over the lake as this run left it, on the same engine; run together, as each is a
        // small scan of the output (the session opens it once for all of them).
        let ctx = session(lake, job, opts).await?;
        let answers = futures::future::join_all(write.report.iter().map(|(name, q)| {
            let ctx = &ctx;
            async move { report(ctx, q).await.with_context(|| format!("report `{name}`")).map(|rows| (name, rows)) }
        }))
        .await;
        for answer in answers {
            let (name, rows) = answer?;
            for (k, v) in rows {
                summary.notes.insert(if k.is_empty() { name.clone() } else { format!("{name}:{k}") }, v);
            }
        }
        tracing::debug!(job = %job.name, seconds = started.elapsed().as_secs_f64(), "reported");
    }
    Ok(summary)
}

/// A report query: one number, or (label, number) rows. A NULL number counts as 0 (a sum over
/// no rows); a NULL label reads as "NULL".
async fn report(ctx: &SessionContext, sql: &str) -> Result<Vec<(String, i64)>> {
    let batches = ctx.sql(sql).await?.collect().await?;
    let mut out: Vec<(String, i64)> = match batches.first().map(|b| b.num_columns()) {
        Some(1) => crate::query::from_batches::<Option<i64>>(&batches)?
            .into_iter()
            .map(|v| (String::new(), v.unwrap_or(0)))
            .collect(),
        Some(_) => crate::query::from_batches::<(Option<String>, Option<i64>)>(&batches)?
            .into_iter()
            .map(|(k, v)| (k.unwrap_or_else(|| "NULL".into()), v.unwrap_or(0)))
            .collect(),
        None => Vec::new(),
    };
    if out.is_empty() {
        out.push((String::new(), 0));
    }
    Ok(out)
}

/// The layout a job's result is written in: its output's schema file (the table contract)
/// when it has one, else the query's own.
struct Target {
    schema: Arc<Schema>,
    /// Columns the schema file marks as repeating text.
    repeated: Vec<String>,
}

impl Target {
    fn of(output: &str, result: &Schema, file: &str) -> Result<Target> {
        let Ok(contract) = crate::schema::arrow(output) else {
            let fields: Vec<Field> = result
                .fields()
                .iter()
                .map(|f| f.as_ref().clone().with_data_type(storage_type(f.data_type())))
                .collect();
            return Ok(Target { schema: Arc::new(Schema::new(fields)), repeated: Vec::new() });
        };
        let want: Vec<&str> = contract.fields().iter().map(|f| f.name().as_str()).collect();
        let have: Vec<&str> = result.fields().iter().map(|f| f.name().as_str()).collect();
        if want != have {
            bail!("{file} returns the columns {have:?}, but schemas/{output}.toml declares {want:?}");
        }
        Ok(Target { schema: contract, repeated: crate::schema::repeated_columns(output) })
    }

    /// Parquet settings of the output files: each PR event of `pr_timeline` carries its PR's
    /// title and body, and as dictionary entries they are stored once per row group
    /// (`swelake bench jobs`: a 4x smaller file, written and read faster).
    fn writer_properties(&self) -> parquet::file::properties::WriterProperties {
        let repeated: Vec<&str> = self.repeated.iter().map(String::as_str).collect();
        writer_properties(&[], &repeated, Codec::Zstd)
    }

    /// `batch` in the target layout: columns cast where the query's type differs (a time zone
    /// spelled differently), nullability the contract's — a NULL in a non-nullable column
    /// (a key) is an error, not a row.
    fn conform(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        crate::lake::conform(&self.schema, batch)
    }

    /// [`Target::conform`] for a [`TableWriter`], which writes string views as they are.
    fn conform_for_writer(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        crate::lake::conform_for_writer(&self.schema, batch)
    }
}

/// Streams the result, in the target layout, into `writer`: the rows written and their files.
async fn stream_into(
    mut writer: TableWriter,
    result: DataFrame,
    target: &Target,
) -> Result<(u64, Vec<crate::lake::StagedFile>)> {
    let mut stream = result.execute_stream().await?;
    let mut rows = 0u64;
    while let Some(batch) = stream.next().await {
        let batch = target.conform_for_writer(&batch?)?;
        rows += batch.num_rows() as u64;
        writer.write(&batch)?;
    }
    Ok((rows, writer.finish()?))
}

/// Replaces the whole output table with the result, streamed into staged files (a job over
/// its inputs as a whole never holds its whole result).
async fn overwrite(
    lake: &Lake,
    engine: &Engine,
    output: &str,
    result: DataFrame,
    target: &Target,
) -> Result<(u64, Option<i64>)> {
    let schema = target.schema.clone();
    let mut table = lake.ensure_table(output, &schema, &[]).await?;
    let (rows, files) = match engine {
        Engine::Local => {
            let writer = TableWriter::new(lake, output, WHOLE, &schema, None, target.writer_properties())?;
            stream_into(writer, result, target).await?
        }
        Engine::Ballista { .. } => {
            let spec = ClusterWrite::new(&lake.table_url(output), &schema, None, WHOLE, false, &target.repeated)?;
            write_on_cluster(result, &spec).await?
        }
    };
    Ok((rows, lake.replace_all(&mut table, files, HashMap::new()).await?))
}

/// Writes `batches` as the whole content of `output`, in the target layout. Returns the new
/// table version.
async fn rewrite(lake: &Lake, output: &str, target: &Target, batches: Vec<RecordBatch>) -> Result<Option<i64>> {
    let batches: Vec<RecordBatch> = batches.iter().map(|b| target.conform(b)).collect::<Result<_>>()?;
    let mut table = lake.ensure_table(output, &target.schema, &[]).await?;
    if batches.iter().all(|b| b.num_rows() == 0) {
        // No rows is an answer too (a lake with no PR that names an issue): the table is
        // emptied by a commit of its own, where deltalake's write would refuse to write nothing.
        return lake.replace_all(&mut table, Vec::new(), HashMap::new()).await;
    }
    crate::lake::failpoint(&format!("commit.before:{output}"));
    let table = table
        .write(batches)
        .with_save_mode(SaveMode::Overwrite)
        .await
        .with_context(|| format!("rewriting `{output}`"))?;
    crate::lake::failpoint(&format!("commit.after:{output}"));
    Ok(table.version().map(|v| v as i64))
}

/// Replaces the output's files of each processed partition with the result's rows.
async fn write_partitions(
    lake: &Lake,
    engine: &Engine,
    output: &str,
    result: DataFrame,
    target: &Target,
    pk: &str,
    parts: &[String],
) -> Result<(u64, Option<i64>)> {
    let schema = target.schema.clone();
    if schema.index_of(pk).is_err() {
        bail!("the SQL result has no partition column `{pk}`");
    }
    let mut table = lake.ensure_table(output, &schema, &[pk]).await?;
    let (rows, files) = match engine {
        Engine::Local => {
            let writer =
                TableWriter::new(lake, output, "", &schema, Some(pk), target.writer_properties())?.keyed_by_partition();
            stream_into(writer, result, target).await?
        }
        // The executors write the files into the lake's store; only their list comes back.
        Engine::Ballista { .. } => {
            let spec = ClusterWrite::new(&lake.table_url(output), &schema, Some(pk), "", true, &target.repeated)?;
            write_on_cluster(result, &spec).await?
        }
    };
    let version =
        lake.replace_keys(&mut table, parts, files, format!("{pk} IN (processed partitions)"), HashMap::new()).await?;
    Ok((rows, version))
}

/// Upserts the result into the output on the key columns, rewriting only the files that hold
/// replaced keys (see `lake::upsert`): a Delta MERGE would rewrite the whole table each day.
async fn upsert(
    lake: &Lake,
    output: &str,
    result: DataFrame,
    target: &Target,
    write: &WriteSpec,
    file_key: &str,
) -> Result<(u64, Option<i64>)> {
    // The rows arrive as DataFusion's Arrow batches, never as Rust rows: they are conformed
    // to the table's schema (Target::conform_for_writer), not built by `lake::rows::to_batch`.
    // String views stay views as far as the writer (upsert_rows conforms them for it).
    let batches: Vec<RecordBatch> =
        result.collect().await?.iter().map(|b| target.conform_for_writer(b)).collect::<Result<_>>()?;
    let rows: u64 = batches.iter().map(|b| b.num_rows() as u64).sum();
    tracing::debug!(output, rows, "computed the rows to upsert");
    if rows == 0 {
        return Ok((0, None));
    }
    // The upsert runs here, whatever engine computed the rows: the output is a Delta table.
    let version =
        lake.upsert_rows(output, &target.schema, &batches, &write.keys, write.newer_by.as_deref(), file_key).await?;
    Ok((rows, version))
}

/// Rewrites the output with the rows of touched keys replaced by the result's rows.
async fn replace_keys(
    lake: &Lake,
    ctx: &SessionContext,
    output: &str,
    result: DataFrame,
    target: &Target,
    write: &WriteSpec,
) -> Result<(u64, Option<i64>)> {
    let touched_sql = write.touched.as_deref().context("replace_keys needs a `touched` query")?;
    if write.keys.is_empty() {
        bail!("replace_keys needs `keys`");
    }
    let new_rows: Vec<RecordBatch> = result.collect().await?;
    let rows = new_rows.iter().map(|b| b.num_rows() as u64).sum();
    let mut batches = new_rows;
    if lake.has_table(output).await? {
        ctx.register_table("__touched", ctx.sql(touched_sql).await?.into_view())?;
        let on = write.keys.iter().map(|k| format!("o.{k} = t.{k}")).collect::<Vec<_>>().join(" AND ");
        let cols = target.schema.fields().iter().map(|f| format!("o.{}", f.name())).collect::<Vec<_>>().join(", ");
        let kept = ctx
            .sql(&format!("SELECT {cols} FROM {output} o WHERE NOT EXISTS (SELECT 1 FROM __touched t WHERE {on})"))
            .await?;
        batches.extend(normalize(kept)?.collect().await?);
    }
    Ok((rows, rewrite(lake, output, target, batches).await?))
}
