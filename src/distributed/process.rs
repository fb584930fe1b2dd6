//! The cluster's processes (`swelake ballista scheduler|executor`) and the session state
//! every process shares: swelake's functions, codecs and object stores, Ballista's settings.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Context, Result};
use ballista_core::extension::SessionConfigExt;
use ballista_core::registry::BallistaFunctionRegistry;
use datafusion::common::DataFusionError;
use datafusion::execution::object_store::{DefaultObjectStoreRegistry, ObjectStoreRegistry};
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::execution::{SessionState, SessionStateBuilder};
use datafusion::prelude::SessionConfig;
use object_store::ObjectStore;
use url::Url;

use super::codec::{LogicalCodec, PhysicalCodec};
use super::rule::KeepEmptySchemas;
use super::socket_addr;
use super::write;

// ---------------------------------------------------------------------------------------
// Object stores: every process finds the lake's store from the URL, with the same options
// (AWS_* variables, `--storage-option`) as the command line.

#[derive(Debug)]
pub(super) struct LakeStores {
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

pub(super) fn runtime(options: &BTreeMap<String, String>) -> datafusion::common::Result<Arc<RuntimeEnv>> {
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
pub(super) fn state(
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

pub(super) fn ballista_config() -> SessionConfig {
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
pub(super) const MIN_CLUSTER_PARTITIONS: usize = 4;

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
