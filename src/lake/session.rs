//! DataFusion sessions over the lake: every table registered under its name, at the version
//! read.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::Lake;
use anyhow::{Context, Result};
use datafusion::prelude::{SessionConfig, SessionContext};

impl Lake {
    /// A DataFusion session with every table of the lake registered under its name. It has
    /// no swelake SQL functions: the layer that plans queries adds them (`udfs::register_all`).
    pub async fn session(&self) -> Result<SessionContext> {
        Ok(self.session_at_versions().await?.0)
    }

    /// [`Lake::session`] and the version of each table it registered: what a cache of
    /// anything computed from the tables keys on.
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
            if !self.has_table(name).await? {
                let schema = crate::schema::arrow(name)?;
                let empty = datafusion::datasource::MemTable::try_new(schema, vec![vec![]])?;
                ctx.register_table(*name, Arc::new(empty))?;
            }
        }
        Ok(ctx)
    }
}

/// The settings of every query session over the lake: DataFusion's defaults, then its own
/// `DATAFUSION_*` environment variables (e.g. `DATAFUSION_EXECUTION_TARGET_PARTITIONS=4`), so
/// an operator can tune a run without a new build.
pub fn session_config() -> Result<SessionConfig> {
    let config = SessionConfig::from_env().context("reading DATAFUSION_* settings from the environment")?;
    Ok(config.with_information_schema(true))
}
