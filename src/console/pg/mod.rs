//! The PostgreSQL wire protocol over the lake (`swelake serve --pg-bind`), through
//! `datafusion-postgres` (pgwire, and a `pg_catalog` that psql's, DBeaver's, Metabase's and
//! Grafana's catalogue queries read).
//!
//! Every statement of every protocol path goes through one gate (`Gate`):
//! - statements that need a plan (queries, `EXPLAIN [ANALYZE]`, `SHOW ALL`, and anything a
//!   client might try to write with) are planned as datafusion-postgres plans them, decided
//!   on by [`crate::sql::guard::check`], and run under the server's
//!   [`Limits`](crate::console::Limits) (time, rows, memory, slots), on the simple protocol,
//!   the extended one (prepared statements, JDBC, psycopg 3), and in `DECLARE … CURSOR`;
//! - session statements (`SET`, `RESET`, `SHOW x`, `DISCARD`, transactions, `FETCH`, `CLOSE`)
//!   change only the connection that sent them, and only the settings of the `settings` module's
//!   allow-list.
//!
//! Each connection has a session state of its own, built on the shared catalogue of the lake
//! as it was when the connection opened.

mod settings;

use std::fmt::Debug;
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use datafusion::common::ParamValues;
use datafusion::execution::SessionStateBuilder;
use datafusion::logical_expr::{EmptyRelation, LogicalPlan};
use datafusion::prelude::SessionContext;
use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{Declare, DeclareType, Statement};
use datafusion_postgres::arrow_pg::datatypes::df::deserialize_parameters_with_server_types;
use datafusion_postgres::arrow_pg::datatypes::{arrow_schema_to_pg_fields, encode_recordbatch};
use datafusion_postgres::datafusion_pg_catalog::sql::PostgresCompatibilityParser;
use datafusion_postgres::hooks::cursor::CursorStatementHook;
use datafusion_postgres::hooks::set_show::SetShowHook;
use datafusion_postgres::hooks::transactions::TransactionStatementHook;
use datafusion_postgres::hooks::HookClient;
use datafusion_postgres::pgwire;
use datafusion_postgres::{DfSessionService, Parser, QueryHook};
use futures::Sink;
use pgwire::api::auth::cleartext::CleartextPasswordAuthStartupHandler;
use pgwire::api::auth::noop::NoopStartupHandler;
use pgwire::api::auth::{AuthSource, DefaultServerParameterProvider, LoginInfo, Password, StartupHandler};
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{
    DescribePortalResponse, DescribeStatementResponse, FieldInfo, QueryResponse, Response, Tag,
};
use pgwire::api::stmt::{QueryParser, StoredStatement};
use pgwire::api::store::PortalStore;
use pgwire::api::{ClientInfo, ClientPortalStore, PgWireServerHandlers, Type};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::response::NoticeResponse;
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use pgwire::types::format::FormatOptions;
use tokio::net::TcpListener;

use super::{Limited, Shared};
use crate::sql::guard::{self, QueryError};

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
            let catalogue = match shared.pg_session().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!("a PostgreSQL client from {peer}: the lake could not be read: {e:#}");
                    return;
                }
            };
            // The connection's own state (settings, prepared plans) over the shared tables and
            // functions: what one client changes, no other sees.
            let own = SessionStateBuilder::new_from_existing(catalogue.state()).build();
            let ctx = Arc::new(SessionContext::new_with_state(own));
            let gate = Arc::new(Gate { shared });
            let service = Arc::new(DfSessionService::new_with_hooks(ctx.clone(), vec![gate.clone()]));
            let simple = Arc::new(Simple { service: service.clone(), ctx: ctx.clone() });
            let parser =
                Arc::new(GateParser { inner: ExtendedQueryHandler::query_parser(service.as_ref()), ctx: ctx.clone() });
            let extended = Arc::new(Extended { service, parser, gate, ctx });
            let handlers = Arc::new(Connection { simple, extended, startup });
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
    simple: Arc<Simple>,
    extended: Arc<Extended>,
    startup: Arc<Startup>,
}

impl PgWireServerHandlers for Connection {
    fn simple_query_handler(&self) -> Arc<impl SimpleQueryHandler> {
        self.simple.clone()
    }

    fn extended_query_handler(&self) -> Arc<impl ExtendedQueryHandler> {
        self.extended.clone()
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

/// A [`QueryError`] as the client reads it: its SQLSTATE and one line.
fn pg_error(e: QueryError) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new("ERROR".into(), e.sqlstate().into(), e.to_string())))
}

pub(super) fn user_error(sqlstate: &str, message: String) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new("ERROR".into(), sqlstate.into(), message)))
}

pub(super) async fn notice(client: &mut dyn HookClient, message: String) -> PgWireResult<()> {
    let info = ErrorInfo::new("NOTICE".into(), "01000".into(), message);
    client.send_message(PgWireBackendMessage::NoticeResponse(NoticeResponse::from(info))).await
}

/// The PostgreSQL dialect datafusion-postgres parses with (built once: it compiles its rewrite
/// rules).
fn pg_parser() -> &'static PostgresCompatibilityParser {
    static PARSER: OnceLock<PostgresCompatibilityParser> = OnceLock::new();
    PARSER.get_or_init(PostgresCompatibilityParser::new)
}

/// SQL that PostgreSQL's dialect does not parse. DataFusion's own dialect might, and plan a
/// write the client meant (`CREATE EXTERNAL TABLE … STORED AS CSV`): that is refused as one
/// (25006); anything else is the syntax error it is (42601). Nothing here runs.
async fn unparsed(ctx: &SessionContext, sql: &str, error: &str) -> PgWireError {
    let state = ctx.state();
    if let Ok(statements) = datafusion::sql::parser::DFParser::parse_sql(sql) {
        for statement in statements {
            if let Ok(plan) = state.statement_to_plan(statement).await {
                if let Err(refused) = guard::check(&plan) {
                    return pg_error(refused);
                }
            }
        }
    }
    user_error("42601", format!("syntax error: {}", guard::one_line(error)))
}

/// The simple protocol: datafusion-postgres' statement loop, every statement handed to the
/// gate (its only hook), after a parse that turns a write in DataFusion's dialect into a
/// refusal.
struct Simple {
    service: Arc<DfSessionService>,
    ctx: Arc<SessionContext>,
}

#[async_trait]
impl SimpleQueryHandler for Simple {
    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if let Err(e) = pg_parser().parse(query) {
            return Err(unparsed(&self.ctx, query, &e.to_string()).await);
        }
        SimpleQueryHandler::do_query(self.service.as_ref(), client, query).await
    }
}

/// datafusion-postgres' parser for the extended protocol (the gate decides on its plans),
/// with the same turn of unparsed writes into refusals.
struct GateParser {
    inner: Arc<Parser>,
    ctx: Arc<SessionContext>,
}

#[async_trait]
impl QueryParser for GateParser {
    type Statement = (String, Option<(Statement, LogicalPlan)>);

    async fn parse_sql<C>(&self, client: &C, sql: &str, types: &[Option<Type>]) -> PgWireResult<Option<Self::Statement>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        if let Err(e) = pg_parser().parse(sql) {
            return Err(unparsed(&self.ctx, sql, &e.to_string()).await);
        }
        self.inner.parse_sql(client, sql, types).await
    }

    fn get_parameter_types(&self, stmt: &Self::Statement) -> PgWireResult<Vec<Type>> {
        self.inner.get_parameter_types(stmt)
    }

    fn get_result_schema(&self, stmt: &Self::Statement, format: Option<&Format>) -> PgWireResult<Vec<FieldInfo>> {
        self.inner.get_result_schema(stmt, format)
    }
}

/// Whether a statement is about the connection (answered by [`settings`] or
/// datafusion-postgres' session hooks) rather than planned and decided on.
fn is_session_statement(s: &Statement) -> bool {
    match s {
        Statement::ShowVariable { variable } => !settings::shown_by_the_engine(variable),
        Statement::Set(_)
        | Statement::Reset(_)
        | Statement::ShowCatalogs { .. }
        | Statement::StartTransaction { .. }
        | Statement::Commit { .. }
        | Statement::Rollback { .. }
        | Statement::Declare { .. }
        | Statement::Fetch { .. }
        | Statement::Close { .. }
        | Statement::Discard { .. }
        | Statement::Deallocate { .. } => true,
        _ => false,
    }
}

/// Plans a statement as datafusion-postgres does: from its syntax tree (the extended
/// protocol's way), else from its text in DataFusion's own dialect (the simple protocol's way,
/// which knows `COPY … TO` and `CREATE EXTERNAL TABLE`). Either way the plan is decided on.
async fn plan_statement(ctx: &SessionContext, statement: &Statement) -> Result<LogicalPlan, QueryError> {
    let state = ctx.state();
    let plan = match state.statement_to_plan(DfStatement::Statement(Box::new(statement.clone()))).await {
        Ok(p) => p,
        Err(first) => match state.create_logical_plan(&statement.to_string()).await {
            Ok(p) => p,
            Err(_) => return Err(QueryError::from_datafusion(&first)),
        },
    };
    guard::check(&plan)?;
    Ok(plan)
}

/// Rows as the wire protocol sends them, in the format the client asked for.
fn encode(limited: Limited, format: &Format, client: &(dyn ClientInfo + Send + Sync)) -> PgWireResult<QueryResponse> {
    let options = Arc::new(FormatOptions::from_client_metadata(client.metadata()));
    let fields = Arc::new(arrow_schema_to_pg_fields(&limited.schema, format, Some(options))?);
    let each = fields.clone();
    let rows = limited.batches.into_iter().flat_map(move |b| encode_recordbatch(each.clone(), b));
    Ok(QueryResponse::new(fields, futures::stream::iter(rows)))
}

/// Rows a catalogue query returns at most, whatever `--row-limit` says (DBeaver reads every
/// function in `pg_proc`).
const CATALOGUE_ROWS: usize = 100_000;

/// Whether every table a plan scans is PostgreSQL's catalogue (`pg_catalog`,
/// `information_schema`), named with its schema or without it.
fn reads_only_the_catalogue(ctx: &SessionContext, plan: &LogicalPlan) -> bool {
    use datafusion::common::tree_node::TreeNodeRecursion;
    const CATALOGUES: [&str; 2] = ["pg_catalog", "information_schema"];
    let bare: Vec<String> = ctx
        .catalog("datafusion")
        .into_iter()
        .flat_map(|c| CATALOGUES.iter().filter_map(move |s| c.schema(s)))
        .flat_map(|s| s.table_names())
        .collect();
    let lake = crate::sql::table_names(ctx);
    let (mut scans, mut all) = (0, true);
    let _ = plan.apply_with_subqueries(|node| {
        if let LogicalPlan::TableScan(scan) = node {
            scans += 1;
            let t = &scan.table_name;
            let catalogue = match t.schema() {
                Some(schema) => CATALOGUES.contains(&schema),
                None => bare.iter().any(|b| b == t.table()) && !lake.iter().any(|l| l == t.table()),
            };
            all &= catalogue;
        }
        Ok(if all { TreeNodeRecursion::Continue } else { TreeNodeRecursion::Stop })
    });
    scans > 0 && all
}

/// The one hook of every connection: nothing reaches datafusion-postgres' own execution.
struct Gate {
    shared: Arc<Shared>,
}

impl Gate {
    /// Runs a decided plan under the limits (the client's `statement_timeout` when lower);
    /// a cut result says so in a notice.
    async fn run(&self, ctx: &SessionContext, plan: LogicalPlan, client: &mut dyn HookClient) -> PgWireResult<Limited> {
        let limits = &self.shared.limits;
        let time = settings::statement_timeout(client).map_or(limits.time, |t| t.min(limits.time));
        // A client's catalogue queries (JDBC's getTables, psql's \d) are answered whole (a cut
        // catalogue would hide tables from the tool), up to a cap that a cross join of catalogue
        // tables meets long before memory does.
        let rows = if reads_only_the_catalogue(ctx, &plan) { limits.rows.max(CATALOGUE_ROWS) } else { limits.rows };
        let limited = limits.run(&ctx.state(), plan, time, rows).await.map_err(pg_error)?;
        if limited.truncated {
            notice(client, format!("the result was cut to its first {} rows (swelake serve --row-limit)", limits.rows))
                .await?;
        }
        Ok(limited)
    }

    async fn statement(
        &self,
        statement: &Statement,
        ctx: &SessionContext,
        client: &mut dyn HookClient,
    ) -> PgWireResult<Response> {
        // Transactions, and PostgreSQL's rule that an aborted one refuses all but its end.
        if let Some(r) = TransactionStatementHook.handle_simple_query(statement, ctx, client).await {
            return r;
        }
        if !is_session_statement(statement) {
            let plan = plan_statement(ctx, statement).await.map_err(pg_error)?;
            let limited = self.run(ctx, plan, client).await?;
            return encode(limited, &Format::UnifiedText, client).map(Response::Query);
        }
        match statement {
            Statement::Declare { stmts } => self.declare(stmts, ctx, client).await,
            Statement::Fetch { .. } | Statement::Close { .. } | Statement::ShowCatalogs { .. } => {
                let hooked = match statement {
                    Statement::ShowCatalogs { .. } => SetShowHook.handle_simple_query(statement, ctx, client).await,
                    _ => CursorStatementHook.handle_simple_query(statement, ctx, client).await,
                };
                hooked.unwrap_or_else(|| Err(user_error("0A000", format!("`{statement}` is not supported here"))))
            }
            _ => settings::answer(statement, ctx, client, &self.shared.limits).await,
        }
    }

    /// `DECLARE name CURSOR FOR query`: the query decided on and run under the limits now, its
    /// rows (at most `--row-limit`) kept for `FETCH`.
    async fn declare(
        &self,
        stmts: &[Declare],
        ctx: &SessionContext,
        client: &mut dyn HookClient,
    ) -> PgWireResult<Response> {
        for d in stmts {
            let (Some(DeclareType::Cursor), Some(name), Some(query)) = (&d.declare_type, d.names.first(), &d.for_query)
            else {
                return Err(user_error("42601", format!("only `DECLARE name CURSOR FOR query` is supported: {d}")));
            };
            let plan = plan_statement(ctx, &Statement::Query(query.clone())).await.map_err(pg_error)?;
            let plan_of_columns = plan.clone();
            let limited = self.run(ctx, plan, client).await?;
            let rows = encode(limited, &Format::UnifiedText, client)?;
            // The plan is kept for its columns (a FETCH's Describe); the rows are already here.
            let stored = Arc::new(StoredStatement::new(
                name.value.clone(),
                (query.to_string(), Some((Statement::Query(query.clone()), plan_of_columns))),
                vec![],
            ));
            let portal = Portal::new_cursor(name.value.clone(), stored);
            portal.start(rows).await;
            client.portal_store().put_portal(Arc::new(portal));
        }
        Ok(Response::Execution(Tag::new("DECLARE CURSOR")))
    }
}

#[async_trait]
impl QueryHook for Gate {
    async fn handle_simple_query(
        &self,
        statement: &Statement,
        ctx: &SessionContext,
        client: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        Some(self.statement(statement, ctx, client).await)
    }

    /// Parse (and so every prepared statement) plans and decides now: a write is refused
    /// before it can be bound or executed.
    async fn handle_extended_parse_query(
        &self,
        statement: &Statement,
        ctx: &SessionContext,
        client: &(dyn ClientInfo + Send + Sync),
    ) -> Option<PgWireResult<LogicalPlan>> {
        if !is_session_statement(statement) {
            return Some(plan_statement(ctx, statement).await.map_err(pg_error));
        }
        // Session statements have no plan; their result shape is what Describe reports.
        if let Some(p) = SetShowHook.handle_extended_parse_query(statement, ctx, client).await {
            return Some(p);
        }
        Some(Ok(LogicalPlan::EmptyRelation(EmptyRelation {
            produce_one_row: false,
            schema: Arc::new(datafusion::common::DFSchema::empty()),
        })))
    }

    /// Reached for session statements only ([`Extended`] runs the planned ones); a planned one
    /// would still be decided on and limited here, in text format.
    async fn handle_extended_query(
        &self,
        statement: &Statement,
        _plan: &LogicalPlan,
        _params: &ParamValues,
        ctx: &SessionContext,
        client: &mut dyn HookClient,
    ) -> Option<PgWireResult<Response>> {
        Some(self.statement(statement, ctx, client).await)
    }
}

/// The extended protocol: datafusion-postgres' parser (with the gate deciding at Parse), and
/// execution of the planned statements under the limits, in each column's requested format.
struct Extended {
    service: Arc<DfSessionService>,
    parser: Arc<GateParser>,
    gate: Arc<Gate>,
    ctx: Arc<SessionContext>,
}

#[async_trait]
impl ExtendedQueryHandler for Extended {
    type Statement = (String, Option<(Statement, LogicalPlan)>);
    type QueryParser = GateParser;

    fn query_parser(&self) -> Arc<GateParser> {
        self.parser.clone()
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<Self::Statement>,
        max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let (_, Some((statement, plan))) = &portal.statement.statement else {
            return Ok(Response::EmptyQuery);
        };
        if is_session_statement(statement) {
            return ExtendedQueryHandler::do_query(self.service.as_ref(), client, portal, max_rows).await;
        }
        // The parameter types the server described, so values decode as the client bound them.
        let types: Vec<Type> = self.query_parser().get_parameter_types(&portal.statement.statement)?;
        let server_types: Vec<Option<&Type>> = types.iter().map(Some).collect();
        let params = deserialize_parameters_with_server_types(portal, &[], &server_types)?;
        let plan =
            plan.clone().replace_params_with_values(&params).map_err(|e| pg_error(QueryError::from_datafusion(&e)))?;
        let limited = self.gate.run(&self.ctx, plan, client).await?;
        encode(limited, &portal.result_column_format, client).map(Response::Query)
    }

    /// As pgwire's, but a `FETCH` is described by its cursor's columns, as PostgreSQL does
    /// (psycopg's server-side cursors read them before fetching).
    async fn do_describe_statement<C>(
        &self,
        client: &mut C,
        target: &StoredStatement<Self::Statement>,
    ) -> PgWireResult<DescribeStatementResponse>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if let Some(fields) = cursor_fields(client.portal_store(), &target.statement, &Format::UnifiedText)? {
            return Ok(DescribeStatementResponse::new(vec![], fields));
        }
        let parser = self.query_parser();
        let server = parser.get_parameter_types(&target.statement)?;
        let n = target.parameter_types.len().max(server.len());
        // The client's types where it gave them, else the server's.
        let types = (0..n)
            .map(|i| {
                target
                    .parameter_types
                    .get(i)
                    .cloned()
                    .flatten()
                    .or_else(|| server.get(i).cloned())
                    .unwrap_or(Type::UNKNOWN)
            })
            .collect();
        Ok(DescribeStatementResponse::new(types, parser.get_result_schema(&target.statement, None)?))
    }

    async fn do_describe_portal<C>(
        &self,
        client: &mut C,
        target: &Portal<Self::Statement>,
    ) -> PgWireResult<DescribePortalResponse>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let format = &target.result_column_format;
        if let Some(fields) = cursor_fields(client.portal_store(), &target.statement.statement, format)? {
            return Ok(DescribePortalResponse::new(fields));
        }
        let fields = self.query_parser().get_result_schema(&target.statement.statement, Some(format))?;
        Ok(DescribePortalResponse::new(fields))
    }
}

/// The columns of the cursor a `FETCH` reads, if the statement is one and the cursor exists.
fn cursor_fields<P>(
    store: &P,
    statement: &(String, Option<(Statement, LogicalPlan)>),
    format: &Format,
) -> PgWireResult<Option<Vec<FieldInfo>>>
where
    P: PortalStore<Statement = (String, Option<(Statement, LogicalPlan)>)>,
{
    let (_, Some((Statement::Fetch { name, .. }, _))) = statement else { return Ok(None) };
    let Some(entry) = store.get_portal(&name.value) else { return Ok(None) };
    let Some(cursor) = entry.value() else { return Ok(None) };
    let Some((_, plan)) = &cursor.statement.statement.1 else { return Ok(None) };
    arrow_schema_to_pg_fields(plan.schema().as_arrow(), format, None).map(Some)
}
