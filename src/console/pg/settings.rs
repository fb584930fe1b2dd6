//! What one connection may set: the session settings that PostgreSQL drivers send on connect,
//! kept for that connection alone. The engine's own settings (`datafusion.*`: memory, spill
//! directory, batch size, parallelism) are the server's and the same for everyone, as in
//! ClickHouse's `readonly = 1` profile: a `SET` of one is refused.
//!
//! - **Applied** (they change what this connection sees): `application_name`, `DateStyle`,
//!   `IntervalStyle`, `extra_float_digits`, `bytea_output`, `search_path`, `TimeZone`, and
//!   `statement_timeout`, which only ever lowers the server's `--timeout`.
//! - **Accepted and kept, without effect** (PostgreSQL planner and locale knobs that drivers
//!   and tools send, meaningless here): see [`KEPT`]; `client_encoding` only as UTF8.
//! - Anything else: `datafusion.*` is refused with SQLSTATE 25006, an unknown name with 42704
//!   (as PostgreSQL does), each naming what may be set.

use std::time::Duration;

use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::{Expr, Ident, ObjectName, Reset, ResetStatement, Set, Statement, Value};
use datafusion_postgres::hooks::set_show::SetShowHook;
use datafusion_postgres::hooks::HookClient;
use datafusion_postgres::pgwire;
use datafusion_postgres::QueryHook;
use pgwire::api::results::{Response, Tag};
use pgwire::api::store::PortalStore;
use pgwire::error::PgWireResult;
use pgwire::messages::startup::ParameterStatus;
use pgwire::messages::PgWireBackendMessage;

use super::{notice, user_error};
use crate::console::Limits;

/// Settings that change what this connection sees, with the name PostgreSQL reports a change
/// of (ParameterStatus) where it reports one. Kept in the connection's metadata under the
/// lower-case name, where datafusion-postgres' formatting and `SHOW` read them.
const APPLIED: &[(&str, Option<&str>)] = &[
    ("application_name", Some("application_name")),
    ("datestyle", Some("DateStyle")),
    ("intervalstyle", Some("IntervalStyle")),
    ("extra_float_digits", None),
    ("bytea_output", None),
    ("search_path", None),
    ("timezone", Some("TimeZone")),
];

/// Settings drivers and tools send that mean nothing to this server: accepted, shown back by
/// `SHOW`, without effect.
const KEPT: &[&str] = &[
    "client_min_messages",
    "standard_conforming_strings",
    "lc_messages",
    "lc_monetary",
    "lc_numeric",
    "lc_time",
    "idle_in_transaction_session_timeout",
    "lock_timeout",
    "default_transaction_read_only",
    "transaction_read_only",
    "default_transaction_isolation",
    "transaction_isolation",
    "jit",
    "geqo",
    "join_collapse_limit",
    "from_collapse_limit",
    "max_parallel_workers_per_gather",
    "row_security",
    "check_function_bodies",
];

/// Where the connection's own `statement_timeout` is kept (milliseconds).
const TIMEOUT_KEY: &str = "swelake.statement_timeout_ms";

/// Whether `SHOW name` reads the engine's settings (`SHOW ALL`, `SHOW datafusion.…`), which
/// DataFusion answers as a query over `information_schema.df_settings`.
pub(super) fn shown_by_the_engine(name: &[Ident]) -> bool {
    let first = name.first().map(|i| i.value.to_ascii_lowercase()).unwrap_or_default();
    first == "all" || first == "datafusion"
}

/// The connection's `statement_timeout`, if it set one.
pub(super) fn statement_timeout(client: &dyn HookClient) -> Option<Duration> {
    client.metadata().get(TIMEOUT_KEY).and_then(|ms| ms.parse().ok()).map(Duration::from_millis)
}

/// Answers a session statement ([`super::is_session_statement`]) for this connection.
pub(super) async fn answer(
    statement: &Statement,
    ctx: &SessionContext,
    client: &mut dyn HookClient,
    limits: &Limits,
) -> PgWireResult<Response> {
    match statement {
        Statement::Set(set) => set_statement(set, client, limits).await,
        Statement::Reset(ResetStatement { reset }) => {
            match reset {
                Reset::ALL => reset_all(client),
                Reset::ConfigurationParameter(name) => {
                    let name = setting_name(name);
                    allowed(&name)?;
                    forget(&name, client);
                }
            }
            Ok(Response::Execution(Tag::new("RESET")))
        }
        Statement::ShowVariable { variable } => {
            let name: Vec<String> = variable.iter().map(|i| i.value.to_ascii_lowercase()).collect();
            if name == ["statement_timeout"] {
                let effective = statement_timeout(client).map_or(limits.time, |t| t.min(limits.time));
                return Ok(Response::Query(one_value("statement_timeout", &format!("{}ms", effective.as_millis()))?));
            }
            SetShowHook.handle_simple_query(statement, ctx, client).await.unwrap_or_else(|| {
                Err(user_error("42704", format!("unrecognized configuration parameter \"{}\"", name.join(" "))))
            })
        }
        Statement::Discard { object_type } => {
            if object_type.to_string().eq_ignore_ascii_case("ALL") {
                reset_all(client);
                client.portal_store().clear_portals();
            }
            Ok(Response::Execution(Tag::new(&format!("DISCARD {object_type}"))))
        }
        Statement::Deallocate { name, .. } => {
            if !name.value.eq_ignore_ascii_case("all") {
                client.portal_store().rm_statement(&name.value);
            }
            Ok(Response::Execution(Tag::new("DEALLOCATE")))
        }
        other => Err(user_error("0A000", format!("`{other}` is not supported here"))),
    }
}

async fn set_statement(set: &Set, client: &mut dyn HookClient, limits: &Limits) -> PgWireResult<Response> {
    let done = || Ok(Response::Execution(Tag::new("SET")));
    match set {
        Set::SingleAssignment { variable, values, .. } => {
            let name = setting_name(variable);
            let value = values.iter().map(value_text).collect::<Vec<_>>().join(", ");
            assign(&name, &value, client, limits).await?;
            done()
        }
        Set::SetTimeZone { value, .. } => {
            assign("timezone", &value_text(value), client, limits).await?;
            done()
        }
        Set::SetNames { charset_name, .. } => {
            assign("client_encoding", &charset_name.value, client, limits).await?;
            done()
        }
        // Every transaction here is read-only whatever it asks for.
        Set::SetTransaction { .. } | Set::SetNamesDefault {} => done(),
        other => Err(user_error("25006", format!("`{other}` is refused: a connection may set only {}", allow_list()))),
    }
}

/// Sets one named setting for this connection, or refuses it.
async fn assign(name: &str, value: &str, client: &mut dyn HookClient, limits: &Limits) -> PgWireResult<()> {
    allowed(name)?;
    let default = value.eq_ignore_ascii_case("default") || value.eq_ignore_ascii_case("local");
    if default {
        forget(name, client);
        return Ok(());
    }
    match name {
        "statement_timeout" => {
            let asked = parse_timeout(value).ok_or_else(|| {
                user_error(
                    "22023",
                    format!("invalid value for statement_timeout: {value:?} (say 5000, '5s' or '2min')"),
                )
            })?;
            match asked {
                None => forget(TIMEOUT_KEY, client),
                Some(t) => {
                    client.metadata_mut().insert(TIMEOUT_KEY.into(), t.as_millis().to_string());
                }
            }
            if asked.is_none_or(|t| t > limits.time) {
                notice(
                    client,
                    format!(
                        "statement_timeout stays at most {} ms on this server (swelake serve --timeout)",
                        limits.time.as_millis()
                    ),
                )
                .await?;
            }
        }
        "client_encoding" => {
            let v = value.to_ascii_lowercase().replace(['-', '_'], "");
            if v != "utf8" && v != "unicode" {
                return Err(user_error("22023", format!("client_encoding {value:?}: this server speaks UTF8 only")));
            }
        }
        _ => {
            client.metadata_mut().insert(name.to_string(), value.to_string());
            if let Some((_, Some(reported))) = APPLIED.iter().find(|(n, _)| *n == name) {
                let status = ParameterStatus::new(reported.to_string(), value.to_string());
                client.send_message(PgWireBackendMessage::ParameterStatus(status)).await?;
            }
        }
    }
    Ok(())
}

/// Whether a connection may set `name` (lower case).
fn allowed(name: &str) -> PgWireResult<()> {
    if name == "statement_timeout"
        || name == "client_encoding"
        || KEPT.contains(&name)
        || APPLIED.iter().any(|(n, _)| *n == name)
    {
        return Ok(());
    }
    if name.starts_with("datafusion.") {
        return Err(user_error(
            "25006",
            format!(
                "`SET {name}` is refused: the engine's settings are the server's, the same for every client \
                 (swelake serve is read-only); a connection may set only {}",
                allow_list()
            ),
        ));
    }
    Err(user_error(
        "42704",
        format!("unrecognized configuration parameter \"{name}\"; a connection may set only {}", allow_list()),
    ))
}

fn allow_list() -> String {
    let applied: Vec<&str> = APPLIED.iter().map(|(n, _)| *n).collect();
    format!("{}, statement_timeout (lowered, never raised) and client_encoding (UTF8)", applied.join(", "))
}

fn forget(name: &str, client: &mut dyn HookClient) {
    let key = if name == "statement_timeout" { TIMEOUT_KEY } else { name };
    client.metadata_mut().remove(key);
}

fn reset_all(client: &mut dyn HookClient) {
    for name in APPLIED.iter().map(|(n, _)| *n).chain(KEPT.iter().copied()).chain([TIMEOUT_KEY]) {
        client.metadata_mut().remove(name);
    }
}

/// `DateStyle`, `"search_path"`, `datafusion.execution.batch_size`: lower case, dotted.
fn setting_name(name: &ObjectName) -> String {
    name.0
        .iter()
        .map(|p| p.as_ident().map_or_else(|| p.to_string(), |i| i.value.clone()))
        .collect::<Vec<_>>()
        .join(".")
        .to_ascii_lowercase()
}

/// A setting's value as text: `'ISO, MDY'` → `ISO, MDY`, `public` → `public`, `5` → `5`.
fn value_text(e: &Expr) -> String {
    match e {
        Expr::Value(v) => match &v.value {
            Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => s.clone(),
            other => other.to_string(),
        },
        Expr::Identifier(i) => i.value.clone(),
        other => other.to_string(),
    }
}

/// PostgreSQL's forms of a timeout: milliseconds, or a number with `us`, `ms`, `s`, `min`,
/// `h` or `d`. `Some(None)` is 0: no limit of the client's own.
fn parse_timeout(v: &str) -> Option<Option<Duration>> {
    let v = v.trim();
    let split = v.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(v.len());
    let (num, unit) = v.split_at(split);
    let n: f64 = num.parse().ok()?;
    let ms = n * match unit.trim() {
        "" | "ms" => 1.0,
        "us" => 0.001,
        "s" => 1e3,
        "min" => 60e3,
        "h" => 3600e3,
        "d" => 86400e3,
        _ => return None,
    };
    if !ms.is_finite() || ms < 0.0 {
        return None;
    }
    Some((ms >= 1.0).then(|| Duration::from_millis(ms as u64)))
}

fn one_value(name: &str, value: &str) -> PgWireResult<pgwire::api::results::QueryResponse> {
    use pgwire::api::results::{DataRowEncoder, FieldFormat, FieldInfo};
    let fields = std::sync::Arc::new(vec![FieldInfo::new(
        name.into(),
        None,
        None,
        pgwire::api::Type::VARCHAR,
        FieldFormat::Text,
    )]);
    let mut row = DataRowEncoder::new(fields.clone());
    row.encode_field(&Some(value))?;
    let row = row.take_row();
    Ok(pgwire::api::results::QueryResponse::new(fields, futures::stream::once(async move { Ok(row) })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_read_as_postgresql_writes_them() {
        assert_eq!(parse_timeout("5000"), Some(Some(Duration::from_millis(5000))));
        assert_eq!(parse_timeout("5s"), Some(Some(Duration::from_secs(5))));
        assert_eq!(parse_timeout("2min"), Some(Some(Duration::from_secs(120))));
        assert_eq!(parse_timeout("1h"), Some(Some(Duration::from_secs(3600))));
        assert_eq!(parse_timeout("0"), Some(None));
        assert_eq!(parse_timeout("soon"), None);
        assert_eq!(parse_timeout("5 weeks"), None);
    }

    #[test]
    fn the_engines_settings_are_refused_and_the_drivers_accepted() {
        for name in ["datestyle", "application_name", "search_path", "timezone", "statement_timeout", "jit"] {
            assert!(allowed(name).is_ok(), "{name}");
        }
        for (name, state) in [
            ("datafusion.execution.batch_size", "25006"),
            ("datafusion.runtime.memory_limit", "25006"),
            ("datafusion.runtime.temp_directory", "25006"),
            ("work_mem_of_mars", "42704"),
        ] {
            match allowed(name) {
                Err(pgwire::error::PgWireError::UserError(info)) => assert_eq!(info.code, state, "{name}"),
                other => panic!("{name}: {other:?}"),
            }
        }
    }
}
