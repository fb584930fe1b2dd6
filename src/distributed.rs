//! The SQL jobs on an Apache DataFusion Ballista cluster.
//!
//! A cluster is a scheduler and executors started from this binary (`swelake ballista
//! scheduler|executor`), so that every process knows swelake's SQL functions. A job's client
//! (`swelake run … --engine ballista --scheduler df://HOST:PORT`) plans the job's own SQL,
//! ships the plan to the scheduler and commits the result to the lake exactly as the local
//! engine does: jobs that replace partitions or overwrite have the executors write the files
//! (see `write`), the others stream their rows back.
//!
//! What is Ballista-specific:
//! - Ballista has no Delta table provider, so each table is registered as a Parquet listing of
//!   exactly the files of the Delta version the client read (partition values put back as
//!   literals), and every executor reads that one snapshot whatever commits land meanwhile.
//! - Functions built from the job's config (the filter predicates) carry that config inside the
//!   plan (`filters::udf::encode`); the others are found by name.
//! - Plans cannot carry in-memory tables or empty relations with columns (the wire format
//!   drops an empty relation's schema), and a scan of no files stalls a Ballista 55 union, so
//!   a table with no rows yet is a filtered VALUES row and config tables are views over
//!   literals.

use std::collections::BTreeMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use arrow::datatypes::{Schema, SchemaRef};
use ballista::prelude::SessionContextExt;
use ballista_core::extension::SessionConfigExt;
use ballista_core::registry::BallistaFunctionRegistry;
use ballista_core::serde::{BallistaLogicalExtensionCodec, BallistaPhysicalExtensionCodec};
use datafusion::common::{DataFusionError, ScalarValue, TableReference};
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl};
use datafusion::execution::object_store::{DefaultObjectStoreRegistry, ObjectStoreRegistry};
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::execution::{SessionState, SessionStateBuilder, TaskContext};
use datafusion::logical_expr::{col, lit, AggregateUDF, Expr, ScalarUDF};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_proto::logical_plan::LogicalExtensionCodec;
use datafusion_proto::physical_plan::PhysicalExtensionCodec;
use object_store::ObjectStore;
use url::Url;

use crate::lake::Lake;

mod write;
pub use write::{write_on_cluster, ClusterWrite};

/// Where a job's SQL runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Engine {
    /// DataFusion in this process, over the Delta tables.
    #[default]
    Local,
    /// A Ballista cluster, by its scheduler's address (`df://HOST:PORT`).
    Ballista { scheduler: String },
}

impl Engine {
    pub fn describe(&self) -> String {
        match self {
            Engine::Local => "local".into(),
            Engine::Ballista { scheduler } => format!("ballista at {scheduler}"),
        }
    }
}

/// `df://host:port`, `host:port` → `df://host:port`, with a clear error for anything else.
pub fn scheduler_url(s: &str) -> Result<String> {
    let rest = s.strip_prefix("df://").unwrap_or(s);
    let (host, port) = rest.rsplit_once(':').with_context(|| format!("--scheduler `{s}`: expected df://HOST:PORT"))?;
    if host.is_empty() || port.parse::<u16>().is_err() {
        bail!("--scheduler `{s}`: expected df://HOST:PORT");
    }
    Ok(format!("df://{host}:{port}"))
}

fn socket_addr(s: &str, what: &str) -> Result<SocketAddr> {
    s.to_socket_addrs()
        .with_context(|| format!("{what} `{s}`: expected HOST:PORT"))?
        .next()
        .with_context(|| format!("{what} `{s}` resolves to no address"))
}

// ---------------------------------------------------------------------------------------
// Codecs: Ballista's own, plus the functions that carry their config.

fn udf_error(e: anyhow::Error) -> DataFusionError {
    DataFusionError::Plan(format!("{e:#}"))
}

fn encode_udf(node: &ScalarUDF, buf: &mut Vec<u8>) {
    if let Some(bytes) = crate::filters::udf::encode(node) {
        buf.extend(bytes);
    }
}

fn decode_udf(name: &str, buf: &[u8]) -> datafusion::common::Result<Arc<ScalarUDF>> {
    if buf.is_empty() {
        // A function known by name only: swelake's (every process registers the same set) or
        // one of DataFusion's own that Ballista's registry leaves out (`array_compact`).
        return crate::udfs::all()
            .into_iter()
            .map(Arc::new)
            .chain(datafusion::functions::all_default_functions())
            .chain(datafusion::functions_nested::all_default_nested_functions())
            .find(|f| f.name() == name || f.aliases().iter().any(|a| a == name))
            .ok_or_else(|| DataFusionError::Plan(format!("no SQL function `{name}` in this swelake")));
    }
    crate::filters::udf::decode(name, buf).map(Arc::new).map_err(udf_error)
}

fn decode_udaf(name: &str) -> datafusion::common::Result<Arc<AggregateUDF>> {
    crate::udfs::aggregates()
        .into_iter()
        .map(Arc::new)
        .chain(datafusion::functions_aggregate::all_default_aggregate_functions())
        .find(|f| f.name() == name || f.aliases().iter().any(|a| a == name))
        .ok_or_else(|| DataFusionError::Plan(format!("no SQL aggregate function `{name}` in this swelake")))
}

#[derive(Debug, Default)]
pub struct LogicalCodec {
    inner: BallistaLogicalExtensionCodec,
}

impl LogicalExtensionCodec for LogicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[datafusion::logical_expr::LogicalPlan],
        ctx: &TaskContext,
    ) -> datafusion::common::Result<datafusion::logical_expr::Extension> {
        match write::decode_node(buf, inputs) {
            Some(node) => node,
            None => self.inner.try_decode(buf, inputs, ctx),
        }
    }

    fn try_encode(
        &self,
        node: &datafusion::logical_expr::Extension,
        buf: &mut Vec<u8>,
    ) -> datafusion::common::Result<()> {
        if write::encode_node(node, buf) {
            return Ok(());
        }
        self.inner.try_encode(node, buf)
    }

    fn try_decode_table_provider(
        &self,
        buf: &[u8],
        table_ref: &TableReference,
        schema: SchemaRef,
        ctx: &TaskContext,
    ) -> datafusion::common::Result<Arc<dyn datafusion::catalog::TableProvider>> {
        self.inner.try_decode_table_provider(buf, table_ref, schema, ctx)
    }

    fn try_encode_table_provider(
        &self,
        table_ref: &TableReference,
        node: Arc<dyn datafusion::catalog::TableProvider>,
        buf: &mut Vec<u8>,
    ) -> datafusion::common::Result<()> {
        self.inner.try_encode_table_provider(table_ref, node, buf)
    }

    fn try_decode_file_format(
        &self,
        buf: &[u8],
        ctx: &TaskContext,
    ) -> datafusion::common::Result<Arc<dyn datafusion::datasource::file_format::FileFormatFactory>> {
        self.inner.try_decode_file_format(buf, ctx)
    }

    fn try_encode_file_format(
        &self,
        buf: &mut Vec<u8>,
        node: Arc<dyn datafusion::datasource::file_format::FileFormatFactory>,
    ) -> datafusion::common::Result<()> {
        self.inner.try_encode_file_format(buf, node)
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> datafusion::common::Result<Arc<ScalarUDF>> {
        decode_udf(name, buf)
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> datafusion::common::Result<()> {
        encode_udf(node, buf);
        Ok(())
    }

    fn try_decode_udaf(&self, name: &str, _buf: &[u8]) -> datafusion::common::Result<Arc<AggregateUDF>> {
        decode_udaf(name)
    }
}

#[derive(Debug, Default)]
pub struct PhysicalCodec {
    inner: BallistaPhysicalExtensionCodec,
}

impl PhysicalExtensionCodec for PhysicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn datafusion::physical_plan::ExecutionPlan>],
        ctx: &TaskContext,
        converter: &dyn datafusion_proto::physical_plan::PhysicalProtoConverterExtension,
    ) -> datafusion::common::Result<Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
        match write::decode_exec(buf, inputs) {
            Some(exec) => exec,
            None => self.inner.try_decode(buf, inputs, ctx, converter),
        }
    }

    fn try_encode(
        &self,
        node: Arc<dyn datafusion::physical_plan::ExecutionPlan>,
        buf: &mut Vec<u8>,
        converter: &dyn datafusion_proto::physical_plan::PhysicalProtoConverterExtension,
    ) -> datafusion::common::Result<()> {
        if write::encode_exec(&node, buf) {
            return Ok(());
        }
        self.inner.try_encode(node, buf, converter)
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> datafusion::common::Result<Arc<ScalarUDF>> {
        decode_udf(name, buf)
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> datafusion::common::Result<()> {
        encode_udf(node, buf);
        Ok(())
    }

    fn try_decode_udaf(&self, name: &str, _buf: &[u8]) -> datafusion::common::Result<Arc<AggregateUDF>> {
        decode_udaf(name)
    }
}

// ---------------------------------------------------------------------------------------
// Object stores: every process finds the lake's store from the URL, with the same options
// (AWS_* variables, `--storage-option`) as the command line.

#[derive(Debug)]
struct LakeStores {
    known: DefaultObjectStoreRegistry,
    options: BTreeMap<String, String>,
}

impl ObjectStoreRegistry for LakeStores {
    fn register_store(&self, url: &Url, store: Arc<dyn ObjectStore>) -> Option<Arc<dyn ObjectStore>> {
        self.known.register_store(url, store)
    }

    fn get_store(&self, url: &Url) -> datafusion::common::Result<Arc<dyn ObjectStore>> {
        if let Ok(s) = self.known.get_store(url) {
            return Ok(s);
        }
        let root = Url::parse(&format!("{}://{}/", url.scheme(), url.authority()))
            .map_err(|e| DataFusionError::Configuration(format!("store of {url}: {e}")))?;
        let (store, _) = crate::lake::store::open(&root, &self.options).map_err(|e| {
            DataFusionError::Configuration(format!(
                "no object store for {}: {e:#}",
                crate::lake::store::redact(root.as_str())
            ))
        })?;
        self.known.register_store(&root, store.clone());
        Ok(store)
    }
}

fn runtime(options: &BTreeMap<String, String>) -> datafusion::common::Result<Arc<RuntimeEnv>> {
    crate::lake::store::register_handlers();
    RuntimeEnvBuilder::new()
        .with_object_store_registry(Arc::new(LakeStores {
            known: DefaultObjectStoreRegistry::new(),
            options: options.clone(),
        }))
        .build_arc()
}

/// A session state with swelake's functions, codecs and stores, for the scheduler and (with
/// `client`) a job's client.
fn state(
    config: SessionConfig,
    options: &BTreeMap<String, String>,
    client: bool,
) -> datafusion::common::Result<SessionState> {
    // As Ballista's own session builder, with swelake's stores and functions added.
    let mut rules = ballista_core::optimizer::ballista_default_optimizer_rules();
    if client {
        rules.push(Arc::new(KeepEmptySchemas));
    }
    let mut state = SessionStateBuilder::new()
        .with_default_features()
        .with_config(config)
        .with_runtime_env(runtime(options)?)
        .with_optimizer_rules(rules)
        .with_query_planner(Arc::new(write::Planner))
        .with_scalar_functions(ballista_core::extension::ballista_scalar_functions())
        .with_aggregate_functions(ballista_core::extension::ballista_aggregate_functions())
        .with_window_functions(ballista_core::extension::ballista_window_functions())
        .build();
    for f in crate::udfs::all() {
        datafusion::execution::FunctionRegistry::register_udf(&mut state, Arc::new(f))?;
    }
    for f in crate::udfs::aggregates() {
        datafusion::execution::FunctionRegistry::register_udaf(&mut state, Arc::new(f))?;
    }
    Ok(state)
}

/// The last optimizer rule of a client session: an empty relation that has columns (what
/// DataFusion leaves where a filter or a join can match nothing) becomes a projection of
/// typed NULLs under `WHERE false`, which the wire format carries with its columns.
/// DataFusion's own rules turn it back into an empty relation on the scheduler, after the
/// plan has arrived.
#[derive(Debug, Default)]
struct KeepEmptySchemas;

impl datafusion::optimizer::OptimizerRule for KeepEmptySchemas {
    fn name(&self) -> &str {
        "swelake_keep_empty_schemas"
    }

    fn apply_order(&self) -> Option<datafusion::optimizer::ApplyOrder> {
        Some(datafusion::optimizer::ApplyOrder::BottomUp)
    }

    fn rewrite(
        &self,
        plan: datafusion::logical_expr::LogicalPlan,
        _config: &dyn datafusion::optimizer::OptimizerConfig,
    ) -> datafusion::common::Result<datafusion::common::tree_node::Transformed<datafusion::logical_expr::LogicalPlan>>
    {
        use datafusion::common::tree_node::Transformed;
        use datafusion::logical_expr::{LogicalPlan, LogicalPlanBuilder};
        let LogicalPlan::EmptyRelation(e) = &plan else { return Ok(Transformed::no(plan)) };
        if e.produce_one_row || e.schema.fields().is_empty() {
            return Ok(Transformed::no(plan));
        }
        let exprs = e
            .schema
            .iter()
            .map(|(q, f)| Ok(lit(ScalarValue::try_from(f.data_type())?).alias_qualified(q.cloned(), f.name())))
            .collect::<datafusion::common::Result<Vec<Expr>>>()?;
        let rebuilt = LogicalPlanBuilder::empty(true).filter(lit(false))?.project(exprs)?.build()?;
        Ok(Transformed::yes(rebuilt))
    }
}

fn ballista_config() -> SessionConfig {
    // Ballista 55's adaptive planner re-plans union stages per task so that their tasks report
    // operator metrics of different lengths; the scheduler then rejects the task statuses and
    // re-runs or drops partitions (rows duplicated or missing, measured on these jobs). The
    // static planner gives the local engine's rows.
    let mut config = SessionConfig::new_with_ballista()
        .set_bool(ballista_core::config::BALLISTA_ADAPTIVE_PLANNER_ENABLED, false)
        .with_information_schema(true)
        .with_ballista_logical_extension_codec(Arc::new(LogicalCodec::default()))
        .with_ballista_physical_extension_codec(Arc::new(PhysicalCodec::default()));
    // The DATAFUSION_* settings a user gives the local engine (crate::lake::session_config)
    // reach the cluster's plans too: the ones the environment changes from the defaults.
    if let Ok(env) = datafusion::config::ConfigOptions::from_env() {
        let defaults: std::collections::HashMap<String, Option<String>> =
            datafusion::config::ConfigOptions::default().entries().into_iter().map(|e| (e.key, e.value)).collect();
        for e in env.entries() {
            if let Some(v) = e.value.as_ref().filter(|_| defaults.get(&e.key) != Some(&e.value)) {
                if let Err(err) = config.options_mut().set(&e.key, v) {
                    tracing::warn!("{}={v} not applied to Ballista plans: {err}", e.key);
                }
            }
        }
    }
    // A stage has target_partitions tasks, and tasks are what executors share; by default that
    // is the client's core count, which says nothing of the cluster. With 2 tasks per stage,
    // 2 executors of one slot wait on each stage's slower task (`swelake bench jobs`, the four
    // jobs: 1.37-1.50x over one executor at 2, 1.53x at 4). A user's
    // DATAFUSION_EXECUTION_TARGET_PARTITIONS still decides.
    if std::env::var_os("DATAFUSION_EXECUTION_TARGET_PARTITIONS").is_none() {
        let n = config.target_partitions().max(MIN_CLUSTER_PARTITIONS);
        config = config.with_target_partitions(n);
    }
    config
}

/// The fewest tasks per stage of a job on a cluster.
const MIN_CLUSTER_PARTITIONS: usize = 4;

// ---------------------------------------------------------------------------------------
// The processes.

/// `swelake ballista scheduler`: runs until killed.
pub async fn scheduler(bind: &str, options: &BTreeMap<String, String>) -> Result<()> {
    use ballista_scheduler::cluster::BallistaCluster;
    use ballista_scheduler::config::SchedulerConfig;
    let addr = socket_addr(bind, "--bind")?;
    let options = options.clone();
    let mut config = SchedulerConfig::default()
        .with_override_session_builder(Arc::new(move |c: SessionConfig| {
            let c = c
                .with_ballista_logical_extension_codec(Arc::new(LogicalCodec::default()))
                .with_ballista_physical_extension_codec(Arc::new(PhysicalCodec::default()));
            state(c, &options, false)
        }))
        .with_override_config_producer(Arc::new(ballista_config));
    config.bind_host = addr.ip().to_string();
    config.bind_port = addr.port();
    config.external_host = addr.ip().to_string();
    config.override_logical_codec = Some(Arc::new(LogicalCodec::default()));
    config.override_physical_codec = Some(Arc::new(PhysicalCodec::default()));
    let cluster = BallistaCluster::new_from_config(&config).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    tracing::info!("ballista scheduler on {addr}");
    ballista_scheduler::scheduler_process::start_server(cluster, addr, Arc::new(config))
        .await
        .map_err(|e| anyhow::anyhow!("the scheduler stopped: {e}"))
}

/// What `swelake ballista executor` is told.
#[derive(Debug, Clone)]
pub struct ExecutorOptions {
    pub scheduler: String,
    /// The data (Arrow Flight) address.
    pub bind: String,
    pub grpc_port: Option<u16>,
    pub concurrent_tasks: usize,
    pub work_dir: Option<std::path::PathBuf>,
}

/// `swelake ballista executor`: registers with the scheduler and runs tasks until killed.
pub async fn executor(o: &ExecutorOptions, options: &BTreeMap<String, String>) -> Result<()> {
    use ballista_executor::executor_process::{start_executor_process, ExecutorProcessConfig};
    let scheduler = o.scheduler.strip_prefix("df://").unwrap_or(&o.scheduler);
    let (s_host, s_port) =
        scheduler.rsplit_once(':').with_context(|| format!("--scheduler `{}`: expected HOST:PORT", o.scheduler))?;
    let s_port: u16 = s_port.parse().with_context(|| format!("--scheduler `{}`: bad port", o.scheduler))?;
    let bind = socket_addr(&o.bind, "--bind")?;
    let grpc_port =
        o.grpc_port.unwrap_or(bind.port().checked_add(1).context("--bind port too high for the gRPC port")?);
    if let Some(d) = &o.work_dir {
        std::fs::create_dir_all(d).with_context(|| format!("creating --work-dir {}", d.display()))?;
    }
    let mut registry = BallistaFunctionRegistry::default();
    for f in crate::udfs::all() {
        registry.scalar_functions.insert(f.name().to_string(), Arc::new(f));
    }
    for f in crate::udfs::aggregates() {
        registry.aggregate_functions.insert(f.name().to_string(), Arc::new(f));
    }
    let opts = options.clone();
    let config = ExecutorProcessConfig {
        bind_host: bind.ip().to_string(),
        external_host: Some(bind.ip().to_string()),
        port: bind.port(),
        grpc_port,
        scheduler_host: s_host.to_string(),
        scheduler_port: s_port,
        scheduler_connect_timeout_seconds: 30,
        vcores: o.concurrent_tasks.max(1),
        work_dir: o.work_dir.as_ref().map(|d| d.display().to_string()),
        executor_heartbeat_interval_seconds: 5,
        override_function_registry: Some(Arc::new(registry)),
        override_logical_codec: Some(Arc::new(LogicalCodec::default())),
        override_physical_codec: Some(Arc::new(PhysicalCodec::default())),
        override_runtime_producer: Some(Arc::new(move |_: &SessionConfig| runtime(&opts))),
        ..Default::default()
    };
    tracing::info!("ballista executor on {bind} (gRPC {grpc_port}), scheduler {scheduler}");
    start_executor_process(Arc::new(config)).await.map_err(|e| anyhow::anyhow!("the executor stopped: {e}"))
}

// ---------------------------------------------------------------------------------------
// The client: a session whose plans run on the cluster, over one snapshot of the lake.

/// A session on the cluster at `scheduler` with every table of `lake` registered as the files
/// of its current version, and each of `optional` that does not exist as an empty table.
pub async fn session(lake: &Lake, scheduler: &str, optional: &[&str]) -> Result<SessionContext> {
    let url = scheduler_url(scheduler)?;
    // Ballista connects only when a plan runs; a job would by then have created its output
    // table. Say at once that the scheduler is not there.
    let addr = url.trim_start_matches("df://").to_string();
    match tokio::time::timeout(std::time::Duration::from_secs(10), tokio::net::TcpStream::connect(&addr)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => bail!("the Ballista scheduler at {url} is not reachable: {e}"),
        Err(_) => bail!("the Ballista scheduler at {url} did not answer within 10 s"),
    }
    let state = state(ballista_config(), lake.storage_options(), true).map_err(|e| anyhow::anyhow!("{e}"))?;
    let ctx = SessionContext::remote_with_state(&url, state)
        .await
        .with_context(|| format!("connecting to the Ballista scheduler at {url}"))?;
    // Ballista's upgrade of the state resets its functions to Ballista's set.
    crate::udfs::register_all(&ctx);
    for name in lake.tables().await? {
        let table = lake.open_table(&name).await?;
        register_files(&ctx, &name, &table).await.with_context(|| format!("registering table `{name}`"))?;
    }
    for name in optional {
        if !lake.has_table(name).await? {
            let schema = crate::schema::arrow(name)?;
            register_empty(&ctx, name, schema)?;
        }
    }
    Ok(ctx)
}

fn parquet_listing(urls: Vec<ListingTableUrl>, schema: SchemaRef) -> Result<Arc<ListingTable>> {
    let options = ListingOptions::new(Arc::new(ParquetFormat::default())).with_file_extension(".parquet");
    let config = ListingTableConfig::new_with_multi_paths(urls).with_listing_options(options).with_schema(schema);
    Ok(Arc::new(ListingTable::try_new(config)?))
}

/// Table `name` as the Parquet files of `table`'s version: one listing per partition value,
/// the partition columns put back as literals, in the table's column order.
async fn register_files(ctx: &SessionContext, name: &str, table: &deltalake::DeltaTable) -> Result<()> {
    let snapshot = table.snapshot()?;
    let schema = snapshot.snapshot().arrow_schema();
    let partition_cols: Vec<String> = snapshot.metadata().partition_columns().to_vec();
    let root = table.table_url().clone();
    let mut groups: BTreeMap<Vec<Option<String>>, Vec<ListingTableUrl>> = BTreeMap::new();
    for f in snapshot.log_data().iter() {
        let values = f.partition_values_map();
        let key: Vec<Option<String>> = partition_cols.iter().map(|c| values.get(c).cloned().flatten()).collect();
        let url = root.join(f.path().as_ref()).with_context(|| format!("file {} of `{name}`", f.path()))?;
        groups.entry(key).or_default().push(ListingTableUrl::parse(url.as_str())?);
    }
    if groups.is_empty() {
        ctx.register_table(name, empty_table(ctx, &schema)?.into_view())?;
        return Ok(());
    }
    if partition_cols.is_empty() {
        let files = groups.into_values().next().unwrap_or_default();
        ctx.register_table(name, parquet_listing(files, schema)?)?;
        return Ok(());
    }
    let file_schema = Arc::new(Schema::new(
        schema.fields().iter().filter(|f| !partition_cols.contains(f.name())).cloned().collect::<Vec<_>>(),
    ));
    let mut union: Option<datafusion::prelude::DataFrame> = None;
    for (values, files) in groups {
        let part = ctx.read_table(parquet_listing(files, file_schema.clone())?)?;
        let exprs: Vec<Expr> = schema
            .fields()
            .iter()
            .map(|f| -> Result<Expr> {
                Ok(match partition_cols.iter().position(|c| c == f.name()) {
                    Some(i) => {
                        let v = match &values[i] {
                            Some(s) => ScalarValue::try_from_string(s.clone(), f.data_type())?,
                            None => ScalarValue::try_from(f.data_type())?,
                        };
                        lit(v).alias(f.name())
                    }
                    None => col(datafusion::common::Column::from_name(f.name())),
                })
            })
            .collect::<Result<_>>()?;
        let part = part.select(exprs)?;
        union = Some(match union {
            None => part,
            Some(u) => u.union(part)?,
        });
    }
    ctx.register_table(name, union.expect("at least one partition").into_view())?;
    Ok(())
}

/// A table with no rows and `schema`'s columns: typed NULLs from one VALUES row that a filter
/// drops. Not an empty listing: a scan of no files has no partitions, and a union of it with
/// a real scan never finishes on Ballista 55 (its task metrics do not line up); not an empty
/// relation, whose columns the wire format drops.
fn empty_table(ctx: &SessionContext, schema: &Schema) -> Result<datafusion::prelude::DataFrame> {
    use datafusion::logical_expr::LogicalPlanBuilder;
    let exprs = schema
        .fields()
        .iter()
        .map(|f| Ok(lit(ScalarValue::try_from(f.data_type())?).alias(f.name())))
        .collect::<Result<Vec<Expr>>>()?;
    let plan = LogicalPlanBuilder::values(vec![vec![lit(0i64)]])?
        .filter(col("column1").eq(lit(1i64)))?
        .project(exprs)?
        .build()?;
    Ok(datafusion::prelude::DataFrame::new(ctx.state(), plan))
}

/// An optional input that does not exist yet.
fn register_empty(ctx: &SessionContext, name: &str, schema: SchemaRef) -> Result<()> {
    ctx.register_table(name, empty_table(ctx, &schema)?.into_view())?;
    Ok(())
}
