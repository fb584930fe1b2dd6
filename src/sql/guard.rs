//! What "read-only" means, decided in one place for every way the lake is queried: `swelake
//! sql` and its shell, the console's HTTP API, and every path of the PostgreSQL wire protocol
//! (simple and extended queries, prepared statements, cursors, `EXPLAIN`, `EXPLAIN ANALYZE`).
//!
//! The decision is taken on the **logical plan**, not on the statement's first word, as
//! PostgreSQL's read-only transactions, ClickHouse's `readonly = 1` and Trino's read-only access
//! control do: a plan runs only if none of its nodes writes, subqueries and the plan under
//! `EXPLAIN [ANALYZE]` included (`EXPLAIN ANALYZE` executes what it explains, so
//! `EXPLAIN ANALYZE COPY … TO` would write its file). Whatever the SQL said, a plan with a
//! `Dml` (INSERT, UPDATE, DELETE, CREATE TABLE AS), `Copy` (`COPY … TO`), `Ddl` (CREATE,
//! DROP), `Statement` (SET, PREPARE, EXECUTE, transactions) or unknown `Extension` node is
//! refused with SQLSTATE 25006 and a one-line reason.

use std::fmt;
use std::time::Duration;

use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::DataFusionError;
use datafusion::execution::context::SessionState;
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{DdlStatement, LogicalPlan, WriteOp};

/// Why a query did not run (or did not finish), with the SQLSTATE a PostgreSQL client reads.
#[derive(Debug)]
pub enum QueryError {
    /// The plan writes, or changes the session: SQLSTATE 25006 (read_only_sql_transaction).
    ReadOnly(String),
    /// Past its time limit, waiting for a query slot included: 57014 (query_canceled).
    /// `client`: the limit was the client's own, lower one (`statement_timeout`).
    Timeout { limit: Duration, waiting: bool, client: bool },
    /// Past the per-query memory limit: 53200 (out_of_memory).
    Memory(String),
    /// The SQL does not parse: 42601 (syntax_error).
    Syntax(String),
    /// A table or column the query names is not there, or another planning error: 42P01,
    /// 42703 or 42000.
    Plan { sqlstate: &'static str, message: String },
    /// It failed while running: XX000.
    Failed(String),
}

impl QueryError {
    /// The SQLSTATE of this error.
    pub fn sqlstate(&self) -> &'static str {
        match self {
            QueryError::ReadOnly(_) => "25006",
            QueryError::Timeout { .. } => "57014",
            QueryError::Memory(_) => "53200",
            QueryError::Syntax(_) => "42601",
            QueryError::Plan { sqlstate, .. } => sqlstate,
            QueryError::Failed(_) => "XX000",
        }
    }

    /// A DataFusion error, classified by its kind (the innermost of its wrappers).
    pub fn from_datafusion(e: &DataFusionError) -> QueryError {
        let text = one_line(&e.to_string());
        match e.find_root() {
            DataFusionError::ResourcesExhausted(_) => QueryError::Memory(text),
            DataFusionError::SQL(..) => QueryError::Syntax(text),
            DataFusionError::SchemaError(s, _) => {
                let sqlstate = match s.as_ref() {
                    datafusion::common::SchemaError::FieldNotFound { .. } => "42703",
                    _ => "42000",
                };
                QueryError::Plan { sqlstate, message: text }
            }
            DataFusionError::Plan(m) if m.starts_with("table '") && m.ends_with("' not found") => {
                QueryError::Plan { sqlstate: "42P01", message: text }
            }
            DataFusionError::Plan(_) | DataFusionError::NotImplemented(_) | DataFusionError::Configuration(_) => {
                QueryError::Plan { sqlstate: "42000", message: text }
            }
            _ => QueryError::Failed(text),
        }
    }
}

impl fmt::Display for QueryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueryError::ReadOnly(why) => write!(f, "swelake serves the lake read-only: {why}"),
            QueryError::Timeout { limit, waiting, client } => {
                let whose = if *client { "the connection's statement_timeout" } else { "swelake serve --timeout" };
                let secs = limit.as_secs_f64();
                if *waiting {
                    write!(
                        f,
                        "canceling statement: no query slot came free within its time limit of {secs} s \
                         ({whose}; swelake serve --max-queries)"
                    )
                } else {
                    write!(f, "canceling statement: it ran past the time limit of {secs} s ({whose})")
                }
            }
            QueryError::Memory(m) => {
                write!(f, "the query needs more memory than one query may use (swelake serve --memory-limit): {m}")
            }
            QueryError::Syntax(m) | QueryError::Plan { message: m, .. } | QueryError::Failed(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for QueryError {}

/// The one decision: `Ok` when no node of `plan` writes or changes the session. Subqueries and
/// the plans under `EXPLAIN` and `EXPLAIN ANALYZE` are looked into.
pub fn check(plan: &LogicalPlan) -> Result<(), QueryError> {
    let mut refused = None;
    let walked = plan.apply_with_subqueries(|node| {
        refused = writes(node);
        Ok(if refused.is_some() { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
    });
    if let Err(e) = walked {
        return Err(QueryError::from_datafusion(&e));
    }
    refused.map_or(Ok(()), |why| Err(QueryError::ReadOnly(why)))
}

/// What a node would do that a read-only lake refuses, as the end of a sentence.
fn writes(node: &LogicalPlan) -> Option<String> {
    let why = match node {
        LogicalPlan::Dml(d) => {
            let verb = match &d.op {
                WriteOp::Insert(InsertOp::Append) => "INSERT INTO",
                WriteOp::Insert(InsertOp::Overwrite) => "INSERT OVERWRITE",
                WriteOp::Insert(InsertOp::Replace) => "REPLACE INTO",
                WriteOp::Delete => "DELETE FROM",
                WriteOp::Update => "UPDATE",
                WriteOp::Ctas => "CREATE TABLE AS",
                WriteOp::Truncate => "TRUNCATE",
                _ => "a write to",
            };
            format!("`{verb} {}` would write to a table", d.table_name)
        }
        LogicalPlan::Copy(c) => format!("`COPY … TO '{}'` would write files", c.output_url),
        LogicalPlan::Ddl(d) => {
            let what = match d {
                DdlStatement::CreateExternalTable(t) => format!("CREATE EXTERNAL TABLE {}", t.name),
                DdlStatement::CreateMemoryTable(t) => format!("CREATE TABLE {}", t.name),
                DdlStatement::CreateView(v) => format!("CREATE VIEW {}", v.name),
                DdlStatement::DropTable(t) => format!("DROP TABLE {}", t.name),
                DdlStatement::DropView(v) => format!("DROP VIEW {}", v.name),
                other => other.name().to_string(),
            };
            format!("`{what}` would change the catalogue")
        }
        LogicalPlan::Statement(s) => {
            format!("`{}` statements are not run here; only reads are (SELECT, WITH, VALUES, SHOW, EXPLAIN)", s.name())
        }
        LogicalPlan::Extension(e) => {
            format!("the plan holds a node swelake does not know to be a read ({})", e.node.name())
        }
        _ => return None,
    };
    Some(why)
}

/// Plans `sql` (DataFusion's dialect, one statement) and decides on its plan.
pub async fn plan(state: &SessionState, sql: &str) -> Result<LogicalPlan, QueryError> {
    let plan = state.create_logical_plan(sql).await.map_err(|e| QueryError::from_datafusion(&e))?;
    check(&plan)?;
    Ok(plan)
}

/// An error as one line: DataFusion's nest their causes over several.
pub fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use datafusion::prelude::{SessionConfig, SessionContext};

    use super::*;

    async fn decide(sql: &str) -> Result<(), QueryError> {
        let ctx = SessionContext::new_with_config(SessionConfig::new().with_information_schema(true));
        ctx.sql("CREATE TABLE t (a INT) AS VALUES (1)").await.unwrap().collect().await.unwrap();
        plan(&ctx.state(), sql).await.map(|_| ())
    }

    #[tokio::test]
    async fn reads_run_and_writes_are_refused_wherever_they_hide() {
        for read in [
            "SELECT * FROM t",
            "WITH x AS (SELECT a FROM t) SELECT count(*) FROM x",
            "SELECT a FROM t WHERE a IN (SELECT a FROM t)",
            "EXPLAIN SELECT * FROM t",
            "EXPLAIN ANALYZE SELECT * FROM t",
            "SHOW datafusion.execution.batch_size",
            "VALUES (1)",
        ] {
            decide(read).await.unwrap_or_else(|e| panic!("{read}: {e}"));
        }
        for (write, says) in [
            ("INSERT INTO t VALUES (2)", "INSERT INTO t"),
            ("EXPLAIN ANALYZE INSERT INTO t VALUES (2)", "INSERT INTO t"),
            ("EXPLAIN INSERT INTO t VALUES (2)", "INSERT INTO t"),
            ("DELETE FROM t", "DELETE FROM t"),
            ("EXPLAIN ANALYZE DELETE FROM t WHERE a = 1", "DELETE FROM t"),
            ("UPDATE t SET a = 3", "UPDATE t"),
            ("COPY (SELECT 'x') TO '/tmp/swelake-guard-never.csv'", "COPY … TO '/tmp/swelake-guard-never.csv'"),
            ("EXPLAIN ANALYZE COPY (SELECT 'x') TO '/tmp/swelake-guard-never.csv'", "COPY … TO"),
            ("CREATE TABLE u AS SELECT 1", "CREATE TABLE u"),
            ("CREATE EXTERNAL TABLE e (a INT) STORED AS CSV LOCATION '/tmp/e.csv'", "CREATE EXTERNAL TABLE e"),
            ("CREATE VIEW v AS SELECT 1", "CREATE VIEW v"),
            ("DROP TABLE t", "DROP TABLE t"),
            ("SET datafusion.execution.batch_size = 3", "SetVariable"),
            ("PREPARE p AS SELECT 1", "Prepare"),
        ] {
            match decide(write).await {
                Err(e @ QueryError::ReadOnly(_)) => {
                    let m = e.to_string();
                    assert!(m.contains("read-only") && m.contains(says), "{write}: {m}");
                    assert_eq!(e.sqlstate(), "25006");
                }
                other => panic!("{write}: {other:?}"),
            }
        }
        assert!(!std::path::Path::new("/tmp/swelake-guard-never.csv").exists());
    }

    #[tokio::test]
    async fn errors_carry_the_sqlstate_of_their_kind() {
        assert_eq!(decide("SELEC 1").await.unwrap_err().sqlstate(), "42601");
        assert_eq!(decide("SELECT * FROM nowhere").await.unwrap_err().sqlstate(), "42P01");
        assert_eq!(decide("SELECT nothing FROM t").await.unwrap_err().sqlstate(), "42703");
    }
}
