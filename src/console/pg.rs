//! The PostgreSQL wire protocol over the lake (`swelake serve --pg-bind`), through
//! `datafusion-postgres` (pgwire, and a `pg_catalog` that psql's, DBeaver's, Metabase's and
//! Grafana's catalogue queries read). Each connection reads the lake as it was when it
//! connected; statements other than queries are refused before they are planned.

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::common::ParamValues;
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::Statement;
use datafusion_postgres::arrow_pg::datatypes::df::encode_dataframe;
use datafusion_postgres::hooks::cursor::CursorStatementHook;
use datafusion_postgres::hooks::set_show::SetShowHook;
use datafusion_postgres::hooks::transactions::TransactionStatementHook;
use datafusion_postgres::hooks::HookClient;
use datafusion_postgres::pgwire;
use datafusion_postgres::{DfSessionService, QueryHook};
use futures::Sink;
use pgwire::api::auth::cleartext::CleartextPasswordAuthStartupHandler;
use pgwire::api::auth::noop::NoopStartupHandler;
use pgwire::api::auth::{AuthSource, DefaultServerParameterProvider, LoginInfo, Password, StartupHandler};
use pgwire::api::results::{QueryResponse, Response};
use pgwire::api::{ClientInfo, PgWireServerHandlers};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::response::NoticeResponse;
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use pgwire::types::format::FormatOptions;
use tokio::net::TcpListener;

use super::Shared;

/// Accepts connections until the listener fails.
pub(super) async fn serve(listener: TcpListener, shared: Arc<Shared>) -> anyhow::Result<()> {
    let startup = Arc::new(match &shared.opts.token {
        None => Startup::Open(Open),
        Some(t) => Startup::Password(Box::new(CleartextPasswordAuthStartupHandler::new(
            Token(t.clone()),
            DefaultServerParameterProvider::default(),
        ))),
    });
    loop {
        let (socket, peer) = listener.accept().await?;
        let (shared, startup) = (shared.clone(), startup.clone());
        tokio::spawn(async move {
            let ctx = match shared.pg_session().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!("a PostgreSQL client from {peer}: the lake could not be read: {e:#}");
                    return;
                }
            };
            let hooks: Vec<Arc<dyn QueryHook>> = vec![
                Arc::new(ReadOnly { row_limit: shared.opts.row_limit, timeout: shared.opts.timeout }),
                Arc::new(CursorStatementHook),
                Arc::new(SetShowHook),
                Arc::new(TransactionStatementHook),
            ];
            let handlers =
                Arc::new(Connection { service: Arc::new(DfSessionService::new_with_hooks(ctx, hooks)), startup });
            if let Err(e) = pgwire::tokio::process_socket(socket, None, handlers).await {
                tracing::debug!("a PostgreSQL client from {peer}: {e}");
            }
        });
    }
}

/// The pg_catalog schema and functions on top of the console's session.
pub(super) fn add_pg_catalog(ctx: &SessionContext) -> anyhow::Result<()> {
    let auth = Arc::new(datafusion_postgres::auth::AuthManager::new());
    datafusion_postgres::datafusion_pg_catalog::pg_catalog::setup_pg_catalog(ctx, "datafusion", auth)
        .map_err(|e| anyhow::anyhow!("setting up pg_catalog: {e}"))
}

struct Connection {
    service: Arc<DfSessionService>,
    startup: Arc<Startup>,
}

impl PgWireServerHandlers for Connection {
    fn simple_query_handler(&self) -> Arc<impl pgwire::api::query::SimpleQueryHandler> {
        self.service.clone()
    }

    fn extended_query_handler(&self) -> Arc<impl pgwire::api::query::ExtendedQueryHandler> {
        self.service.clone()
    }

    fn startup_handler(&self) -> Arc<impl StartupHandler> {
        self.startup.clone()
    }
}

/// Any user and database (loopback without a token), or the token as the password.
enum Startup {
    Open(Open),
    Password(Box<CleartextPasswordAuthStartupHandler<Token, DefaultServerParameterProvider>>),
}

struct Open;

impl NoopStartupHandler for Open {}

#[async_trait]
impl StartupHandler for Startup {
    async fn on_startup<C>(&self, client: &mut C, message: PgWireFrontendMessage) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        match self {
            Startup::Open(h) => h.on_startup(client, message).await,
            Startup::Password(h) => h.on_startup(client, message).await,
        }
    }
}

#[derive(Debug)]
struct Token(String);

#[async_trait]
impl AuthSource for Token {
    async fn get_password(&self, _login: &LoginInfo) -> PgWireResult<Password> {
        Ok(Password::new(None, self.0.as_bytes().to_vec()))
    }
}

/// Refuses whatever is not a query, and runs simple-protocol queries under the console's time
/// and row limits.
struct ReadOnly {
    row_limit: usize,
    timeout: std::time::Duration,
}

/// The statements a read-only server answers: queries, and the session statements that
/// clients send on connect (`SET`, `SHOW`, transactions, cursors).
fn is_read(s: &Statement) -> bool {
    matches!(
        s,
        Statement::Query(_)
            | Statement::Explain { .. }
            | Statement::ExplainTable { .. }
            | Statement::ShowVariable { .. }
            | Statement::ShowVariables { .. }
            | Statement::ShowStatus { .. }
            | Statement::ShowTables { .. }
            | Statement::ShowColumns { .. }
            | Statement::ShowFunctions { .. }
            | Statement::ShowCatalogs { .. }
            | Statement::ShowSchemas { .. }
            | Statement::ShowCreate { .. }
            | Statement::Set(_)
            | Statement::StartTransaction { .. }
            | Statement::Commit { .. }
            | Statement::Rollback { .. }
            | Statement::Declare { .. }
            | Statement::Fetch { .. }
            | Statement::Close { .. }
            | Statement::Discard { .. }
            | Statement::Deallocate { .. }
    )
}

fn refusal(s: &Statement) -> PgWireError {
    let text = s.to_string();
    let verb: String = text.split_whitespace().take(2).collect::<Vec<_>>().join(" ");
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".into(),
        "25006".into(), // read_only_sql_transaction
        format!(
            "swelake serves the lake read-only: `{verb} …` is refused; only queries run (SELECT, WITH, SHOW, EXPLAIN)"
        ),
    )))
}

#[async_trait]
impl QueryHook for ReadOnly {
    async fn handle_simple_query(
        &self,
        statement: &Statement,
        ctx: &SessionContext,
        client: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        if !is_read(statement) {
            return Some(Err(refusal(statement)));
        }
        if !matches!(statement, Statement::Query(_)) {
            return None;
        }
        let limited = match super::query_limited(ctx, &statement.to_string(), self.row_limit, self.timeout).await {
            Ok(l) => l,
            Err(e) => {
                return Some(Err(PgWireError::UserError(Box::new(ErrorInfo::new(
                    "ERROR".into(),
                    if e.to_string().contains("time limit") { "57014".into() } else { "42000".into() },
                    e.to_string(),
                )))))
            }
        };
        if limited.truncated {
            let notice = ErrorInfo::new(
                "NOTICE".into(),
                "01000".into(),
                format!("the result was cut to its first {} rows (swelake serve --row-limit)", self.row_limit),
            );
            if let Err(e) =
                client.send_message(PgWireBackendMessage::NoticeResponse(NoticeResponse::from(notice))).await
            {
                return Some(Err(e));
            }
        }
        // The batches' own schema: the plan's may differ in nullability, which a table checks.
        let schema = limited.batches.first().map_or(limited.schema.clone(), |b| b.schema());
        let table = datafusion::datasource::MemTable::try_new(schema, vec![limited.batches]);
        let df = match table.and_then(|t| ctx.read_table(Arc::new(t))) {
            Ok(df) => df,
            Err(e) => return Some(Err(PgWireError::ApiError(Box::new(e)))),
        };
        let format = Arc::new(FormatOptions::from_client_metadata(client.metadata()));
        Some(
            encode_dataframe(df, &pgwire::api::portal::Format::UnifiedText, Some(format))
                .await
                .map(|r: QueryResponse| Response::Query(r)),
        )
    }

    async fn handle_extended_parse_query(
        &self,
        statement: &Statement,
        _ctx: &SessionContext,
        _client: &(dyn ClientInfo + Send + Sync),
    ) -> Option<PgWireResult<LogicalPlan>> {
        (!is_read(statement)).then(|| Err(refusal(statement)))
    }

    async fn handle_extended_query(
        &self,
        statement: &Statement,
        _plan: &LogicalPlan,
        _params: &ParamValues,
        _ctx: &SessionContext,
        _client: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        (!is_read(statement)).then(|| Err(refusal(statement)))
    }
}
