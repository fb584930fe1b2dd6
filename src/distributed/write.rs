//! Executors write a job's output themselves.
//!
//! On Ballista a job's plan ends in [`LakeWriteExec`]: each task of the last stage writes its
//! partition's rows as Parquet files into the output table's place in the lake's store, as
//! the local engine's writer names and lays them out, and returns one row per file (path,
//! partition value, size, statistics). The client only commits those files, in one Delta
//! transaction. Before, every output row crossed to the client over Flight once the whole job
//! had finished, partition after partition, and was written there while the cluster idled.
//!
//! The plan reaches the scheduler as a logical plan: the node travels as
//! [`LakeWriteNode`] (encoded by the logical codec), the scheduler plans it with
//! [`planner`], and executors receive [`LakeWriteExec`] through the physical codec.

use std::any::Any;
use std::cmp::Ordering;
use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use arrow::array::{Array, AsArray, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DFSchema, DFSchemaRef, DataFusionError};
use datafusion::execution::context::QueryPlanner;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::{Expr, Extension, LogicalPlan, UserDefinedLogicalNode, UserDefinedLogicalNodeCore};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties};
use datafusion::physical_planner::{DefaultPhysicalPlanner, ExtensionPlanner, PhysicalPlanner};
use datafusion::prelude::DataFrame;
use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::ObjectStore;
use serde::{Deserialize, Serialize};
use url::Url;

use crate::lake::{conform_for_writer, writer_properties, Codec, ColumnStats, StagedFile, TableWriter};

/// What starts an encoded [`LakeWriteNode`] or [`LakeWriteExec`] (Ballista's own nodes are
/// protobuf messages, which never start with these bytes).
const MAGIC: &[u8] = b"\0swelake.lake_write.v1\0";

/// Where and how a job's output is written.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterWrite {
    /// The output table's root: `file:///…/table/` or `s3://bucket/prefix/table/`.
    pub table_url: String,
    /// The table's schema (the contract), as an Arrow IPC stream with no batches.
    pub schema_ipc: Vec<u8>,
    /// Its partition column, if any (not stored in the files; see [`TableWriter`]).
    pub partition: Option<String>,
    /// Files are named `{key}.{uuid}.parquet`, or after their partition value.
    pub key: String,
    pub key_by_partition: bool,
    /// Columns written with a large dictionary (`schema::repeated_columns`).
    pub repeated: Vec<String>,
}

impl ClusterWrite {
    pub fn new(
        table_url: &Url,
        schema: &Schema,
        partition: Option<&str>,
        key: &str,
        key_by_partition: bool,
        repeated: &[String],
    ) -> Result<ClusterWrite> {
        let mut schema_ipc = Vec::new();
        {
            let mut w = arrow::ipc::writer::StreamWriter::try_new(&mut schema_ipc, schema)?;
            w.finish()?;
        }
        Ok(ClusterWrite {
            table_url: table_url.to_string(),
            schema_ipc,
            partition: partition.map(str::to_string),
            key: key.to_string(),
            key_by_partition,
            repeated: repeated.to_vec(),
        })
    }

    fn schema(&self) -> Result<SchemaRef> {
        let reader = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(&self.schema_ipc), None)
            .context("the table schema of a write")?;
        Ok(reader.schema())
    }
}

/// One row per written file.
fn files_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("path", DataType::Utf8, false),
        Field::new("partition_value", DataType::Utf8, true),
        Field::new("size", DataType::Int64, false),
        Field::new("stats", DataType::Utf8, false),
    ]))
}

fn df_err(e: anyhow::Error) -> DataFusionError {
    DataFusionError::External(format!("{e:#}").into())
}

// ---------------------------------------------------------------------------------------
// The logical node.

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LakeWriteNode {
    input: LogicalPlan,
    /// The [`ClusterWrite`] as JSON: what the codecs carry.
    spec: String,
    schema: DFSchemaRef,
}

impl LakeWriteNode {
    fn new(input: LogicalPlan, spec: String) -> datafusion::common::Result<LakeWriteNode> {
        Ok(LakeWriteNode { input, spec, schema: Arc::new(DFSchema::try_from(files_schema().as_ref().clone())?) })
    }
}

impl PartialOrd for LakeWriteNode {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        match self.input.partial_cmp(&other.input) {
            Some(Ordering::Equal) => self.spec.partial_cmp(&other.spec),
            o => o,
        }
    }
}

impl UserDefinedLogicalNodeCore for LakeWriteNode {
    fn name(&self) -> &str {
        "LakeWrite"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }

    fn schema(&self) -> &DFSchemaRef {
        &self.schema
    }

    fn expressions(&self) -> Vec<Expr> {
        Vec::new()
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let url = serde_json::from_str::<ClusterWrite>(&self.spec).map(|s| s.table_url).unwrap_or_default();
        write!(f, "LakeWrite: {}", crate::lake::store::redact(&url))
    }

    fn with_exprs_and_inputs(
        &self,
        _exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> datafusion::common::Result<Self> {
        if inputs.len() != 1 {
            return Err(DataFusionError::Plan("LakeWrite has one input".into()));
        }
        LakeWriteNode::new(inputs.swap_remove(0), self.spec.clone())
    }
}

/// The logical codec's part: `Some` when `node` is a [`LakeWriteNode`].
pub(super) fn encode_node(node: &Extension, buf: &mut Vec<u8>) -> bool {
    match node.node.as_any().downcast_ref::<LakeWriteNode>() {
        Some(n) => {
            buf.extend_from_slice(MAGIC);
            buf.extend_from_slice(n.spec.as_bytes());
            true
        }
        None => false,
    }
}

pub(super) fn decode_node(buf: &[u8], inputs: &[LogicalPlan]) -> Option<datafusion::common::Result<Extension>> {
    let spec = buf.strip_prefix(MAGIC)?;
    Some((|| {
        let spec = std::str::from_utf8(spec).map_err(|e| DataFusionError::Internal(format!("LakeWrite spec: {e}")))?;
        let input = inputs.first().ok_or_else(|| DataFusionError::Internal("LakeWrite without input".into()))?;
        Ok(Extension { node: Arc::new(LakeWriteNode::new(input.clone(), spec.to_string())?) })
    })())
}

pub(super) fn encode_exec(node: &Arc<dyn ExecutionPlan>, buf: &mut Vec<u8>) -> bool {
    match (node.as_ref() as &dyn Any).downcast_ref::<LakeWriteExec>() {
        Some(e) => {
            buf.extend_from_slice(MAGIC);
            buf.extend_from_slice(e.spec_json.as_bytes());
            true
        }
        None => false,
    }
}

pub(super) fn decode_exec(
    buf: &[u8],
    inputs: &[Arc<dyn ExecutionPlan>],
) -> Option<datafusion::common::Result<Arc<dyn ExecutionPlan>>> {
    let spec = buf.strip_prefix(MAGIC)?;
    Some((|| {
        let spec = std::str::from_utf8(spec).map_err(|e| DataFusionError::Internal(format!("LakeWrite spec: {e}")))?;
        let input = inputs.first().ok_or_else(|| DataFusionError::Internal("LakeWriteExec without input".into()))?;
        Ok(Arc::new(LakeWriteExec::try_new(input.clone(), spec.to_string())?) as Arc<dyn ExecutionPlan>)
    })())
}

// ---------------------------------------------------------------------------------------
// Planning.

struct WritePlanner;

#[async_trait]
impl ExtensionPlanner for WritePlanner {
    async fn plan_extension(
        &self,
        _planner: &dyn PhysicalPlanner,
        node: &dyn UserDefinedLogicalNode,
        _logical_inputs: &[&LogicalPlan],
        physical_inputs: &[Arc<dyn ExecutionPlan>],
        _session: &dyn Session,
        _planning_ctx: &PhysicalPlanningContext,
    ) -> datafusion::common::Result<Option<Arc<dyn ExecutionPlan>>> {
        let Some(n) = node.as_any().downcast_ref::<LakeWriteNode>() else {
            return Ok(None);
        };
        let input =
            physical_inputs.first().ok_or_else(|| DataFusionError::Internal("LakeWrite without input".into()))?;
        Ok(Some(Arc::new(LakeWriteExec::try_new(input.clone(), n.spec.clone())?)))
    }
}

/// DataFusion's planner, which also plans [`LakeWriteNode`]s: the scheduler's.
#[derive(Debug)]
pub(super) struct Planner;

#[async_trait]
impl QueryPlanner for Planner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn Session,
    ) -> datafusion::common::Result<Arc<dyn ExecutionPlan>> {
        DefaultPhysicalPlanner::with_extension_planners(vec![Arc::new(WritePlanner)])
            .create_physical_plan(logical_plan, session)
            .await
    }
}

// ---------------------------------------------------------------------------------------
// Execution.

#[derive(Debug)]
pub struct LakeWriteExec {
    input: Arc<dyn ExecutionPlan>,
    spec_json: String,
    spec: ClusterWrite,
    target: SchemaRef,
    properties: Arc<PlanProperties>,
}

impl LakeWriteExec {
    fn try_new(input: Arc<dyn ExecutionPlan>, spec_json: String) -> datafusion::common::Result<LakeWriteExec> {
        let spec: ClusterWrite =
            serde_json::from_str(&spec_json).map_err(|e| DataFusionError::Internal(format!("LakeWrite spec: {e}")))?;
        let target = spec.schema().map_err(df_err)?;
        let properties = PlanProperties::new(
            EquivalenceProperties::new(files_schema()),
            Partitioning::UnknownPartitioning(input.properties().output_partitioning().partition_count()),
            EmissionType::Final,
            Boundedness::Bounded,
        );
        Ok(LakeWriteExec { input, spec_json, spec, target, properties: Arc::new(properties) })
    }
}

impl DisplayAs for LakeWriteExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "LakeWriteExec: {}", crate::lake::store::redact(&self.spec.table_url))
    }
}

impl ExecutionPlan for LakeWriteExec {
    fn name(&self) -> &str {
        "LakeWriteExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> datafusion::common::Result<TreeNodeRecursion>,
    ) -> datafusion::common::Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    // Each task writes the partition it is given; more partitions would only mean more files.
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> datafusion::common::Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return Err(DataFusionError::Internal("LakeWriteExec has one input".into()));
        }
        Ok(Arc::new(LakeWriteExec::try_new(children.swap_remove(0), self.spec_json.clone())?))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> datafusion::common::Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context.clone())?;
        let url = Url::parse(&self.spec.table_url).map_err(|e| DataFusionError::Internal(format!("table URL: {e}")))?;
        let root = datafusion::execution::object_store::ObjectStoreUrl::parse(format!(
            "{}://{}",
            url.scheme(),
            url.authority()
        ))?;
        let store = context.runtime_env().object_store(&root)?;
        let (spec, target) = (self.spec.clone(), self.target.clone());
        let stream =
            futures::stream::once(
                async move { write_partition(input, store, &url, &spec, &target).await.map_err(df_err) },
            );
        Ok(Box::pin(RecordBatchStreamAdapter::new(files_schema(), stream)))
    }
}

/// Writes one partition of the job's result: a file per partition value (named and laid out
/// as the local engine's writer does), uploaded into the store unless the lake is a local
/// directory. Returns a row per file.
async fn write_partition(
    mut input: SendableRecordBatchStream,
    store: Arc<dyn ObjectStore>,
    url: &Url,
    spec: &ClusterWrite,
    target: &SchemaRef,
) -> Result<RecordBatch> {
    let repeated: Vec<&str> = spec.repeated.iter().map(String::as_str).collect();
    let props = writer_properties(&[], &repeated, Codec::Zstd);
    let staging;
    let (dir, staged) = if url.scheme() == "file" {
        let dir: PathBuf =
            url.to_file_path().map_err(|_| anyhow::anyhow!("{url} is not a local directory on this executor"))?;
        (dir, false)
    } else {
        staging =
            tempfile::Builder::new().prefix("swelake-write-").tempdir().context("creating a staging directory")?;
        (staging.path().to_path_buf(), true)
    };
    let mut writer = TableWriter::in_dir(dir, staged, &spec.key, target, spec.partition.as_deref(), props)?;
    if spec.key_by_partition {
        writer = writer.keyed_by_partition();
    }
    while let Some(batch) = input.next().await {
        writer.write(&conform_for_writer(target, &batch?)?)?;
    }
    let files = writer.finish()?;
    let root = ObjectPath::from_url_path(url.path()).with_context(|| format!("the path of {url}"))?;
    for f in &files {
        if let Some(local) = &f.local {
            let path =
                f.rel_path.split('/').filter(|p| !p.is_empty()).fold(root.clone(), |p, part| p.clone().join(part));
            crate::lake::replace::put_file(store.as_ref(), &path, local)
                .await
                .with_context(|| format!("uploading {}", f.rel_path))?;
        }
    }
    let value = |f: &StagedFile| spec.partition.as_ref().and_then(|c| f.partition_values.get(c).cloned().flatten());
    Ok(RecordBatch::try_new(
        files_schema(),
        vec![
            Arc::new(files.iter().map(|f| Some(f.rel_path.clone())).collect::<StringArray>()),
            Arc::new(files.iter().map(value).collect::<StringArray>()),
            Arc::new(files.iter().map(|f| f.size).collect::<Int64Array>()),
            Arc::new(files.iter().map(|f| Some(f.stats.to_json(f.num_records))).collect::<StringArray>()),
        ],
    )?)
}

/// Runs `result` on the cluster with its output written by the executors as `spec` says:
/// the rows written and the files, ready to commit.
pub async fn write_on_cluster(result: DataFrame, spec: &ClusterWrite) -> Result<(u64, Vec<StagedFile>)> {
    let (state, plan) = result.into_parts();
    let node = LakeWriteNode::new(plan, serde_json::to_string(spec)?)?;
    let batches = DataFrame::new(state, LogicalPlan::Extension(Extension { node: Arc::new(node) })).collect().await?;
    let mut rows = 0u64;
    let mut files = Vec::new();
    for b in &batches {
        let path = b.column(0).as_string::<i32>();
        let value = b.column(1).as_string::<i32>();
        let size = b.column(2).as_primitive::<arrow::datatypes::Int64Type>();
        let stats = b.column(3).as_string::<i32>();
        for i in 0..b.num_rows() {
            let (num_records, column_stats) = ColumnStats::from_json(stats.value(i))?;
            let mut partition_values = HashMap::new();
            if let Some(c) = &spec.partition {
                partition_values.insert(c.clone(), (!value.is_null(i)).then(|| value.value(i).to_string()));
            }
            rows += num_records as u64;
            files.push(StagedFile {
                rel_path: path.value(i).to_string(),
                partition_values,
                size: size.value(i),
                num_records,
                stats: column_stats,
                local: None,
            });
        }
    }
    Ok((rows, files))
}
