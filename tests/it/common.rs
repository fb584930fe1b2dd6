use std::path::PathBuf;

/// The small real test data kept in the repository (`tests/data`): two GH Archive excerpts
/// and the reward parity corpus scored by the reference implementation.
pub fn data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

pub fn gharchive(name: &str) -> PathBuf {
    data().join("gharchive").join(name)
}

/// The real repository histories (`$SWELAKE_SHARED/history`, else `../shared/history` beside the
/// repository), or `None` — with a line saying the test is skipped — on a checkout without them.
pub fn history() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("SWELAKE_SHARED").map(|p| PathBuf::from(p).join("history")),
        Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/history")),
    ];
    let found = candidates.into_iter().flatten().find(|c| c.join("pallets-jinja.bundle").is_file());
    if found.is_none() {
        eprintln!(
            "SKIPPED: no real histories (../shared/history, or $SWELAKE_SHARED/history) on this checkout; \
             this test runs where they are (CI has them)"
        );
    }
    found
}

/// Decompresses a real excerpt into its lines.
pub fn read_lines(path: &std::path::Path) -> Vec<String> {
    use std::io::BufRead;
    let f = std::fs::File::open(path).unwrap();
    std::io::BufReader::new(flate2::read::MultiGzDecoder::new(f)).lines().map(|l| l.unwrap()).collect()
}

pub fn quiet_ingest(source: &std::path::Path) -> swelake::ingest::IngestOptions {
    swelake::ingest::IngestOptions {
        source: source.to_string_lossy().into_owned(),
        show_progress: false,
        ..Default::default()
    }
}

/// Runs a query and returns the first two columns as (string, i64) pairs.
pub async fn pairs(lake: &swelake::lake::Lake, sql: &str) -> Vec<(String, i64)> {
    use arrow::array::{Array, AsArray};
    let batches = swelake::sql::query(lake, sql).await.unwrap();
    let mut out = Vec::new();
    for b in batches {
        let k = arrow::compute::cast(b.column(0), &arrow::datatypes::DataType::Utf8).unwrap();
        let v = arrow::compute::cast(b.column(1), &arrow::datatypes::DataType::Int64).unwrap();
        let (k, v) = (k.as_string::<i32>(), v.as_primitive::<arrow::datatypes::Int64Type>());
        for i in 0..b.num_rows() {
            out.push((if k.is_null(i) { "NULL".to_string() } else { k.value(i).to_string() }, v.value(i)));
        }
    }
    out
}

pub async fn count(lake: &swelake::lake::Lake, sql: &str) -> i64 {
    pairs(lake, &format!("SELECT 'n', ({sql})")).await[0].1
}

/// Each table's Delta schema and partition columns agree with its file in `schemas/`.
pub async fn assert_tables_match_schemas(lake: &swelake::lake::Lake, tables: &[&str]) {
    for &table in tables {
        let t = lake.open_table(table).await.unwrap();
        let snap = t.snapshot().unwrap();
        let d = swelake::schema::diff(
            &swelake::schema::load(table).unwrap(),
            &snap.snapshot().arrow_schema(),
            snap.metadata().partition_columns(),
        );
        assert!(d.is_empty(), "{table}: {d:#?}");
    }
}

/// An S3-compatible server on loopback: the one `.ci/run` started (`SWELAKE_TEST_S3_ENDPOINT`),
/// else a moto server of this test's own, stopped when the guard drops.
pub fn s3_server() -> (Option<Moto>, String) {
    use std::net::{TcpListener, TcpStream};
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    if let Ok(e) = std::env::var("SWELAKE_TEST_S3_ENDPOINT") {
        return (None, e);
    }
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Command::new("moto_server")
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("moto_server not found: the S3 tests need `pip install 'moto[server]'` (.ci/run installs it)");
    let moto = Moto(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "moto_server did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    (Some(moto), format!("http://127.0.0.1:{port}"))
}

pub struct Moto(std::process::Child);

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Creates a bucket with a plain (unsigned) PUT, which moto accepts.
pub fn create_bucket(endpoint: &str, bucket: &str) {
    use std::io::{Read, Write};
    let addr = endpoint.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "PUT /{bucket} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
}

/// Clones the shared history `name`'s bundle as a bare mirror at `root/src/{name}.git` (where a
/// `{root}/src/{repo}.git` repo-url template finds it); returns its path.
pub fn mirror_of_bundle(history: &std::path::Path, name: &str, root: &std::path::Path) -> PathBuf {
    let mirror = root.join("src").join(format!("{name}.git"));
    let ok = std::process::Command::new("git")
        .args(["-c", "init.defaultBranch=main", "clone", "--quiet", "--mirror"])
        .arg(history.join(format!("{}.bundle", name.replace('/', "-"))))
        .arg(&mirror)
        .status()
        .unwrap();
    assert!(ok.success(), "cloning the {name} bundle");
    mirror
}

/// Cuts a real event down to the payload shape of GitHub's 2025-10-07 trim (DESIGN.md §3):
/// a PR event's `pull_request` becomes a stub (id, number, url, head and base), a push keeps
/// its refs and shas only; issues and comments stay whole.
pub fn trim_payload(mut v: serde_json::Value) -> serde_json::Value {
    use serde_json::json;
    let t = v["type"].as_str().unwrap().to_string();
    let p = v["payload"].clone();
    if t.starts_with("PullRequest") {
        let pr = &p["pull_request"];
        let side = |s: &serde_json::Value| json!({"ref": s["ref"], "sha": s["sha"], "repo": {"id": s["repo"]["id"], "url": s["repo"]["url"], "name": s["repo"]["name"]}});
        let stub = json!({"id": pr["id"], "number": pr["number"], "url": pr["url"], "head": side(&pr["head"]), "base": side(&pr["base"])});
        let mut np = json!({"action": p["action"], "number": p["number"], "pull_request": stub});
        for k in ["review", "comment"] {
            if !p[k].is_null() {
                np[k] = p[k].clone();
            }
        }
        v["payload"] = np;
    } else if t == "PushEvent" {
        v["payload"] = json!({"repository_id": p["repository_id"], "push_id": p["push_id"], "ref": p["ref"], "head": p["head"], "before": p["before"]});
    }
    v
}
