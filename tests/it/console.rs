//! `swelake serve` and `swelake sql`'s shell, driven by their users' own tools: headless
//! Chromium (through Playwright) on every page, psql on the wire protocol, and a piped shell
//! session. Expected values come from `swelake sql`, not from the console.
//!
//! Chromium and psql are Debian packages that `.ci/run` installs; where they are missing the
//! test says so and skips, unless `SWELAKE_REQUIRE_CONSOLE_TOOLS=1` (CI), where that fails.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;
use swelake::lake::Lake;

use crate::common::{gharchive, quiet_ingest, read_lines};

/// A running `swelake serve`, stopped when dropped.
pub(crate) struct Served {
    child: Child,
    pub http: String,
    pub pg: Option<String>,
}

impl Served {
    /// The server's peak resident memory so far (VmHWM), in bytes.
    pub(crate) fn peak_rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap();
        kb << 10
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `swelake serve ARGS` on free ports and waits until it says where it listens.
pub(crate) fn serve(args: &[&str], env: &[(String, String)]) -> Served {
    let mut c = Command::new(env!("CARGO_BIN_EXE_swelake"));
    c.arg("serve").args(args).args(["--bind", "127.0.0.1:0"]).env("RUST_LOG", "warn");
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c.stderr(Stdio::piped()).stdout(Stdio::null()).spawn().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let (mut http, mut pg) = (None, None);
    let wants_pg = args.contains(&"--pg-bind");
    let mut seen = String::new();
    while http.is_none() || (wants_pg && pg.is_none()) {
        let Some(Ok(line)) = lines.next() else { panic!("swelake serve stopped before it listened:\n{seen}") };
        seen.push_str(&line);
        seen.push('\n');
        if let Some(rest) = line.split(" is at http://").nth(1) {
            http = Some(rest.trim_end_matches('/').to_string());
        }
        if let Some(rest) = line.split("clients connect to ").nth(1) {
            pg = Some(rest.split_whitespace().next().unwrap().to_string());
        }
    }
    // Keep draining its stderr so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Served { child, http: http.unwrap(), pg }
}

/// One HTTP/1.1 request with a JSON body, as a script sends it; returns the status and the body.
pub(crate) fn http(addr: &str, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    http_with(addr, method, path, &[("Host", addr), ("Content-Type", "application/json")], body)
}

/// One HTTP/1.1 request with exactly these headers (and its length).
pub(crate) fn http_with(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let body = body.unwrap_or("");
    let mut head = format!("{method} {path} HTTP/1.1\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    write!(s, "{head}Content-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap();
    let status: u16 = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body =
        if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { dechunk(rest) } else { rest.to_string() };
    (status, body)
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

fn required() -> bool {
    std::env::var("SWELAKE_REQUIRE_CONSOLE_TOOLS").is_ok_and(|v| v == "1")
}

fn tool(name: &str) -> Option<PathBuf> {
    let found =
        std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).map(|d| d.join(name)).find(|p| p.is_file()));
    if found.is_none() {
        assert!(!required(), "{name} is required (SWELAKE_REQUIRE_CONSOLE_TOOLS=1): apt-get install {name}");
        eprintln!("skipped: {name} is not installed (Debian package `{name}`; .ci/run installs it)");
    }
    found
}

/// `swelake sql --format json` on a lake: the rows the console must show.
fn sql_json(lake: &str, sql: &str) -> Vec<serde_json::Map<String, Value>> {
    let o = Command::new(env!("CARGO_BIN_EXE_swelake"))
        .args(["sql", "--lake", lake, "--format", "json", sql])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

const PAYLOAD_TITLE: &str = "Fix <script>window.__pwned = 'title'</script> parsing";
const PAYLOAD_BODY: &str =
    "Body <img src=x onerror=\"window.__pwned='img'\"> and <script>alert('pwned')</script> <b id=injected>bold</b>";

/// A lake of crafted hours: 2025-10-27 and 2025-11-03, hours 10 to 16, of the real 2015
/// excerpt's events; on 2025-11-03 hour 12 is missing and hour 14 holds 3% of its week-earlier
/// self; one merged PR carries script payloads in its title and body.
async fn hours_lake(dir: &Path) -> String {
    let lines = read_lines(&gharchive("2015-01-01-15.json.gz"));
    let src = dir.join("hours");
    std::fs::create_dir_all(&src).unwrap();
    let pr_line =
        lines.iter().find(|l| l.contains("\"type\":\"PullRequestEvent\"")).expect("the excerpt has a PullRequestEvent");
    let mut pr: Value = serde_json::from_str(pr_line).unwrap();
    pr["payload"]["action"] = "closed".into();
    let p = &mut pr["payload"]["pull_request"];
    p["merged"] = true.into();
    p["merged_at"] = "2025-11-03T15:10:00Z".into();
    p["closed_at"] = "2025-11-03T15:10:00Z".into();
    p["title"] = PAYLOAD_TITLE.into();
    p["body"] = PAYLOAD_BODY.into();
    pr["created_at"] = "2025-11-03T15:10:00Z".into();
    for day in ["2025-10-27", "2025-11-03"] {
        for h in 10..=16 {
            if day == "2025-11-03" && h == 12 {
                continue;
            }
            let n = if day == "2025-11-03" && h == 14 { 9 } else { 300 };
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            for l in lines.iter().skip(h * 20).take(n) {
                writeln!(gz, "{l}").unwrap();
            }
            if day == "2025-11-03" && h == 15 {
                writeln!(gz, "{pr}").unwrap();
            }
            std::fs::write(src.join(format!("{day}-{h}.json.gz")), gz.finish().unwrap()).unwrap();
        }
    }
    let path = dir.join("hours-lake");
    let lake = Lake::open(path.to_str().unwrap()).unwrap();
    swelake::ingest::run(&lake, &quiet_ingest(&src)).await.unwrap();
    let registry = swelake::jobs::Registry::load(None, None).unwrap();
    swelake::jobs::run(&lake, &registry, &["pull_requests".to_string()], &Default::default()).await.unwrap();
    // And what GitHub's REST API gave for the five repositories of tests/data/github.
    let data = crate::github_mock::excerpt_objects();
    let names: Vec<String> = data.as_object().unwrap().keys().cloned().collect();
    let (base, _mock) = crate::github_mock::serve_api(data, vec![], 100).await;
    let repos = dir.join("api-repos.txt");
    std::fs::write(&repos, names.join("\n")).unwrap();
    let (ok, out) = crate::github_mock::swelake(
        &[
            "ingest",
            "--github",
            "--repos-file",
            repos.to_str().unwrap(),
            "--lake",
            path.to_str().unwrap(),
            "--api-url",
            &base,
        ],
        &[("GITHUB_TOKEN", crate::github_mock::TOKEN)],
    );
    assert!(ok, "{out}");
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_console_in_headless_chromium_psql_on_the_wire_and_a_piped_shell() {
    let dir = tempfile::tempdir().unwrap();
    let (demo, _) = crate::curation::sample_lake(dir.path(), None).await;
    let demo = demo.location();
    let hours = hours_lake(dir.path()).await;
    // The crafted hours are judged over their whole range, one week back.
    let config = dir.path().join("curation.toml");
    std::fs::write(&config, "[completeness]\nexpect = \"range\"\nweeks = 1\nmin_weeks = 1\n").unwrap();

    // The JSON API, as a script calls it.
    let s = serve(&["--lake", &demo, "--pg-bind", "127.0.0.1:0"], &[]);
    let (code, body) = http(&s.http, "GET", "/api/status", None);
    assert_eq!(code, 200, "{body}");
    let status: Value = serde_json::from_str(&body).unwrap();
    let cli = Command::new(env!("CARGO_BIN_EXE_swelake")).args(["status", "--lake", &demo, "--json"]).output().unwrap();
    let cli: Value = serde_json::from_slice(&cli.stdout).unwrap();
    let names = |v: &Value, k: &str, f: &str| -> Vec<String> {
        v[k].as_array().unwrap().iter().map(|x| x[f].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(names(&status, "jobs", "job"), names(&cli, "jobs", "job"));
    assert_eq!(names(&status, "tables", "table"), names(&cli, "tables", "table"));
    // The demo's two hours ten months apart are a sample, not a range with 7,000 missing hours.
    assert_eq!(status["hours"]["expected"]["mode"], "held", "{}", status["hours"]);
    assert_eq!(status["hours"]["flagged"].as_array().unwrap().len(), 0);
    let (code, body) = http(&s.http, "GET", "/api/card", None);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("0 missing of the hours the lake means to hold (held"), "{body}");

    let q = "SELECT repo_name, number, title FROM pull_requests WHERE merged ORDER BY repo_name, number";
    let (code, body) = http(&s.http, "POST", "/api/sql", Some(&serde_json::json!({ "sql": q }).to_string()));
    assert_eq!(code, 200, "{body}");
    let got: Value = serde_json::from_str(&body).unwrap();
    let want = sql_json(&demo, q);
    assert_eq!(got["columns"][1], serde_json::json!({"name": "number", "type": "Int64"}));
    let rows: Vec<Vec<Value>> =
        want.iter().map(|r| ["repo_name", "number", "title"].iter().map(|c| r[*c].clone()).collect()).collect();
    assert_eq!(got["rows"], serde_json::json!(rows));
    for bad in ["INSERT INTO pull_requests (repo_name) VALUES ('x')", "SELEC 1", "DROP TABLE events"] {
        let (code, body) = http(&s.http, "POST", "/api/sql", Some(&serde_json::json!({ "sql": bad }).to_string()));
        assert_eq!(code, 400, "{bad}: {body}");
        let e: Value = serde_json::from_str(&body).unwrap();
        assert!(!e["error"].as_str().unwrap().contains('\n'), "{body}");
    }
    let (code, body) = http(&s.http, "GET", "/api/instances?split=train", None);
    assert_eq!(code, 200, "{body}");
    let listed: Value = serde_json::from_str(&body).unwrap();
    let seed =
        sql_json(&demo, "SELECT instance_id, oracle_patch FROM rl_seed WHERE split = 'train' ORDER BY instance_id");
    assert_eq!(listed["total"], seed.len());
    // Filters are bound as parameters: a value holding quotes is a value, not SQL.
    let repo = listed["instances"][0]["repo_name"].as_str().unwrap().to_string();
    let (code, body) = http(
        &s.http,
        "GET",
        &format!("/api/instances?split=train&repo={repo}&min_tokens=1&max_tokens=100000000"),
        None,
    );
    assert_eq!(code, 200, "{body}");
    let by_repo =
        sql_json(&demo, &format!("SELECT instance_id FROM rl_seed WHERE split = 'train' AND repo_name = '{repo}'"));
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["total"], by_repo.len());
    let (code, body) = http(&s.http, "GET", "/api/instances?repo=x%27%20OR%20%271%27%3D%271", None);
    assert_eq!(code, 200, "{body}");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["total"], 0, "{body}");
    let (code, body) = http(&s.http, "GET", "/api/instances/x%27%20OR%20%271%27%3D%271", None);
    assert_eq!(code, 404, "{body}");
    let id = seed[0]["instance_id"].as_str().unwrap().to_string();
    // An id holds the repository's `/` and a `#`, which a URL must escape.
    let id_in_url = id.replace('%', "%25").replace('#', "%23").replace(' ', "%20");
    let (code, body) = http(&s.http, "GET", &format!("/api/instances/{id_in_url}"), None);
    assert_eq!(code, 200, "{body}");
    let inst: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(inst["oracle_patch"], seed[0]["oracle_patch"]);
    let (code, body) =
        http(&s.http, "POST", &format!("/api/instances/{id_in_url}/score"), Some(r#"{"answer": "no answer"}"#));
    assert_eq!(code, 200, "{body}");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["reward"], -1.0);

    // psql on the wire protocol: a join, the same rows as `swelake sql`; writes refused.
    if let Some(psql) = tool("psql") {
        let pg = s.pg.clone().unwrap();
        let (host, port) = pg.rsplit_once(':').unwrap();
        let psql_run = |sql: &str| {
            Command::new(&psql)
                .args(["-X", "-A", "-t", "-F", "|", "-h", host, "-p", port, "-U", "analyst", "-d", "lake", "-c", sql])
                .env("PGCONNECT_TIMEOUT", "10")
                .output()
                .unwrap()
        };
        let join = "SELECT p.repo_name, p.number, count(f.path) AS files FROM pull_requests p \
                    JOIN pr_files f ON p.repo_name = f.repo_name AND p.number = f.pr_number \
                    GROUP BY p.repo_name, p.number ORDER BY p.repo_name, p.number";
        let o = psql_run(join);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let got: Vec<String> = String::from_utf8_lossy(&o.stdout).lines().map(str::to_string).collect();
        let want: Vec<String> = sql_json(&demo, join)
            .iter()
            .map(|r| format!("{}|{}|{}", r["repo_name"].as_str().unwrap(), r["number"], r["files"]))
            .collect();
        assert!(!want.is_empty());
        assert_eq!(got, want);
        let o = psql_run("INSERT INTO pull_requests (repo_name, number) VALUES ('x/y', 1)");
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("read-only") && err.contains("INSERT"), "{err}");
        // psql's own catalogue queries (\dt reads pg_catalog) get answers it accepts.
        let o = psql_run("\\dt");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(String::from_utf8_lossy(&o.stdout).contains("pull_requests"), "{}", String::from_utf8_lossy(&o.stdout));
    }

    // The shell: a scripted session.
    let mut shell = Command::new(env!("CARGO_BIN_EXE_swelake"))
        .args(["sql", "--lake", &demo])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    shell
        .stdin
        .take()
        .unwrap()
        .write_all(b"SELECT 1 + 1 AS two;\nSELECT count(*) AS merged\n  FROM pull_requests\n  WHERE merged;\n\\d pull_requests\n")
        .unwrap();
    let o = shell.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}{}", String::from_utf8_lossy(&o.stderr));
    let merged = sql_json(&demo, "SELECT count(*) AS merged FROM pull_requests WHERE merged");
    assert!(out.contains("| two |") && out.contains("| 2   |"), "{out}");
    assert!(out.contains(&format!("| {}", merged[0]["merged"])), "{out}");
    assert!(out.contains("| merged_at") && out.contains("| number"), "{out}");

    // Headless Chromium through every page.
    let (Some(chromium), Some(py)) = (tool("chromium"), crate::python::python()) else { return };
    let h = serve(&["--lake", &hours, "--config", config.to_str().unwrap()], &[]);
    let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    let _ = std::fs::remove_dir_all(&shots);
    std::fs::create_dir_all(&shots).unwrap();
    let query = "SELECT repo_name, count(*) AS prs, max(number) AS last FROM pull_requests GROUP BY repo_name ORDER BY repo_name";
    let xss = "SELECT title, body FROM pull_requests WHERE title LIKE 'Fix <script>%'";
    let out = crate::python::script(
        &py,
        "console_browser.py",
        &[&format!("http://{}", s.http), &format!("http://{}", h.http), shots.to_str().unwrap(), query, xss, &id],
        &[("SWELAKE_CHROMIUM", chromium.to_str().unwrap())],
    );
    let seen: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    eprintln!("screenshots: {}", shots.display());
    // The docs' screenshots are these, copied by a command (docs/console.md), never by hand.
    if std::env::var("SWELAKE_UPDATE_SCREENSHOTS").is_ok_and(|v| v == "1") {
        let img = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/img");
        for name in ["status", "sources", "instance"] {
            std::fs::copy(shots.join(format!("{name}.png")), img.join(format!("console-{name}.png"))).unwrap();
        }
    }

    // Status: every job and every table.
    let jobs: Vec<String> = serde_json::from_value(seen["status"]["jobs"].clone()).unwrap();
    let tables: Vec<String> = serde_json::from_value(seen["status"]["tables"].clone()).unwrap();
    assert_eq!(jobs, names(&cli, "jobs", "job"));
    assert_eq!(tables, names(&cli, "tables", "table"));
    // The heatmap: one cell per hour of the range 2025-10-27-10 .. 2025-11-03-16.
    assert_eq!(seen["sources"]["cells"], 7 * 24 + 7);
    assert_eq!(seen["sources"]["low"]["verdict"], "low");
    assert_eq!(seen["sources"]["low"]["color"], "rgb(240, 160, 32)");
    assert!(seen["sources"]["low"]["title"].as_str().unwrap().contains("9 events"), "{}", seen["sources"]);
    assert_eq!(seen["sources"]["missing"]["verdict"], "missing");
    assert_eq!(seen["sources"]["missing"]["color"], "rgb(215, 58, 49)");
    assert_eq!(seen["sources"]["complete"]["color"], "rgb(45, 164, 78)");
    // A lake the API never read says so instead of drawing an empty table.
    assert_eq!(seen["sources_without_api"]["rows"], 0, "{}", seen["sources_without_api"]);
    assert!(
        seen["sources_without_api"]["none"].as_str().unwrap().contains("No repository was read through GitHub's API"),
        "{}",
        seen["sources_without_api"]
    );
    // Below the hours, what the API read per repository (its last run's counts).
    let api: Vec<Vec<String>> = serde_json::from_value(seen["sources"]["github"].clone()).unwrap();
    assert_eq!(api.len(), 5, "{api:?}");
    let nilcsi = api.iter().find(|r| r[0] == "nilcsi/topic-interview-questions").unwrap();
    assert_eq!(&nilcsi[1..8], ["ok", "5", "0", "6", "0", "3", "5"], "{nilcsi:?}");
    assert!(nilcsi[8].starts_with("2025-01-01T15:"), "{nilcsi:?}");
    // 25 calls, the mock's quota counting down from 5,000: the last read left 4,975.
    let summary = seen["sources"]["github_summary"].as_str().unwrap();
    assert!(
        summary
            .contains("25 calls read 8 PRs, 3 issues, 8 comments and 0 reviews; quota left after the last call: 4,975"),
        "{summary}"
    );
    // The editor's rows are `swelake sql --format json`'s.
    let want: Vec<Vec<String>> = sql_json(&demo, query)
        .iter()
        .map(|r| {
            ["repo_name", "prs", "last"]
                .iter()
                .map(|c| r[*c].as_str().map_or_else(|| r[*c].to_string(), str::to_string))
                .collect()
        })
        .collect();
    assert_eq!(seen["sql"]["rows"], serde_json::json!(want));
    // Column types as DataFusion plans them (the lake's strings read as views).
    assert_eq!(seen["sql"]["types"], serde_json::json!(["Utf8View", "Int64", "Int64"]));
    assert!(seen["sql"]["url"].as_str().unwrap().contains("/sql?q=SELECT"), "{}", seen["sql"]);
    assert_eq!(seen["sql_from_link"]["rows"], seen["sql"]["rows"]);
    assert!(!seen["sql_error"].as_str().unwrap().is_empty());
    // The instance page shows its oracle diff.
    assert_eq!(
        seen["instance"]["oracle_patch"].as_str().unwrap().trim_end(),
        seed[0]["oracle_patch"].as_str().unwrap().trim_end()
    );
    assert_eq!(seen["instance"]["score"], "reward -1.000000");
    // The payloads are text: no dialog, no injected node, nothing ran.
    assert_eq!(seen["xss"]["cells"], serde_json::json!([PAYLOAD_TITLE, PAYLOAD_BODY]));
    assert_eq!(seen["xss"]["dialogs"], 0);
    assert_eq!(seen["xss"]["pwned"], Value::Null);
    assert_eq!(seen["xss"]["injected"], 0);
    assert_eq!(seen["xss"]["scripts"], 1);
    for page in ["status", "sources", "sql", "dataset", "instance", "xss"] {
        assert!(shots.join(format!("{page}.png")).is_file(), "{page}.png");
    }
}

#[test]
fn an_address_off_loopback_needs_a_token() {
    let o = Command::new(env!("CARGO_BIN_EXE_swelake"))
        .args(["serve", "--lake", "/nonexistent", "--bind", "0.0.0.0:0"])
        .env_remove("SWELAKE_TOKEN")
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("not a loopback address") && err.contains("--token"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn with_a_token_every_endpoint_asks_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let hours = hours_lake(dir.path()).await;
    let config = dir.path().join("curation.toml");
    std::fs::write(&config, "[completeness]\nexpect = \"range\"\n").unwrap();
    let s = serve(
        &["--lake", &hours, "--token", "s3cret", "--config", config.to_str().unwrap(), "--pg-bind", "127.0.0.1:0"],
        &[],
    );
    // Every endpoint, read or post, without the token and with a wrong one.
    let routes = [
        ("GET", "/api/status"),
        ("GET", "/api/hours"),
        ("GET", "/api/tables"),
        ("GET", "/api/card"),
        ("GET", "/api/instances"),
        ("GET", "/api/instances/pallets%2Fjinja%231"),
        ("POST", "/api/sql"),
        ("POST", "/api/instances/pallets%2Fjinja%231/score"),
    ];
    for (method, path) in routes {
        let body = if method == "POST" { Some(r#"{"sql": "SELECT 1", "answer": "x"}"#) } else { None };
        let json = [("Host", s.http.as_str()), ("Content-Type", "application/json")];
        assert_eq!(http_with(&s.http, method, path, &json, body).0, 401, "{method} {path} without a token");
        let wrong = [json[0], json[1], ("Authorization", "Bearer s3cre")];
        assert_eq!(http_with(&s.http, method, path, &wrong, body).0, 401, "{method} {path} with a wrong token");
    }
    // The pages themselves hold no data and no token.
    let (code, page) = http(&s.http, "GET", "/status", None);
    assert_eq!(code, 200);
    assert!(!page.contains("s3cret"));
    let right = [("Host", s.http.as_str()), ("Authorization", "Bearer s3cret")];
    let (code, body) = http_with(&s.http, "GET", "/api/hours", &right, None);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"verdict\":\"missing\""), "{body}");
    // Over the wire protocol the token is the password.
    if let Some(psql) = tool("psql") {
        let pg = s.pg.clone().unwrap();
        let (host, port) = pg.rsplit_once(':').unwrap();
        let run = |password: &str| {
            Command::new(&psql)
                .args([
                    "-X",
                    "-A",
                    "-t",
                    "-h",
                    host,
                    "-p",
                    port,
                    "-U",
                    "analyst",
                    "-c",
                    "SELECT count(*) FROM source_hours",
                ])
                .env("PGPASSWORD", password)
                .env("PGCONNECT_TIMEOUT", "10")
                .output()
                .unwrap()
        };
        let o = run("s3cret");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "13");
        let o = run("wrong");
        assert!(!o.status.success());
        assert!(
            String::from_utf8_lossy(&o.stderr).to_lowercase().contains("password authentication failed"),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

const HEAVY: &str = "SELECT count(*) FROM range(1, 30000000000) WHERE value % 7 = 3";

/// Every table's Delta version, read from the lake's logs.
async fn versions(lake: &str) -> std::collections::BTreeMap<String, i64> {
    Lake::open(lake).unwrap().session_at_versions().await.unwrap().1
}

/// Writes in every disguise a client could send, each naming a file under `scratch` where it
/// writes one.
fn writes(scratch: &Path) -> Vec<String> {
    let f = |name: &str| scratch.join(name).display().to_string();
    vec![
        format!("EXPLAIN ANALYZE COPY (SELECT 'x') TO '{}'", f("psql-explain-copy.csv")),
        format!("COPY (SELECT 'x') TO '{}'", f("psql-copy.csv")),
        "EXPLAIN ANALYZE INSERT INTO pull_requests (repo_name, number) VALUES ('x/y', 1)".into(),
        "EXPLAIN ANALYZE DELETE FROM pull_requests WHERE number > 0".into(),
        "EXPLAIN ANALYZE UPDATE pull_requests SET title = 'x'".into(),
        "CREATE TABLE copied AS SELECT * FROM pull_requests".into(),
        format!("CREATE EXTERNAL TABLE ext (a INT) STORED AS CSV LOCATION '{}'", f("psql-ext.csv")),
        "INSERT INTO pull_requests (repo_name, number) VALUES ('x/y', 1)".into(),
        "PREPARE p AS INSERT INTO pull_requests (repo_name, number) VALUES ($1, $2)".into(),
    ]
}

/// The issue's whole list: writes refused on every path (psql's simple protocol, psycopg 3's
/// extended one, JDBC), settings kept per connection, and `--row-limit` / `--timeout` on
/// queries, cursors and EXPLAIN ANALYZE over PostgreSQL and HTTP. Afterwards no file exists
/// and every table is at its version of before.
#[tokio::test(flavor = "multi_thread")]
async fn every_path_stays_read_only_and_within_its_limits() {
    let dir = tempfile::tempdir().unwrap();
    let (demo, _) = crate::curation::sample_lake(dir.path(), None).await;
    let lake = demo.location();
    let before = versions(&lake).await;
    let scratch = dir.path().join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    let s = serve(&["--lake", &lake, "--pg-bind", "127.0.0.1:0", "--row-limit", "5", "--timeout", "3s"], &[]);
    let pg = s.pg.clone().unwrap();
    let (host, port) = pg.rsplit_once(':').unwrap();
    let events: usize = sql_json(&lake, "SELECT count(*) AS n FROM events")[0]["n"].as_u64().unwrap() as usize;
    assert!(events > 5, "the limit must cut something: {events} events");

    // One scalar that would build 2 GB, three at once over HTTP (and PostgreSQL below): each
    // refused within 5 s, the server's memory under 1 GiB all along, the next query answered.
    const HUGE: &str = "SELECT length(repeat('x', 2000000000))";
    let attacks: Vec<_> = (0..3)
        .map(|_| {
            let http_addr = s.http.clone();
            std::thread::spawn(move || {
                let started = std::time::Instant::now();
                let body = serde_json::json!({ "sql": HUGE }).to_string();
                let (code, body) = http(&http_addr, "POST", "/api/sql", Some(&body));
                (code, body, started.elapsed())
            })
        })
        .collect();
    for a in attacks {
        let (code, body, took) = a.join().unwrap();
        assert_ne!(code, 200, "{body}");
        assert!(body.contains("53200") && body.contains("repeat"), "{body}");
        assert!(took < std::time::Duration::from_secs(5), "answered after {took:?}");
    }
    if let Some(psql) = tool("psql") {
        let started = std::time::Instant::now();
        let o = Command::new(&psql)
            .args(["-X", "-A", "-t", "-v", "VERBOSITY=verbose", "-h", host, "-p", port, "-U", "analyst", "-d", "lake"])
            .args(["-c", HUGE])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains("53200"), "{err}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
    }
    assert!(s.peak_rss() < 1 << 30, "the server reached {} MiB", s.peak_rss() >> 20);
    let (code, body) = http(&s.http, "POST", "/api/sql", Some(r#"{"sql": "SELECT 1 AS one"}"#));
    assert_eq!(code, 200, "{body}");

    if let Some(psql) = tool("psql") {
        // Each `-c` is one simple-protocol query on the same connection.
        let psql_run = |cmds: &[&str]| {
            let mut c = Command::new(&psql);
            c.args(["-X", "-A", "-t", "-v", "VERBOSITY=verbose", "-v", "ON_ERROR_STOP=1", "-h", host, "-p", port]);
            c.args(["-U", "analyst", "-d", "lake"]).env("PGCONNECT_TIMEOUT", "10");
            for cmd in cmds {
                c.args(["-c", cmd]);
            }
            let started = std::time::Instant::now();
            let o = c.output().unwrap();
            (
                o.status.success(),
                String::from_utf8_lossy(&o.stdout).to_string(),
                String::from_utf8_lossy(&o.stderr).to_string(),
                started.elapsed(),
            )
        };
        for w in writes(&scratch) {
            let (ok, _, err, _) = psql_run(&[&w]);
            assert!(!ok, "psql ran {w}");
            assert!(err.contains("25006") && err.contains("read-only"), "{w}: {err}");
        }
        let (ok, out, err, _) = psql_run(&["SELECT id, type FROM events"]);
        assert!(ok, "{err}");
        assert_eq!(out.lines().count(), 5, "{out}");
        assert!(err.contains("cut to its first 5 rows"), "{err}");
        for cmds in [
            vec![HEAVY],
            vec![&*format!("EXPLAIN ANALYZE {HEAVY}")],
            vec!["BEGIN", &*format!("DECLARE h CURSOR FOR {HEAVY}"), "FETCH ALL FROM h"],
        ] {
            let (ok, _, err, took) = psql_run(&cmds);
            assert!(!ok && err.contains("57014"), "{cmds:?}: {err}");
            assert!(took < std::time::Duration::from_secs(10), "{cmds:?} took {took:?}");
        }
        let (ok, out, err, _) = psql_run(&[
            "BEGIN",
            "DECLARE c CURSOR FOR SELECT id FROM events ORDER BY id",
            "FETCH ALL FROM c",
            "COMMIT",
        ]);
        assert!(ok, "{err}");
        let fetched: Vec<&str> =
            out.lines().filter(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_digit())).collect();
        assert_eq!(fetched.len(), 5, "{out}");
    }

    if let Some(py) = crate::python::python() {
        let out = crate::python::script(&py, "console_pg.py", &[host, port, scratch.to_str().unwrap()], &[]);
        let seen: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
        for (what, r) in seen["writes"].as_object().unwrap() {
            assert_eq!(r["ok"], false, "psycopg ran {what}: {r}");
            assert_eq!(r["sqlstate"], "25006", "{what}: {r}");
            assert!(r["error"].as_str().unwrap().contains("read-only"), "{what}: {r}");
        }
        assert_eq!(seen["after_refusals"]["ok"], true, "{}", seen["after_refusals"]);
        // Settings: the engine's refused, a driver's kept on its own connection.
        for k in ["set_engine", "set_memory", "set_spill"] {
            assert_eq!(seen[k]["sqlstate"], "25006", "{k}: {}", seen[k]);
        }
        assert_eq!(seen["set_application_name"]["ok"], true, "{}", seen["set_application_name"]);
        assert_eq!(seen["a_application_name"]["rows"][0][0], "connection-a");
        assert_ne!(seen["b_application_name"]["rows"][0][0], "connection-a", "{}", seen["b_application_name"]);
        for k in ["a_batch_size", "b_batch_size"] {
            assert_eq!(
                seen[k]["rows"][0],
                serde_json::json!(["datafusion.execution.batch_size", "8192"]),
                "{k}: {}",
                seen[k]
            );
        }
        let want_binary: Vec<Vec<String>> =
            sql_json(&lake, "SELECT number, repo_name FROM pull_requests WHERE number >= 0 ORDER BY number LIMIT 3")
                .iter()
                .map(|r| vec![r["number"].to_string(), r["repo_name"].as_str().unwrap().to_string()])
                .collect();
        assert_eq!(seen["binary_rows"], serde_json::json!(want_binary));
        // Limits on the extended protocol, EXPLAIN ANALYZE and cursors.
        assert_eq!(seen["events"]["rows"].as_array().unwrap().len(), 5, "{}", seen["events"]);
        assert!(seen["events"]["notices"].to_string().contains("cut to its first 5 rows"), "{}", seen["events"]);
        for k in ["heavy_extended", "explain_analyze_heavy", "declare_heavy"] {
            assert_eq!(seen[k]["sqlstate"], "57014", "{k}: {}", seen[k]);
            assert!(seen[k]["seconds"].as_f64().unwrap() < 10.0, "{k}: {}", seen[k]);
        }
        assert_eq!(seen["declare"]["ok"], true, "{}", seen["declare"]);
        assert_eq!(seen["fetch_all"]["rows"].as_array().unwrap().len(), 5, "{}", seen["fetch_all"]);
        assert_eq!(seen["named_cursor"]["ok"], true, "{}", seen["named_cursor"]);
        assert_eq!(seen["named_cursor"]["columns"], serde_json::json!(["id", "type"]));
        assert_eq!(seen["named_cursor"]["rows"], 5);
        // A client's statement_timeout lowers the limit for its connection only, never raises it.
        assert_eq!(seen["show_timeout_low"]["rows"][0][0], "1000ms");
        assert_eq!(seen["heavy_low"]["sqlstate"], "57014");
        assert!(seen["heavy_low"]["seconds"].as_f64().unwrap() < 2.5, "{}", seen["heavy_low"]);
        assert!(
            seen["set_timeout_high"]["notices"].to_string().contains("at most 3000 ms"),
            "{}",
            seen["set_timeout_high"]
        );
        assert_eq!(seen["show_timeout_high"]["rows"][0][0], "3000ms");
        assert_eq!(seen["show_timeout_other"]["rows"][0][0], "3000ms");
    }

    // JDBC, as DBeaver and Metabase connect: the catalogue, a prepared query, a refused write.
    let jar = Path::new("/usr/share/java/postgresql.jar");
    if let Some(java) = tool("java") {
        assert!(jar.is_file() || !required(), "{} is required: apt-get install libpostgresql-jdbc-java", jar.display());
        if jar.is_file() {
            let probe = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/jdbc/LakeProbe.java");
            let o = Command::new(java)
                .arg("-cp")
                .arg(jar)
                .arg(&probe)
                .arg(format!("jdbc:postgresql://{pg}/lake"))
                .output()
                .unwrap();
            assert!(
                o.status.success(),
                "{}\n{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            let seen: Value = serde_json::from_slice(&o.stdout).unwrap();
            let tables: Vec<String> = serde_json::from_value(seen["tables"].clone()).unwrap();
            for t in ["events", "pull_requests", "rl_seed"] {
                assert!(tables.contains(&t.to_string()), "{t} not in {tables:?}");
            }
            assert!(seen["columns"].as_array().unwrap().iter().any(|c| c == "merged_at"), "{}", seen["columns"]);
            let want: Vec<String> = sql_json(
                &lake,
                "SELECT repo_name, number FROM pull_requests WHERE number >= 0 ORDER BY repo_name, number",
            )
            .iter()
            .map(|r| format!("{}|{}", r["repo_name"].as_str().unwrap(), r["number"]))
            .collect();
            assert_eq!(seen["rows"], serde_json::json!(want));
            assert_eq!(seen["insert_sqlstate"], "25006");
        }
    }

    // HTTP: the same limits, and only its own Host and JSON bodies.
    let sql = |q: &str| http(&s.http, "POST", "/api/sql", Some(&serde_json::json!({ "sql": q }).to_string()));
    let (code, body) = sql("SELECT * FROM events");
    assert_eq!(code, 200, "{body}");
    let got: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(got["rows"].as_array().unwrap().len(), 5);
    assert_eq!(got["truncated"], true);
    let started = std::time::Instant::now();
    let (code, body) = sql(HEAVY);
    assert_eq!(code, 408, "{body}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "{:?}", started.elapsed());
    for w in writes(&scratch) {
        let (code, body) = sql(&w);
        assert_eq!(code, 400, "{w}: {body}");
        let e: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(e["sqlstate"], "25006", "{w}: {body}");
    }
    let json = ("Content-Type", "application/json");
    let (code, body) = http_with(&s.http, "GET", "/api/status", &[("Host", "evil.example"), json], None);
    assert_eq!(code, 403, "{body}");
    let (code, body) =
        http_with(&s.http, "GET", "/api/status", &[("Host", &s.http.replace("127.0.0.1", "localhost")), json], None);
    assert_eq!(code, 200, "{body}");
    let plain = [("Host", s.http.as_str()), ("Content-Type", "text/plain")];
    let (code, body) = http_with(&s.http, "POST", "/api/sql", &plain, Some(r#"{"sql": "SELECT 1"}"#));
    assert_eq!(code, 415, "{body}");

    // Nothing was written: no file, no commit.
    let left: Vec<_> = std::fs::read_dir(&scratch).unwrap().map(|e| e.unwrap().path()).collect();
    assert!(left.is_empty(), "files written: {left:?}");
    assert_eq!(versions(&lake).await, before);
}
