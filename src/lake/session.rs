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
use datafusion::logical_expr::TableType;
use datafusion::prelude::{SessionConfig, SessionContext};
use deltalake::delta_datafusion::engine::AsObjectStoreUrl;
use tokio::sync::OnceCell;

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

/// A table of the lake, once opened.
type Opened = OnceCell<Arc<dyn TableProvider>>;

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
    /// Tables opened so far: one snapshot per table for the session's life, opened once
    /// however many queries name it at once.
    tables: Mutex<HashMap<String, Arc<Opened>>>,
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
        if !self.names.iter().any(|n| n == name) {
            return Ok(None);
        }
        let cell = self.tables.lock().expect("not poisoned").entry(name.to_string()).or_default().clone();
        let provider = cell
            .get_or_try_init(|| self.open(name))
            .await
            .map_err(|e| DataFusionError::External(format!("{e:#}").into()))?;
        Ok(Some(provider.clone()))
    }

    /// Without opening the table: listing the lake's tables (information_schema) opens none.
    async fn table_type(&self, name: &str) -> datafusion::error::Result<Option<TableType>> {
        if let Some(t) = self.registered.lock().expect("not poisoned").get(name) {
            return Ok(Some(t.table_type()));
        }
        Ok(self.names.iter().any(|n| n == name).then_some(TableType::Base))
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

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Schema};

    async fn table_of(lake: &Lake, name: &str, values: &[i64]) {
        let schema = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]));
        let table = lake.ensure_table(name, &schema, &[]).await.unwrap();
        let batch = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(values.to_vec()))]).unwrap();
        lake.append(table, vec![batch]).await.unwrap();
    }

    async fn sum(ctx: &SessionContext, table: &str) -> Result<Option<i64>> {
        let v: Vec<Option<i64>> = crate::query::rows(ctx, &format!("SELECT sum(n) FROM {table}")).await?;
        Ok(v[0])
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_session_opens_the_tables_its_queries_name_once_each() {
        let dir = tempfile::tempdir().unwrap();
        let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
        table_of(&lake, "good", &[1, 2, 3]).await;
        table_of(&lake, "broken", &[4]).await;
        let ctx = lake.session().await.unwrap();
        // A table no query names is never opened: its log going bad leaves the others readable.
        let log = dir.path().join("broken/_delta_log/00000000000000000000.json");
        std::fs::write(&log, "not a delta log\n").unwrap();
        assert_eq!(sum(&ctx, "good").await.unwrap(), Some(6));
        let e = sum(&ctx, "broken").await.unwrap_err();
        assert!(format!("{e:#}").contains("`broken`"), "{e:#}");
        // Every table is listed, and `good` keeps the version it was first read at.
        let names: Vec<String> = crate::query::rows(
            &ctx,
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' ORDER BY 1",
        )
        .await
        .unwrap();
        assert_eq!(names, ["broken", "good"]);
        table_of(&lake, "good", &[10]).await;
        assert_eq!(sum(&ctx, "good").await.unwrap(), Some(6));
        assert_eq!(sum(&lake.session().await.unwrap(), "good").await.unwrap(), Some(16));
        // A name registered in the session comes before the lake's.
        let view = ctx.sql("SELECT n FROM good WHERE n > 1").await.unwrap().into_view();
        ctx.register_table("good_new", view).unwrap();
        assert_eq!(sum(&ctx, "good_new").await.unwrap(), Some(5));
    }
}
