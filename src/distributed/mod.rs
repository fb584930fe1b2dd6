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

use std::net::{SocketAddr, ToSocketAddrs};

use anyhow::{bail, Context, Result};

mod codec;
mod process;
mod register;
mod rule;
mod write;

pub use codec::{LogicalCodec, PhysicalCodec};
pub use process::{executor, scheduler, ExecutorOptions};
pub use register::session;
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

pub(crate) fn socket_addr(s: &str, what: &str) -> Result<SocketAddr> {
    s.to_socket_addrs()
        .with_context(|| format!("{what} `{s}`: expected HOST:PORT"))?
        .next()
        .with_context(|| format!("{what} `{s}` resolves to no address"))
}
