//! The console's HTTP side: its pages (one embedded script that draws each of them) and the
//! JSON endpoints they read, which scripts can call as well.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Result;
use arrow::array::RecordBatch;
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use datafusion::common::ScalarValue;
use serde::Deserialize;
use serde_json::{json, Value};

use super::Shared;
use crate::sql::guard::QueryError;

const INDEX: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

/// Only the page's own script and styles run: an injected `<script>` or `onerror` would not,
/// even if some text ever reached the page as markup.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

pub(super) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/", get(|| async { Redirect::to("/status") }))
        .route("/status", get(page))
        .route("/sources", get(page))
        .route("/sql", get(page))
        .route("/dataset", get(page))
        .route("/instances/{*id}", get(page))
        .route("/assets/app.js", get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }))
        .route("/assets/app.css", get(|| async { asset("text/css; charset=utf-8", APP_CSS) }))
        .route("/api/status", get(status))
        .route("/api/hours", get(hours))
        .route("/api/github", get(github))
        .route("/api/sql", post(sql))
        .route("/api/tables", get(tables))
        .route("/api/card", get(card))
        .route("/api/instances", get(instances))
        // Instance ids hold the repository's `/`: the rest of the path is the id.
        .route("/api/instances/{*id}", get(instance).post(score))
        .layer(middleware::from_fn_with_state(shared.clone(), guard))
        .with_state(shared)
}

async fn page() -> Response {
    asset("text/html; charset=utf-8", INDEX)
}

fn asset(ty: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, ty)], body).into_response()
}

/// Before any route: the `Host` must be this console's (a DNS-rebinding page names its own),
/// the token (when one is set) on every endpoint, and a POST's body JSON (a cross-site form
/// can post `text/plain` without a preflight, never `application/json`). After: the headers
/// that keep pages inert.
async fn guard(State(s): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    let host = req.headers().get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or_default();
    if !host_allowed(host, &s.http_addr, &s.opts.allow_hosts) {
        return error(
            StatusCode::FORBIDDEN,
            &format!(
                "Host {host:?} is not this console's address ({}): start it with --allow-host NAME to answer to a \
                 name of a proxy in front of it",
                s.http_addr
            ),
        );
    }
    if let Some(token) = s.opts.token.as_deref() {
        let sent = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        let ok = sent.and_then(|v| v.strip_prefix("Bearer ")).is_some_and(|t| constant_time_eq(t, token));
        // Pages and assets hold no data; the page asks for the token when an endpoint refuses.
        if req.uri().path().starts_with("/api/") && !ok {
            return error(StatusCode::UNAUTHORIZED, "this console needs its token: send `Authorization: Bearer T`");
        }
    }
    if req.method() == axum::http::Method::POST {
        let ty = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
        let mime = ty.split(';').next().unwrap_or_default().trim();
        if !mime.eq_ignore_ascii_case("application/json") {
            return error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                &format!("send the body as JSON with `Content-Type: application/json` (not {ty:?})"),
            );
        }
    }
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// Whether a request's `Host` names this console: its bound address (any address literal of
/// the machine when bound to all of them), `localhost` when bound on loopback, or a name given
/// with `--allow-host` (with or without a port). Only a name can be rebound to this machine by
/// someone else's DNS; address literals and `localhost` cannot.
pub(super) fn host_allowed(host: &str, bound: &std::net::SocketAddr, allowed: &[String]) -> bool {
    let host = host.trim().to_ascii_lowercase();
    if allowed.iter().any(|a| {
        let a = a.trim().to_ascii_lowercase();
        host == a || host.rsplit_once(':').is_some_and(|(name, _)| name == a)
    }) {
        return true;
    }
    let (name, port) = match host.rsplit_once(':') {
        // `[::1]:8080`, `127.0.0.1:8080`, `localhost:8080`; a bare `[::1]` has no port.
        Some((n, p)) if !p.ends_with(']') => (n, p.parse::<u16>().ok()),
        _ => (host.as_str(), Some(80)),
    };
    if port != Some(bound.port()) {
        return false;
    }
    let ip = bound.ip();
    if name == "localhost" {
        return ip.is_loopback() || ip.is_unspecified();
    }
    match name.trim_start_matches('[').trim_end_matches(']').parse::<std::net::IpAddr>() {
        Ok(literal) => literal == ip || ip.is_unspecified(),
        Err(_) => false,
    }
}

fn constant_time_eq(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn error(code: StatusCode, msg: &str) -> Response {
    (code, Json(json!({ "error": super::one_line(msg) }))).into_response()
}

/// A query that did not run or finish: 408 past its time, else 400; the body says why, with
/// the SQLSTATE a PostgreSQL client would read (25006: it would write).
fn query_error(e: &QueryError) -> Response {
    let code = match e {
        QueryError::Timeout { .. } => StatusCode::REQUEST_TIMEOUT,
        _ => StatusCode::BAD_REQUEST,
    };
    (code, Json(json!({ "error": super::one_line(&e.to_string()), "sqlstate": e.sqlstate() }))).into_response()
}

/// A failure of the lake (not of the request) as a 500 with its message.
fn internal(e: anyhow::Error) -> Response {
    error(StatusCode::INTERNAL_SERVER_ERROR, &format!("{e:#}"))
}

async fn status(State(s): State<Arc<Shared>>) -> Response {
    match crate::jobs::status::status(&s.lake, &s.opts.registry, &s.opts.run).await {
        Ok(st) => Json(st).into_response(),
        Err(e) => internal(e),
    }
}

async fn hours(State(s): State<Arc<Shared>>) -> Response {
    match crate::archive::hours(&s.lake, &s.opts.run.curation.completeness).await {
        Ok(Some(v)) => Json(v).into_response(),
        Ok(None) => {
            Json(json!({ "expected": null, "first_hour": null, "last_hour": null, "hours": [] })).into_response()
        }
        Err(e) => internal(e),
    }
}

/// What `ingest --github` read, per repository (`github_api_repos` without its ETags).
async fn github(State(s): State<Arc<Shared>>) -> Response {
    match crate::archive::api_sources(&s.lake).await {
        Ok(repos) => Json(json!({ "repos": repos })).into_response(),
        Err(e) => internal(e),
    }
}

#[derive(Deserialize)]
struct SqlRequest {
    sql: String,
    /// `rows` (default), `csv`, `json` or `parquet`.
    #[serde(default)]
    format: Option<String>,
    /// Rows to return at most (capped by `--row-limit`).
    #[serde(default)]
    limit: Option<usize>,
}

/// A JSON body (its content type is checked by [`guard`]).
fn json_body<T: serde::de::DeserializeOwned>(body: &[u8], shape: &str) -> Result<T, Box<Response>> {
    serde_json::from_slice(body)
        .map_err(|e| Box::new(error(StatusCode::BAD_REQUEST, &format!("send {shape} as JSON: {e}"))))
}

async fn sql(State(s): State<Arc<Shared>>, body: axum::body::Bytes) -> Response {
    let req: SqlRequest = match json_body(&body, "{\"sql\": \"…\"}") {
        Ok(r) => r,
        Err(resp) => return *resp,
    };
    let limit = req.limit.unwrap_or(s.limits.rows).min(s.limits.rows);
    let started = std::time::Instant::now();
    let r = match s.query(&req.sql, limit).await {
        Ok(r) => r,
        Err(e) => return query_error(&e),
    };
    let file = |ty: &'static str, ext: &str, body: Vec<u8>| {
        let name = format!("attachment; filename=\"query.{ext}\"");
        ([(header::CONTENT_TYPE, ty.to_string()), (header::CONTENT_DISPOSITION, name)], body).into_response()
    };
    let written = |f: crate::sql::Format| {
        let mut out = Vec::new();
        crate::sql::write(&r.batches, f, &mut out).map(|_| out)
    };
    match req.format.as_deref().unwrap_or("rows") {
        "rows" => match columns_and_rows(&r.schema, &r.batches) {
            Ok((columns, rows)) => Json(json!({
                "columns": columns,
                "rows": rows,
                "truncated": r.truncated,
                "limit": limit,
                "elapsed_ms": started.elapsed().as_millis() as u64,
            }))
            .into_response(),
            Err(e) => internal(e),
        },
        "csv" => written(crate::sql::Format::Csv).map_or_else(internal, |b| file("text/csv", "csv", b)),
        "json" => written(crate::sql::Format::Json).map_or_else(internal, |b| file("application/json", "json", b)),
        "parquet" => parquet_bytes(&r.schema, &r.batches)
            .map_or_else(internal, |b| file("application/vnd.apache.parquet", "parquet", b)),
        other => error(StatusCode::BAD_REQUEST, &format!("format {other:?}: say rows, csv, json or parquet")),
    }
}

fn parquet_bytes(schema: &arrow::datatypes::SchemaRef, batches: &[RecordBatch]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut w = parquet::arrow::ArrowWriter::try_new(&mut out, schema.clone(), None)?;
    for b in batches {
        w.write(b)?;
    }
    w.close()?;
    Ok(out)
}

/// Columns with their types, and rows as arrays in column order (names may repeat in a
/// result, so rows are not objects). Each value is what `swelake sql --format json` prints.
pub(crate) fn columns_and_rows(
    schema: &arrow::datatypes::SchemaRef,
    batches: &[RecordBatch],
) -> Result<(Vec<Value>, Vec<Vec<Value>>)> {
    let columns =
        schema.fields().iter().map(|f| json!({ "name": f.name(), "type": f.data_type().to_string() })).collect();
    let mut rows = Vec::new();
    for b in batches {
        let mut cols: Vec<Vec<Value>> = Vec::with_capacity(b.num_columns());
        for (i, f) in b.schema().fields().iter().enumerate() {
            // One column at a time under a fixed name: arrow's JSON writer gives each value
            // exactly as `swelake sql --format json` does, nested types included.
            let field = arrow::datatypes::Field::new("v", f.data_type().clone(), true);
            let one =
                RecordBatch::try_new(Arc::new(arrow::datatypes::Schema::new(vec![field])), vec![b.column(i).clone()])?;
            let mut buf = Vec::new();
            crate::sql::write(&[one], crate::sql::Format::Json, &mut buf)?;
            let parsed: Vec<Value> =
                if buf.iter().all(u8::is_ascii_whitespace) { Vec::new() } else { serde_json::from_slice(&buf)? };
            cols.push(parsed.into_iter().map(|mut o| o["v"].take()).collect());
        }
        for r in 0..b.num_rows() {
            rows.push(cols.iter_mut().map(|c| std::mem::take(&mut c[r])).collect());
        }
    }
    Ok((columns, rows))
}

/// Every table of the lake with its columns, their types and their descriptions.
async fn tables(State(s): State<Arc<Shared>>) -> Response {
    let ctx = match s.session().await {
        Ok(c) => c,
        Err(e) => return internal(e),
    };
    let mut out = Vec::new();
    for name in crate::sql::table_names(&ctx) {
        let Ok(provider) = ctx.table_provider(name.as_str()).await else { continue };
        let doc = crate::schema::load(&name).ok();
        let described = |c: &str| {
            doc.as_ref().and_then(|d| d.columns.iter().find(|x| x.name == c)).map(|x| x.description.trim().to_string())
        };
        let columns: Vec<Value> = provider
            .schema()
            .fields()
            .iter()
            .map(|f| json!({ "name": f.name(), "type": f.data_type().to_string(), "description": described(f.name()) }))
            .collect();
        out.push(
            json!({ "name": name, "description": doc.map(|d| d.description.trim().to_string()), "columns": columns }),
        );
    }
    Json(json!({ "tables": out })).into_response()
}

/// The dataset card: its Markdown and its charts (as data URLs, for `<img>` only). Drawn once
/// per version of the lake's tables, off the async runtime (it reads, counts and plots).
async fn card(State(s): State<Arc<Shared>>) -> Response {
    let versions = match s.snapshot().await {
        Ok(snap) => snap.versions,
        Err(e) => return internal(e),
    };
    let mut cached = s.card.lock().await;
    if let Some((at, v)) = cached.as_ref() {
        if *at == versions {
            return Json(v.clone()).into_response();
        }
    }
    let (lake, completeness) = (s.lake.clone(), s.opts.run.curation.completeness.clone());
    let handle = tokio::runtime::Handle::current();
    let drawn = tokio::task::spawn_blocking(move || handle.block_on(draw_card(&lake, completeness))).await;
    match drawn {
        Ok(Ok(Some(v))) => {
            *cached = Some((versions, v.clone()));
            Json(v).into_response()
        }
        Ok(Ok(None)) => error(
            StatusCode::NOT_FOUND,
            "no `pr_quality` or `rl_seed` table: run the jobs through seed first (swelake run --all …)",
        ),
        Ok(Err(e)) => internal(e),
        Err(e) => internal(anyhow::anyhow!("drawing the card: {e}")),
    }
}

async fn draw_card(
    lake: &crate::lake::Lake,
    completeness: crate::archive::CompletenessConfig,
) -> Result<Option<Value>> {
    for t in ["pr_quality", "rl_seed"] {
        if !lake.has_table(t).await? {
            return Ok(None);
        }
    }
    let dir = tempfile::tempdir()?;
    let opts = crate::report::ReportOptions { out: dir.path().to_path_buf(), completeness };
    crate::report::run(lake, &opts).await?;
    let markdown = std::fs::read_to_string(dir.path().join("card.md"))?;
    let mut charts = BTreeMap::new();
    for e in std::fs::read_dir(dir.path())? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "png") {
            let name = p.file_name().unwrap_or_default().to_string_lossy().to_string();
            charts.insert(name, format!("data:image/png;base64,{}", BASE64.encode(std::fs::read(&p)?)));
        }
    }
    Ok(Some(json!({ "markdown": markdown, "charts": charts })))
}

#[derive(Deserialize, Default)]
struct InstanceFilter {
    repo: Option<String>,
    language: Option<String>,
    split: Option<String>,
    min_tokens: Option<i64>,
    max_tokens: Option<i64>,
    limit: Option<usize>,
    offset: Option<usize>,
}

/// The console's own queries: under the time limit, every row; `$1`, `$2`… bound to
/// `params`, so what a visitor typed is a value, never SQL text.
async fn rows_json(s: &Shared, sql: &str, params: &[ScalarValue]) -> Result<(Vec<Value>, Vec<Vec<Value>>)> {
    let r = s.query_with(sql, params.to_vec(), usize::MAX).await?;
    columns_and_rows(&r.schema, &r.batches)
}

/// Rows as objects keyed by column (for queries whose column names are distinct).
async fn objects(s: &Shared, sql: &str, params: &[ScalarValue]) -> Result<Vec<serde_json::Map<String, Value>>> {
    let (cols, rows) = rows_json(s, sql, params).await?;
    let names: Vec<String> = cols.iter().map(|c| c["name"].as_str().unwrap_or_default().to_string()).collect();
    Ok(rows.into_iter().map(|r| names.iter().cloned().zip(r).collect()).collect())
}

/// Rows read into `T` by column name, as `crate::query::rows` reads them elsewhere.
async fn typed<T: serde::de::DeserializeOwned>(s: &Shared, sql: &str, params: &[ScalarValue]) -> Result<Vec<T>> {
    objects(s, sql, params)
        .await?
        .into_iter()
        .map(|o| serde_json::from_value(Value::Object(o)).map_err(anyhow::Error::from))
        .collect()
}

async fn has_table(s: &Shared, name: &str) -> Result<bool> {
    let ctx = s.session().await?;
    Ok(ctx.table_exist(name)?)
}

/// `rl_seed` filtered by repository, language, split and prompt size, and the values of each
/// filter.
async fn instances(State(s): State<Arc<Shared>>, Query(f): Query<InstanceFilter>) -> Response {
    let r = async {
        if !has_table(&s, "rl_seed").await? {
            return anyhow::Ok(None);
        }
        // Each filter given is a condition on a parameter: the values stay out of the SQL.
        let mut wh = vec!["TRUE".to_string()];
        let mut params: Vec<ScalarValue> = Vec::new();
        let mut cond = |expr: &str, v: ScalarValue| {
            params.push(v);
            wh.push(format!("{expr} ${}", params.len()));
        };
        let nonempty = |o: &Option<String>| o.clone().filter(|v| !v.is_empty()).map(|v| ScalarValue::Utf8(Some(v)));
        if let Some(v) = nonempty(&f.repo) {
            cond("repo_name =", v);
        }
        if let Some(v) = nonempty(&f.language) {
            cond("extra_info['language'] =", v);
        }
        if let Some(v) = nonempty(&f.split) {
            cond("split =", v);
        }
        if let Some(v) = f.min_tokens {
            cond("extra_info['prompt_tokens'] >=", ScalarValue::Int64(Some(v)));
        }
        if let Some(v) = f.max_tokens {
            cond("extra_info['prompt_tokens'] <=", ScalarValue::Int64(Some(v)));
        }
        let wh = wh.join(" AND ");
        let limit = f.limit.unwrap_or(100).min(1000);
        let list = objects(
            &s,
            &format!(
                "SELECT instance_id, repo_name, split, extra_info['language'] AS language, \
                 extra_info['pr_number'] AS pr_number, extra_info['prompt_tokens'] AS prompt_tokens, \
                 cardinality(extra_info['changed_files']) AS changed_files, problem_source, \
                 substr(problem_statement, 1, 160) AS problem_start \
                 FROM rl_seed WHERE {wh} ORDER BY repo_name, extra_info['pr_number'], instance_id \
                 LIMIT {limit} OFFSET {}",
                f.offset.unwrap_or(0)
            ),
            &params,
        )
        .await?;
        #[derive(Deserialize)]
        struct Count {
            n: i64,
        }
        let total = typed::<Count>(&s, &format!("SELECT count(*) AS n FROM rl_seed WHERE {wh}"), &params).await?;
        let facet = |col: &str| format!("SELECT DISTINCT {col} AS v FROM rl_seed WHERE {col} IS NOT NULL ORDER BY v");
        let mut facets = serde_json::Map::new();
        for (k, col) in [("repos", "repo_name"), ("languages", "extra_info['language']"), ("splits", "split")] {
            let (_, rows) = rows_json(&s, &facet(col), &[]).await?;
            facets.insert(k.into(), Value::Array(rows.into_iter().map(|mut r| r.swap_remove(0)).collect()));
        }
        anyhow::Ok(Some(json!({ "total": total.first().map(|t| t.n), "instances": list, "facets": facets })))
    };
    match r.await {
        Ok(Some(v)) => Json(v).into_response(),
        Ok(None) => {
            error(StatusCode::NOT_FOUND, "no `rl_seed` table: run the jobs through seed first (swelake run --all …)")
        }
        Err(e) => internal(e),
    }
}

async fn one_instance(s: &Shared, id: &str) -> Result<Option<serde_json::Map<String, Value>>> {
    if !has_table(s, "rl_seed").await? {
        return Ok(None);
    }
    let id = ScalarValue::Utf8(Some(id.to_string()));
    let mut rows = objects(s, "SELECT * FROM rl_seed WHERE instance_id = $1 LIMIT 1", &[id]).await?;
    Ok(rows.pop())
}

/// One instance as a curator reads it: the problem, the prompt, the files shown, the oracle
/// patch, and the relevant files with their scores.
async fn instance(State(s): State<Arc<Shared>>, Path(id): Path<String>) -> Response {
    let r = async {
        let Some(mut inst) = one_instance(&s, &id).await? else { return anyhow::Ok(None) };
        let repo = inst.get("repo_name").and_then(Value::as_str).unwrap_or_default().to_string();
        let pr = inst.get("extra_info").and_then(|e| e.get("pr_number")).and_then(Value::as_i64).unwrap_or(-1);
        let relevant = if has_table(&s, "pr_relevant_files").await? {
            objects(
                &s,
                "SELECT rank, path, score, model FROM pr_relevant_files WHERE repo_name = $1 AND pr_number = $2 \
                 ORDER BY rank",
                &[ScalarValue::Utf8(Some(repo)), ScalarValue::Int64(Some(pr))],
            )
            .await?
        } else {
            Vec::new()
        };
        inst.insert("relevant".into(), json!(relevant));
        anyhow::Ok(Some(inst))
    };
    match r.await {
        Ok(Some(v)) => Json(v).into_response(),
        Ok(None) => error(StatusCode::NOT_FOUND, &format!("no instance {id:?} in rl_seed")),
        Err(e) => internal(e),
    }
}

#[derive(Deserialize)]
struct ScoreRequest {
    /// A model's whole output (thought and answer), as the reward reads it.
    answer: String,
}

/// The reward of a pasted answer against the instance's oracle, with the per-file diffs it
/// compared.
async fn score(State(s): State<Arc<Shared>>, Path(id): Path<String>, body: axum::body::Bytes) -> Response {
    let Some(id) = id.strip_suffix("/score") else {
        return error(
            StatusCode::NOT_FOUND,
            "POST /api/instances/ID/score scores an answer; nothing else is posted here",
        );
    };
    let id = id.to_string();
    let req: ScoreRequest = match json_body(&body, "{\"answer\": \"…\"}") {
        Ok(r) => r,
        Err(resp) => return *resp,
    };
    let inst = match one_instance(&s, &id).await {
        Ok(Some(i)) => i,
        Ok(None) => return error(StatusCode::NOT_FOUND, &format!("no instance {id:?} in rl_seed")),
        Err(e) => return internal(e),
    };
    let map = |k: &str| -> BTreeMap<String, String> {
        inst.get(k)
            .and_then(Value::as_object)
            .map(|o| o.iter().map(|(p, c)| (p.clone(), c.as_str().unwrap_or_default().to_string())).collect())
            .unwrap_or_default()
    };
    let (context, oracle) = (map("context"), map("oracle"));
    // The reward is CPU work (a diff per file): off the async runtime.
    match tokio::task::spawn_blocking(move || {
        crate::reward::detailed::search_replace_reward(&context, &oracle, &req.answer)
    })
    .await
    {
        Ok(d) => Json(d).into_response(),
        Err(e) => internal(anyhow::anyhow!("scoring the answer: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::host_allowed;

    #[test]
    fn only_the_consoles_own_host_is_answered() {
        let loopback = "127.0.0.1:8080".parse().unwrap();
        for ok in ["127.0.0.1:8080", "localhost:8080", "LOCALHOST:8080"] {
            assert!(host_allowed(ok, &loopback, &[]), "{ok}");
        }
        for no in ["evil.example", "evil.example:8080", "127.0.0.1:9090", "localhost", "10.0.0.1:8080", ""] {
            assert!(!host_allowed(no, &loopback, &[]), "{no}");
        }
        let proxied = ["lake.example.org".to_string()];
        assert!(host_allowed("lake.example.org", &loopback, &proxied));
        assert!(host_allowed("lake.example.org:443", &loopback, &proxied));
        assert!(!host_allowed("evil.example", &loopback, &proxied));

        let v6 = "[::1]:8080".parse().unwrap();
        assert!(host_allowed("[::1]:8080", &v6, &[]));
        assert!(host_allowed("localhost:8080", &v6, &[]));
        assert!(!host_allowed("[::1]", &v6, &[]));

        // Bound to every address: any address literal of the machine, never a name.
        let all = "0.0.0.0:8080".parse().unwrap();
        assert!(host_allowed("192.168.1.20:8080", &all, &[]));
        assert!(!host_allowed("evil.example:8080", &all, &[]));
        let port80 = "127.0.0.1:80".parse().unwrap();
        assert!(host_allowed("127.0.0.1", &port80, &[]));
    }
}
