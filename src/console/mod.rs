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
pub mod limits;
pub mod pg;
pub mod shell;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use datafusion::common::ScalarValue;
use datafusion::prelude::SessionContext;
use tokio::sync::Mutex;

use crate::lake::Lake;
pub use crate::sql::guard::one_line;
use crate::sql::guard::QueryError;
pub use limits::{Limited, Limits};

/// How `swelake serve` runs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The web console's address.
    pub bind: SocketAddr,
    /// The PostgreSQL wire protocol's address, if served.
    pub pg_bind: Option<SocketAddr>,
    /// Bearer token for HTTP and password for the wire protocol; required off loopback.
    pub token: Option<String>,
    /// Rows a query returns at most, on every protocol path.
    pub row_limit: usize,
    /// How long a query may run, waiting for a slot included.
    pub timeout: Duration,
    /// Bytes the operators of one query may hold in memory.
    pub memory_limit: usize,
    /// Queries that run at once; more wait (within their time limit) for a slot.
    pub max_queries: usize,
    /// Host names the web console answers to besides its bound address (a reverse proxy's
    /// public name): any other `Host` is refused, so a DNS-rebinding page cannot read it.
    pub allow_hosts: Vec<String>,
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

/// A session over the lake's tables at some versions, and those versions.
#[derive(Clone)]
pub(crate) struct Snapshot {
    pub ctx: Arc<SessionContext>,
    pub versions: Arc<BTreeMap<String, i64>>,
}

/// The dataset card as the console serves it, and the table versions it was drawn from.
type Card = (Arc<BTreeMap<String, i64>>, serde_json::Value);

/// What every request shares: the lake, a session over its current table versions, the
/// limits, and the dataset card of the versions it was drawn from.
pub(crate) struct Shared {
    pub lake: Lake,
    pub opts: ServeOptions,
    /// The web console's address as bound (the port when `--bind` asked for port 0).
    pub http_addr: SocketAddr,
    pub limits: Limits,
    session: Mutex<Option<(Instant, Snapshot)>>,
    pg_session: Mutex<Option<(Instant, Snapshot)>>,
    card: Mutex<Option<Card>>,
}

/// How long a session's table versions are reused before the lake is read again: pages that
/// refresh themselves see a job's commit within this.
const SESSION_TTL: Duration = Duration::from_secs(3);

impl Shared {
    pub fn new(lake: Lake, opts: ServeOptions, http_addr: SocketAddr) -> Arc<Shared> {
        let limits = Limits::new(opts.row_limit, opts.timeout, opts.memory_limit, opts.max_queries);
        Arc::new(Shared {
            lake,
            opts,
            http_addr,
            limits,
            session: Mutex::new(None),
            pg_session: Mutex::new(None),
            card: Mutex::new(None),
        })
    }

    /// A session over the lake as it is now (within [`SESSION_TTL`]), with every SQL function.
    pub async fn session(&self) -> Result<Arc<SessionContext>> {
        Ok(self.snapshot().await?.ctx)
    }

    /// [`Shared::session`] with the table versions it reads.
    pub async fn snapshot(&self) -> Result<Snapshot> {
        Self::cached(&self.session, &self.lake, false, self.value_limit()).await
    }

    /// [`Shared::session`] with PostgreSQL's catalogue and functions beside the lake's tables,
    /// for the clients of the wire protocol (the console's SQL is `swelake sql`'s). Shared by
    /// the connections as a catalogue: each connection builds its own session state on it.
    pub async fn pg_session(&self) -> Result<Arc<SessionContext>> {
        Ok(Self::cached(&self.pg_session, &self.lake, true, self.value_limit()).await?.ctx)
    }

    /// The bytes one call of a value-building function may build: a quarter of a query's
    /// memory, so a value and the copies a query makes of it stay within it.
    fn value_limit(&self) -> usize {
        (self.opts.memory_limit / 4).max(1 << 20)
    }

    async fn cached(
        slot: &Mutex<Option<(Instant, Snapshot)>>,
        lake: &Lake,
        pg: bool,
        limit: usize,
    ) -> Result<Snapshot> {
        let mut slot = slot.lock().await;
        if let Some((at, snap)) = slot.as_ref() {
            if at.elapsed() < SESSION_TTL {
                return Ok(snap.clone());
            }
        }
        let (ctx, versions) = lake.session_at_versions().await?;
        crate::udfs::register_all(&ctx);
        if pg {
            pg::add_pg_catalog(&ctx)?;
        }
        crate::sql::bounded::register(&ctx, limit);
        let snap = Snapshot { ctx: Arc::new(ctx), versions: Arc::new(versions) };
        *slot = Some((Instant::now(), snap.clone()));
        Ok(snap)
    }

    /// Runs `sql` (DataFusion's dialect) over the lake as it is now, if it only reads, under
    /// the server's limits and at most `rows` rows.
    pub async fn query(&self, sql: &str, rows: usize) -> Result<Limited, QueryError> {
        self.query_with(sql, Vec::new(), rows).await
    }

    /// [`Shared::query`] with its placeholders (`$1`, `$2`…) bound to `params` after planning:
    /// the console's own queries put what a visitor typed in as values, never as SQL text.
    pub async fn query_with(&self, sql: &str, params: Vec<ScalarValue>, rows: usize) -> Result<Limited, QueryError> {
        let ctx = self.session().await.map_err(|e| QueryError::Failed(one_line(&format!("{e:#}"))))?;
        let state = ctx.state();
        let mut plan = crate::sql::guard::plan(&state, sql).await?;
        if !params.is_empty() {
            plan = plan.with_param_values(params).map_err(|e| QueryError::from_datafusion(&e))?;
        }
        self.limits.run(&state, plan, self.limits.time, rows).await
    }
}

/// Serves the console (and the wire protocol when asked) until the process is stopped.
pub async fn serve(lake: Lake, opts: ServeOptions) -> Result<()> {
    check_bind(&opts.bind, opts.token.as_deref(), "--bind")?;
    if let Some(pg) = &opts.pg_bind {
        check_bind(pg, opts.token.as_deref(), "--pg-bind")?;
    }
    let listener = tokio::net::TcpListener::bind(opts.bind)
        .await
        .with_context(|| format!("binding the console to {}", opts.bind))?;
    let addr = listener.local_addr()?;
    let shared = Shared::new(lake, opts.clone(), addr);
    // Fail now, not on the first page, when the lake cannot be read.
    shared.session().await.context("opening the lake's tables")?;
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
