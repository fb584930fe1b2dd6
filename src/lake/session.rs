//! DataFusion sessions over the lake: every table registered under its name, at the version
//! read.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use super::Lake;
use anyhow::{Context, Result};
use async_trait::async_trait;
use datafusion::catalog::{SchemaProvider, TableProvider};
use datafusion::error::DataFusionError;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::prelude::{SessionConfig, SessionContext};
use deltalake::delta_datafusion::engine::AsObjectStoreUrl;

impl Lake {
    /// A DataFusion session with every table of the lake registered under its name, each
    /// opened when a query first names it (at the version it then has; the same one for the
    /// rest of the session). It has no swelake SQL functions: the layer that plans queries
    /// adds them (`udfs::register_all`).
    pub async fn session(&self) -> Result<SessionContext> {
        let ctx = SessionContext::new_with_config(session_config()?);
        let schema = LakeSchema {
            lake: self.clone(),
            names: self.tables().await?,
            runtime: ctx.runtime_env(),
            tables: Mutex::new(HashMap::new()),
            registered: Mutex::new(HashMap::new()),
        };
        let default = ctx.state().config().options().catalog.clone();
        ctx.catalog(&default.default_catalog)
            .context("the session has no default catalog")?
            .register_schema(&default.default_schema, Arc::new(schema))?;
        Ok(ctx)
    }

    /// A session with every table opened now, and the version of each table it registered:
    /// what a cache of anything computed from the tables keys on.
    pub async fn session_at_versions(&self) -> Result<(SessionContext, BTreeMap<String, i64>)> {
        let ctx = SessionContext::new_with_config(session_config()?);
        let mut versions = BTreeMap::new();
        for name in self.tables().await? {
            let table = self.open_table(&name).await?;
            table.update_datafusion_session(&ctx.state())?;
            let provider = table.table_provider().await.with_context(|| format!("reading table `{name}`"))?;
            ctx.register_table(name.as_str(), provider)?;
            versions.insert(name, table.version().map_or(-1, |v| v as i64));
        }
        Ok((ctx, versions))
    }

    /// [`Lake::session`] with each of `optional` that does not exist yet registered as an
    /// empty table of its schema file's columns, so queries over optional inputs plan either way.
    pub async fn session_with(&self, optional: &[&str]) -> Result<SessionContext> {
        let ctx = self.session().await?;
        for name in optional {
            if !ctx.table_exist(*name)? {
                let schema = crate::schema::arrow(name)?;
                let empty = datafusion::datasource::MemTable::try_new(schema, vec![vec![]])?;
                ctx.register_table(*name, Arc::new(empty))?;
            }
        }
        Ok(ctx)
    }
}

/// The lake's tables as a DataFusion schema. A job's SQL reads two or three of a lake's
/// tables; opening each Delta table replays its log, so a table is opened when a query first
/// names it, not when the session starts (`swelake bench jobs`: the fixed cost of a job).
/// Tables registered by name (a job's `events_new` view, an empty optional input) come first.
#[derive(Debug)]
struct LakeSchema {
    lake: Lake,
    /// The lake's tables when the session started.
    names: Vec<String>,
    runtime: Arc<RuntimeEnv>,
    /// Tables opened so far: one snapshot per table for the session's life.
    tables: Mutex<HashMap<String, Arc<dyn TableProvider>>>,
    registered: Mutex<HashMap<String, Arc<dyn TableProvider>>>,
}

impl LakeSchema {
    async fn open(&self, name: &str) -> Result<Arc<dyn TableProvider>> {
        let table = self.lake.open_table(name).await?;
        let log_store = table.log_store();
        let url = log_store.root_url().as_object_store_url();
        if self.runtime.object_store(&url).is_err() {
            self.runtime.register_object_store(url.as_ref(), log_store.root_object_store(None));
        }
        let provider = table.table_provider().await.with_context(|| format!("reading table `{name}`"))?;
        Ok(provider)
    }
}

#[async_trait]
impl SchemaProvider for LakeSchema {
    fn table_names(&self) -> Vec<String> {
        let mut names = self.names.clone();
        names.extend(self.registered.lock().expect("not poisoned").keys().cloned());
        names.sort();
        names.dedup();
        names
    }

    async fn table(&self, name: &str) -> datafusion::error::Result<Option<Arc<dyn TableProvider>>> {
        if let Some(t) = self.registered.lock().expect("not poisoned").get(name) {
            return Ok(Some(t.clone()));
        }
        if let Some(t) = self.tables.lock().expect("not poisoned").get(name) {
            return Ok(Some(t.clone()));
        }
        if !self.names.iter().any(|n| n == name) {
            return Ok(None);
        }
        let provider = self.open(name).await.map_err(|e| DataFusionError::External(e.into()))?;
        // Two queries planned at once may both open it: the first one kept is every query's.
        let mut tables = self.tables.lock().expect("not poisoned");
        Ok(Some(tables.entry(name.to_string()).or_insert(provider).clone()))
    }

    fn register_table(
        &self,
        name: String,
        table: Arc<dyn TableProvider>,
    ) -> datafusion::error::Result<Option<Arc<dyn TableProvider>>> {
        Ok(self.registered.lock().expect("not poisoned").insert(name, table))
    }

    fn deregister_table(&self, name: &str) -> datafusion::error::Result<Option<Arc<dyn TableProvider>>> {
        Ok(self.registered.lock().expect("not poisoned").remove(name))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.registered.lock().expect("not poisoned").contains_key(name) || self.names.iter().any(|n| n == name)
    }
}

/// The settings of every query session over the lake: DataFusion's defaults, then its own
/// `DATAFUSION_*` environment variables (e.g. `DATAFUSION_EXECUTION_TARGET_PARTITIONS=4`), so
/// an operator can tune a run without a new build.
pub fn session_config() -> Result<SessionConfig> {
    let config = SessionConfig::from_env().context("reading DATAFUSION_* settings from the environment")?;
    Ok(config.with_information_schema(true))
}
