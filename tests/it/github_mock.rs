//! A local server that behaves as GitHub's REST API does for `swelake ingest --github` —
//! `Link` pagination, `per_page`, `since`, ETags and 304s, rate-limit headers, 301s for renamed
//! repositories, and faults on demand (a secondary limit's 403 with `retry-after`, a 502) — over
//! real REST objects (tests/data/github), and the CLI the tests drive it with.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;
use serde_json::Value;

pub(crate) const TOKEN: &str = "ghp_sentinel_Zq9vX2mK7wR4tY8uP1sN";

#[derive(Default)]
pub(crate) struct Mock {
    /// Per repository (`owner/name`): `repo`, `pulls`, `issues`, `comments`.
    pub data: Value,
    base: String,
    /// (path and query, status) of every request.
    pub log: Vec<(String, u16)>,
    faults: Vec<(String, u16)>,
    calls: u64,
    /// The largest page served (GitHub's is 100).
    page_cap: usize,
    /// (old name, new name): GitHub answers a renamed repository's URLs with a 301 to the new.
    pub renamed: Vec<(String, String)>,
}

pub(crate) fn data_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/github")
}

/// The REST objects of the five repositories of the 2025-01-01-15 hour.
pub(crate) fn excerpt_objects() -> Value {
    serde_json::from_str(&std::fs::read_to_string(data_dir().join("api-2025-01-01-15.json")).unwrap()).unwrap()
}

/// Serves `data` as GitHub's REST API on loopback: answers its base URL and its state.
pub(crate) async fn serve_api(data: Value, faults: Vec<(String, u16)>, page_cap: usize) -> (String, Arc<Mutex<Mock>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let mock = Arc::new(Mutex::new(Mock { data, base: base.clone(), faults, page_cap, ..Default::default() }));
    let app = axum::Router::new().fallback(handle).with_state(mock.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, mock)
}

fn query_of(q: &str) -> BTreeMap<String, String> {
    q.split('&').filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn updated(v: &Value) -> &str {
    v.get("updated_at").and_then(Value::as_str).unwrap_or("")
}

async fn handle(State(mock): State<Arc<Mutex<Mock>>>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let headers: HeaderMap = req.headers().clone();
    let mut m = mock.lock().unwrap();
    m.calls += 1;
    let full = if query.is_empty() { path.clone() } else { format!("{path}?{query}") };
    let reply = |m: &mut Mock, status: u16, body: String, extra: Vec<(&str, String)>| {
        m.log.push((full.clone(), status));
        let mut r = Response::builder().status(status);
        r = r
            .header("x-ratelimit-limit", "5000")
            .header("x-ratelimit-remaining", (5000 - m.calls).to_string())
            .header("x-ratelimit-reset", "4102444800");
        for (k, v) in extra {
            r = r.header(k, v);
        }
        r.body(Body::from(body)).unwrap()
    };
    let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("");
    if auth != format!("Bearer {TOKEN}") {
        return reply(&mut m, 401, r#"{"message":"Bad credentials"}"#.into(), vec![]);
    }
    if let Some(i) = m.faults.iter().position(|(p, _)| full.contains(p.as_str())) {
        let (_, status) = m.faults.remove(i);
        let extra = if status == 403 { vec![("retry-after", "1".to_string())] } else { vec![] };
        let body = if status == 403 {
            r#"{"message":"You have exceeded a secondary rate limit."}"#
        } else {
            "<html>502 Bad Gateway</html>"
        };
        return reply(&mut m, status, body.into(), extra);
    }
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    if parts.len() < 3 || parts[0] != "repos" {
        return reply(&mut m, 404, r#"{"message":"Not Found"}"#.into(), vec![]);
    }
    let name = format!("{}/{}", parts[1], parts[2]);
    if let Some((_, new)) = m.renamed.iter().find(|(old, _)| *old == name).cloned() {
        let to = format!("{}/repos/{new}{}", m.base, &full["/repos/".len() + name.len()..]);
        return reply(&mut m, 301, r#"{"message":"Moved Permanently"}"#.into(), vec![("location", to)]);
    }
    let Some(repo) = m.data.get(&name).cloned() else {
        return reply(&mut m, 404, r#"{"message":"Not Found"}"#.into(), vec![]);
    };
    let q = query_of(&query);
    let rest = parts[3..].join("/");
    let (body, page_info) = if rest.is_empty() {
        (repo["repo"].clone(), None)
    } else {
        let reviews_of = rest.strip_prefix("pulls/").and_then(|r| r.strip_suffix("/reviews"));
        let (key, desc) = match rest.as_str() {
            "pulls" => ("pulls", q.get("direction").map(String::as_str) != Some("asc")),
            "issues" => ("issues", q.get("direction").map(String::as_str) == Some("desc")),
            "issues/comments" => ("comments", q.get("direction").map(String::as_str) == Some("desc")),
            "pulls/comments" => ("review_comments", q.get("direction").map(String::as_str) == Some("desc")),
            _ if reviews_of.is_some() => ("reviews", false),
            _ => return reply(&mut m, 404, r#"{"message":"Not Found"}"#.into(), vec![]),
        };
        // A PR's reviews, in submission order (that list has no `since` and no sort).
        let mut items: Vec<Value> = match reviews_of {
            Some(n) => repo["reviews"][n].as_array().cloned().unwrap_or_default(),
            None => repo[key].as_array().cloned().unwrap_or_default(),
        };
        // The pulls list has no `since`; the issues and comments lists do.
        if let Some(since) = q.get("since").filter(|_| key != "pulls" && key != "reviews") {
            items.retain(|i| updated(i) >= since.as_str());
        }
        if reviews_of.is_none() {
            items.sort_by(|a, b| updated(a).cmp(updated(b)));
        }
        if desc {
            items.reverse();
        }
        let per_page = q.get("per_page").and_then(|p| p.parse().ok()).unwrap_or(30usize).min(m.page_cap);
        let page = q.get("page").and_then(|p| p.parse().ok()).unwrap_or(1usize);
        let total = items.len();
        let slice: Vec<Value> = items.into_iter().skip((page - 1) * per_page).take(per_page).collect();
        let next = (page * per_page < total).then(|| {
            let mut q2 = q.clone();
            q2.insert("page".into(), (page + 1).to_string());
            let qs: Vec<String> = q2.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("<{}{path}?{}>; rel=\"next\"", m.base, qs.join("&"))
        });
        (Value::Array(slice), next)
    };
    let text = body.to_string();
    let etag = format!("\"{:016x}\"", fnv(&text));
    if headers.get("if-none-match") == Some(&HeaderValue::from_str(&etag).unwrap()) {
        return reply(&mut m, 304, String::new(), vec![("etag", etag)]);
    }
    let mut extra = vec![("etag", etag), ("content-type", "application/json".to_string())];
    if let Some(link) = page_info {
        extra.push(("link", link));
    }
    reply(&mut m, 200, text, extra)
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3))
}

/// Runs the CLI; answers (success, stdout + stderr).
pub(crate) fn swelake(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_swelake"))
        .args(args)
        .env_remove("GITHUB_TOKEN")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}
