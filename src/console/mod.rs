//! `swelake serve` and `swelake sql`'s shell: the lake for people who look at it every day.
//!
//! - a read-only web console (status, the archive's hours, SQL, the dataset and its
//!   instances), each page drawn from a JSON endpoint that scripts can call too (`api`);
//! - the PostgreSQL wire protocol, for psql, DBeaver, Metabase and Grafana ([`pg`]);
//! - an interactive SQL shell ([`shell`]).
//!
//! Everything here reads: statements other than queries are refused, as in `swelake sql`.
//! Text that came from GitHub reaches a page only as text (the page's script builds nodes with
//! `textContent`, and the content security policy forbids inline script besides).

mod api;
pub mod pg;
pub mod shell;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use arrow::array::RecordBatch;
use datafusion::prelude::SessionContext;
use futures::StreamExt;
use tokio::sync::Mutex;

use crate::lake::Lake;

/// How `swelake serve` runs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The web console's address.
    pub bind: SocketAddr,
    /// The PostgreSQL wire protocol's address, if served.
    pub pg_bind: Option<SocketAddr>,
    /// Bearer token for HTTP and password for the wire protocol; required off loopback.
    pub token: Option<String>,
    /// Rows a query returns at most (the console's and the wire protocol's simple queries).
    pub row_limit: usize,
    /// How long a query may run.
    pub timeout: Duration,
    /// What the status page judges with (jobs, curation config).
    pub registry: crate::jobs::Registry,
    pub run: crate::jobs::RunOptions,
}

/// Refuses an address off loopback without a token: the console shows the whole lake.
pub fn check_bind(addr: &SocketAddr, token: Option<&str>, flag: &str) -> Result<()> {
    if !addr.ip().is_loopback() && token.is_none_or(str::is_empty) {
        bail!(
            "{flag} {addr} is not a loopback address: anyone who reaches it would read the lake. \
             Give --token T (or SWELAKE_TOKEN): HTTP clients then send `Authorization: Bearer T`, \
             PostgreSQL clients T as their password"
        );
    }
    Ok(())
}

/// What every request shares: the lake and a session over its current table versions.
pub(crate) struct Shared {
    pub lake: Lake,
    pub opts: ServeOptions,
    session: Mutex<Option<(Instant, Arc<SessionContext>)>>,
    pg_session: Mutex<Option<(Instant, Arc<SessionContext>)>>,
}

/// How long a session's table versions are reused before the lake is read again: pages that
/// refresh themselves see a job's commit within this.
const SESSION_TTL: Duration = Duration::from_secs(3);

impl Shared {
    pub fn new(lake: Lake, opts: ServeOptions) -> Arc<Shared> {
        Arc::new(Shared { lake, opts, session: Mutex::new(None), pg_session: Mutex::new(None) })
    }

    /// A session over the lake as it is now (within [`SESSION_TTL`]), with every SQL function.
    pub async fn session(&self) -> Result<Arc<SessionContext>> {
        Self::cached(&self.session, &self.lake, false).await
    }

    /// [`Shared::session`] with PostgreSQL's catalogue and functions beside the lake's tables,
    /// for the clients of the wire protocol (the console's SQL is `swelake sql`'s).
    pub async fn pg_session(&self) -> Result<Arc<SessionContext>> {
        Self::cached(&self.pg_session, &self.lake, true).await
    }

    async fn cached(
        slot: &Mutex<Option<(Instant, Arc<SessionContext>)>>,
        lake: &Lake,
        pg: bool,
    ) -> Result<Arc<SessionContext>> {
        let mut slot = slot.lock().await;
        if let Some((at, ctx)) = slot.as_ref() {
            if at.elapsed() < SESSION_TTL {
                return Ok(ctx.clone());
            }
        }
        let ctx = crate::sql::session(lake).await?;
        if pg {
            pg::add_pg_catalog(&ctx)?;
        }
        let ctx = Arc::new(ctx);
        *slot = Some((Instant::now(), ctx.clone()));
        Ok(ctx)
    }
}

/// A query's first rows, and whether more were left out.
pub struct Limited {
    pub batches: Vec<RecordBatch>,
    pub schema: arrow::datatypes::SchemaRef,
    pub truncated: bool,
}

/// Runs a read-only query for at most `timeout`, keeping at most `limit` rows.
pub async fn query_limited(ctx: &SessionContext, sql: &str, limit: usize, timeout: Duration) -> Result<Limited> {
    let run = async {
        let df = ctx.sql_with_options(sql, crate::sql::read_only()).await?;
        let schema = Arc::new(df.schema().as_arrow().clone());
        let mut stream = df.execute_stream().await?;
        let (mut batches, mut rows, mut truncated) = (Vec::new(), 0usize, false);
        while let Some(b) = stream.next().await {
            let b = b?;
            if rows + b.num_rows() > limit {
                batches.push(b.slice(0, limit - rows));
                truncated = true;
                break;
            }
            rows += b.num_rows();
            batches.push(b);
        }
        Ok::<_, datafusion::error::DataFusionError>(Limited { batches, schema, truncated })
    };
    match tokio::time::timeout(timeout, run).await {
        Ok(r) => r.map_err(|e| anyhow::anyhow!(one_line(&e.to_string()))),
        Err(_) => bail!("the query ran past the time limit of {} s (swelake serve --timeout)", timeout.as_secs_f64()),
    }
}

/// An error as one line: DataFusion's nest their causes over several.
pub fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Serves the console (and the wire protocol when asked) until the process is stopped.
pub async fn serve(lake: Lake, opts: ServeOptions) -> Result<()> {
    check_bind(&opts.bind, opts.token.as_deref(), "--bind")?;
    if let Some(pg) = &opts.pg_bind {
        check_bind(pg, opts.token.as_deref(), "--pg-bind")?;
    }
    let shared = Shared::new(lake, opts.clone());
    // Fail now, not on the first page, when the lake cannot be read.
    shared.session().await.context("opening the lake's tables")?;
    let listener = tokio::net::TcpListener::bind(opts.bind)
        .await
        .with_context(|| format!("binding the console to {}", opts.bind))?;
    let addr = listener.local_addr()?;
    eprintln!("swelake serve: the console of {} is at http://{addr}/", shared.lake.location());
    let pg = match opts.pg_bind {
        Some(pg_addr) => {
            let l = tokio::net::TcpListener::bind(pg_addr)
                .await
                .with_context(|| format!("binding the wire protocol to {pg_addr}"))?;
            eprintln!(
                "swelake serve: PostgreSQL clients connect to {} (psql -h {} -p {}{})",
                l.local_addr()?,
                l.local_addr()?.ip(),
                l.local_addr()?.port(),
                if opts.token.is_some() { ", password: the token" } else { ", any user and database" }
            );
            Some(tokio::spawn(pg::serve(l, shared.clone())))
        }
        None => None,
    };
    let app = api::router(shared);
    let web = axum::serve(listener, app);
    match pg {
        Some(pg) => tokio::select! {
            r = web => r.context("serving the console")?,
            r = pg => r.context("the wire protocol's server stopped")??,
        },
        None => web.await.context("serving the console")?,
    }
    Ok(())
}
