//! `swelake serve`: the web console and the PostgreSQL wire protocol over a lake.

use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;

use super::args::{ConfigArg, JobsArgs, LakeArg};
use super::{parse_duration, parse_size, Ctx};

#[derive(Args, Debug)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    lake: LakeArg,
    /// The web console's address. Off loopback it needs --token.
    #[arg(long, default_value = "127.0.0.1:8080")]
    bind: SocketAddr,
    /// Also serve the PostgreSQL wire protocol here (psql, DBeaver, Metabase, Grafana), e.g.
    /// 127.0.0.1:5433. Off loopback it needs --token.
    #[arg(long, value_name = "ADDR")]
    pg_bind: Option<SocketAddr>,
    /// A secret that clients must present: `Authorization: Bearer TOKEN` over HTTP, the
    /// password over the wire protocol. Required to bind off loopback.
    #[arg(long, env = "SWELAKE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Rows a query returns at most, on every path (HTTP, PostgreSQL simple and extended
    /// queries, cursors); a cut result says so.
    #[arg(long, default_value_t = 10_000)]
    row_limit: usize,
    /// How long a query may take, waiting for a slot included: 30s, 2m. A PostgreSQL client's
    /// `SET statement_timeout` can lower it for its connection, never raise it.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    timeout: std::time::Duration,
    /// Memory one query's operators may hold (sorts, joins, aggregates spill to disk past it
    /// where they can; a query that cannot fails with SQLSTATE 53200): 512MiB, 2GiB.
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    memory_limit: u64,
    /// Queries that run at once, over HTTP and PostgreSQL together; more wait for a slot
    /// within their time limit. Default: the machine's cores.
    #[arg(long, value_name = "N")]
    max_queries: Option<usize>,
    /// Answer to this Host name too (repeatable): the public name of a reverse proxy in front
    /// of the console. Other names are refused (403), so a DNS-rebinding page cannot read it.
    #[arg(long, value_name = "NAME")]
    allow_host: Vec<String>,
    #[command(flatten)]
    jobs: JobsArgs,
    #[command(flatten)]
    config: ConfigArg,
}

impl ServeArgs {
    pub(crate) async fn run(self, ctx: &Ctx) -> Result<ExitCode> {
        let a = self;
        let lake = a.lake.open(ctx)?;
        let opts = crate::console::ServeOptions {
            bind: a.bind,
            pg_bind: a.pg_bind,
            token: a.token.filter(|t| !t.is_empty()),
            row_limit: a.row_limit.max(1),
            timeout: a.timeout,
            memory_limit: usize::try_from(a.memory_limit).unwrap_or(usize::MAX),
            max_queries: a
                .max_queries
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
                .max(1),
            allow_hosts: a.allow_host,
            registry: a.jobs.registry()?,
            run: crate::jobs::RunOptions { curation: a.config.load()?, ..Default::default() },
        };
        crate::console::serve(lake, opts).await?;
        Ok(ExitCode::SUCCESS)
    }
}
