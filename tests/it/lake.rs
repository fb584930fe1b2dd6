//! The production lake: the pipeline on an S3-compatible server (moto, on loopback) against the
//! same run on local disk; concurrent ingest processes; overlapping runs; processes killed at
//! named failpoints and at random moments, then rerun; maintenance; credentials kept out of
//! every output.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use swelake::lake::Lake;

use crate::common::{count, create_bucket, gharchive, read_lines, s3_server};

const SENTINEL: &str = "sentinel-SECRET-6c1f2a9b";

/// The environment of a process that reaches the S3 server, with the sentinel as its secret.
fn s3_env(endpoint: &str) -> Vec<(String, String)> {
    [
        ("AWS_ENDPOINT_URL", endpoint),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_ACCESS_KEY_ID", "swelake-test"),
        ("AWS_SECRET_ACCESS_KEY", SENTINEL),
        ("AWS_REGION", "us-east-1"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// The same settings as storage options, for the test's own reads.
fn s3_options(endpoint: &str) -> Vec<(String, String)> {
    s3_env(endpoint).into_iter().map(|(k, v)| (k.to_ascii_lowercase(), v)).collect()
}

fn swelake(args: &[&str], env: &[(String, String)], extra: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_swelake"));
    c.args(args).env("RUST_LOG", "warn");
    for (k, v) in env {
        c.env(k, v);
    }
    for (k, v) in extra {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Sample repositories and a mirror cache for the git stages.
struct Repos {
    _dir: tempfile::TempDir,
    url: String,
    cache: PathBuf,
}

fn sample_repos() -> Repos {
    let dir = tempfile::tempdir().unwrap();
    swelake::samples::create_repos(&dir.path().join("repos")).unwrap();
    Repos { url: format!("{}/repos/{{repo}}.git", dir.path().display()), cache: dir.path().join("mirrors"), _dir: dir }
}

fn samples() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data-samples/gharchive").display().to_string()
}

/// `swelake run --all` with ingest and the git stages: the whole demo pipeline.
fn pipeline(lake: &str, repos: &Repos, env: &[(String, String)], extra: &[(&str, &str)]) -> Output {
    let cache = repos.cache.display().to_string();
    swelake(
        &[
            "-q",
            "run",
            "--all",
            "--source",
            &samples(),
            "--lake",
            lake,
            "--repo-url",
            &repos.url,
            "--cache-dir",
            &cache,
        ],
        env,
        extra,
    )
}

/// Columns whose values are the time (or the files) of a run, not data.
fn wall_clock(table: &str) -> &'static [&'static str] {
    match table {
        "_job_runs" => &["started_at", "finished_at", "detail", "output_version"],
        "events_rejected" => &["ingested_at"],
        "pr_snapshots" => &["snapshotted_at"],
        "snapshot_errors" => &["occurred_at"],
        _ => &[],
    }
}

/// Floats to 9 significant digits: the encoder's sums differ in the last bits between runs.
fn canonical(v: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap();
            Value::String(format!("{f:.9e}"))
        }
        Value::Array(a) => Value::Array(a.into_iter().map(canonical).collect()),
        Value::Object(o) => Value::Object(o.into_iter().map(|(k, v)| (k, canonical(v))).collect()),
        other => other,
    }
}

/// Every table of a lake as a sorted list of canonical JSON rows (a row multiset), leaving out
/// wall-clock columns and the tables in `skip`.
async fn dump(lake: &Lake, skip: &[&str]) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for t in lake.tables().await.unwrap() {
        if skip.contains(&t.as_str()) {
            continue;
        }
        let batches = swelake::sql::query(lake, &format!("SELECT * FROM \"{t}\"")).await.unwrap();
        let mut buf = Vec::new();
        swelake::sql::write(&batches, swelake::sql::Format::Jsonl, &mut buf).unwrap();
        let mut rows: Vec<String> = String::from_utf8(buf)
            .unwrap()
            .lines()
            .map(|l| {
                let mut v: serde_json::Map<String, serde_json::Value> = serde_json::from_str(l).unwrap();
                for c in wall_clock(&t) {
                    v.remove(*c);
                }
                canonical(serde_json::Value::Object(v)).to_string()
            })
            .collect();
        rows.sort();
        out.insert(t, rows);
    }
    out
}

fn assert_same(a: &BTreeMap<String, Vec<String>>, b: &BTreeMap<String, Vec<String>>, what: &str) {
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>(), "{what}: tables differ");
    for (t, rows) in a {
        let other = &b[t];
        if rows != other {
            let only_a: Vec<_> = rows.iter().filter(|r| !other.contains(r)).take(2).collect();
            let only_b: Vec<_> = other.iter().filter(|r| !rows.contains(r)).take(2).collect();
            panic!(
                "{what}: table {t} differs ({} vs {} rows)\n  only in the first: {only_a:?}\n  only in the second: {only_b:?}",
                rows.len(),
                other.len()
            );
        }
    }
}

fn python_has(modules: &str) -> bool {
    Command::new("python3")
        .args(["-c", &format!("import {modules}")])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_demo_pipeline_on_s3_equals_the_local_run() {
    let (_moto, endpoint) = s3_server();
    create_bucket(&endpoint, "pipeline");
    let env = s3_env(&endpoint);
    let repos = sample_repos();
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("lake");
    let o = pipeline(local.to_str().unwrap(), &repos, &[], &[]);
    assert!(o.status.success(), "{}", text(&o));
    let o = pipeline("s3://pipeline/lake", &repos, &env, &[]);
    assert!(o.status.success(), "{}", text(&o));

    // Nothing of the S3 run is on local disk but caches: every table and shard is in the bucket.
    let s3 = Lake::open_with("s3://pipeline/lake", &s3_options(&endpoint)).unwrap();
    assert!(s3.local_root().is_none());
    let local = Lake::open(local.to_str().unwrap()).unwrap();
    let (a, b) = (dump(&local, &[]).await, dump(&s3, &[]).await);
    assert!(a.len() >= 15 && a["rl_seed"].len() >= 2, "{:?}", a.keys());
    assert_same(&a, &b, "local vs S3");
    let (store, shards) = s3.object("shards/seed");
    let listed: Vec<_> = futures::TryStreamExt::try_collect::<Vec<_>>(store.list(Some(&shards))).await.unwrap();
    assert!(listed.iter().any(|m| m.location.as_ref().ends_with("part-00000.parquet")), "{listed:?}");

    // `swelake sql` reads the bucket.
    let o = swelake(
        &["sql", "--lake", "s3://pipeline/lake", "--format", "csv", "SELECT count(*) AS n FROM rl_seed"],
        &env,
        &[],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), format!("n\n{}", a["rl_seed"].len()));

    // The console on the bucket answers its status page, and no credential reaches it.
    let served = crate::console::serve(&["--lake", "s3://pipeline/lake"], &env);
    let (code, body) = crate::console::http(&served.http, "GET", "/api/status", None);
    assert_eq!(code, 200, "{body}");
    assert!(!body.contains(SENTINEL), "{body}");
    let st: serde_json::Value = serde_json::from_str(&body).unwrap();
    let tables: Vec<&str> = st["tables"].as_array().unwrap().iter().map(|t| t["table"].as_str().unwrap()).collect();
    assert!(tables.contains(&"rl_seed") && tables.contains(&"events"), "{tables:?}");
    assert!(st["jobs"].as_array().unwrap().iter().any(|j| j["last_run"]["outcome"] == "ok"), "{body}");
    drop(served);

    // The trainer's readers take the shards straight from the store.
    let shards = "s3://pipeline/lake/shards/seed/*.parquet";
    let scored = dir.path().join("scored.parquet");
    let rollouts = dir.path().join("rollouts.parquet");
    write_rollouts(&local, &rollouts).await;
    let o = swelake(
        &[
            "reward",
            "--rollouts",
            rollouts.to_str().unwrap(),
            "--out",
            scored.to_str().unwrap(),
            "--seed-shards",
            shards,
        ],
        &env,
        &[],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("\"rows\":"), "{}", text(&o));

    // Independent readers, where python3 has them: deltalake-python and polars on the bucket.
    if python_has("deltalake, polars") {
        let script = format!(
            "import deltalake, polars as pl\n\
             o = dict(AWS_ENDPOINT_URL='{endpoint}', AWS_ALLOW_HTTP='true', AWS_ACCESS_KEY_ID='x', \
             AWS_SECRET_ACCESS_KEY='x', AWS_REGION='us-east-1', AWS_S3_ALLOW_UNSAFE_RENAME='true')\n\
             t = deltalake.DeltaTable('s3://pipeline/lake/events', storage_options=o)\n\
             n1 = t.to_pyarrow_table().num_rows\n\
             n2 = pl.read_delta('s3://pipeline/lake/pull_requests', storage_options=o).height\n\
             print(n1, n2)\n"
        );
        let o = Command::new("python3").args(["-c", &script]).output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        let got = String::from_utf8_lossy(&o.stdout).trim().to_string();
        assert_eq!(got, format!("{} {}", a["events"].len(), a["pull_requests"].len()));
    } else {
        eprintln!("python3 lacks deltalake or polars: the independent readers are not checked here");
    }
}

/// A rollout file for the seed instances of `lake`: the oracle patch as every answer.
async fn write_rollouts(lake: &Lake, path: &Path) {
    let batches = swelake::sql::query(
        lake,
        "SELECT instance_id, concat(instance_id, '/t') AS group_id, CAST(0 AS INT) AS sample_index, \
         '<think>x</think>\n<solution>\nnothing\n</solution>' AS completion FROM rl_seed",
    )
    .await
    .unwrap();
    let schema = batches[0].schema();
    let mut w = parquet::arrow::ArrowWriter::try_new(std::fs::File::create(path).unwrap(), schema, None).unwrap();
    for b in &batches {
        w.write(b).unwrap();
    }
    w.close().unwrap();
}

/// `n` hour files of 2015-01-01 (one `event_date` partition) cut from the real excerpt.
fn hours(dir: &Path, n: usize) -> usize {
    let lines = read_lines(&gharchive("2015-01-01-15.json.gz"));
    let per = lines.len() / n;
    for (i, chunk) in lines.chunks(per).take(n).enumerate() {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        for l in chunk {
            writeln!(gz, "{l}").unwrap();
        }
        std::fs::write(dir.join(format!("2015-01-01-{i}.json.gz")), gz.finish().unwrap()).unwrap();
    }
    per * n
}

/// 4 ingest processes on disjoint hour ranges of one partition, at once.
async fn four_writers(lake_loc: &str, env: &[(String, String)], options: &[(String, String)]) {
    let dir = tempfile::tempdir().unwrap();
    let lines = hours(dir.path(), 8);
    let src = dir.path().display().to_string();
    let children: Vec<_> = (0..4)
        .map(|w| {
            let (from, to) = (format!("2015-01-01-{}", 2 * w), format!("2015-01-01-{}", 2 * w + 1));
            let mut c = Command::new(env!("CARGO_BIN_EXE_swelake"));
            c.args(["-q", "ingest", "--source", &src, "--lake", lake_loc, "--from", &from, "--to", &to, "--jobs", "1"]);
            c.envs(env.iter().cloned()).stdout(Stdio::piped()).stderr(Stdio::piped());
            c.spawn().unwrap()
        })
        .collect();
    for c in children {
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "a writer failed: {}", text(&o));
    }
    let lake = Lake::open_with(lake_loc, options).unwrap();
    let events = count(&lake, "SELECT count(*) FROM events").await;
    let rejected = count(&lake, "SELECT count(*) FROM events_rejected").await;
    assert_eq!(events + rejected, lines as i64, "every line exactly once");
    assert_eq!(count(&lake, "SELECT count(DISTINCT id) FROM events").await, events, "no event twice");
    assert_eq!(count(&lake, "SELECT count(DISTINCT source_file) FROM events").await, 8);
    assert_eq!(count(&lake, "SELECT count(*) FROM _job_runs WHERE job = 'ingest' AND status = 'ok'").await, 8);
    // Every commit landed: one add-only commit per hour in `events` after its creation.
    let t = lake.open_table("events").await.unwrap();
    assert_eq!(t.version(), Some(8), "creation + 8 hour commits");
}

#[tokio::test(flavor = "multi_thread")]
async fn four_ingest_processes_on_disjoint_hours_local_and_s3() {
    let dir = tempfile::tempdir().unwrap();
    four_writers(dir.path().join("lake").to_str().unwrap(), &[], &[]).await;
    let (_moto, endpoint) = s3_server();
    create_bucket(&endpoint, "writers");
    four_writers("s3://writers/lake", &s3_env(&endpoint), &s3_options(&endpoint)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_overlapping_run_exits_busy_or_waits() {
    let dir = tempfile::tempdir().unwrap();
    let src_dir = dir.path().join("hours");
    std::fs::create_dir(&src_dir).unwrap();
    hours(&src_dir, 2);
    let src = src_dir.display().to_string();
    let lake_loc = dir.path().join("lake").display().to_string();
    let args = ["-q", "ingest", "--source", &src, "--lake", &lake_loc];
    // The first run pauses while it holds its leases.
    let first = Command::new(env!("CARGO_BIN_EXE_swelake"))
        .args(args)
        .env("SWELAKE_FAILPOINT", "lease.acquired:ingest=pause")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lake = Lake::open(&lake_loc).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while lake.leases(Some("ingest")).await.unwrap().iter().all(|e| e.released) {
        assert!(Instant::now() < deadline, "the first run took no lease");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let second = swelake(&args, &[], &[]);
    assert_eq!(second.status.code(), Some(75), "{}", text(&second));
    let msg = String::from_utf8_lossy(&second.stderr).to_string();
    assert_eq!(msg.trim().lines().count(), 1, "one line: {msg}");
    assert!(msg.starts_with("busy: job ingest input 2015-01-01-") && msg.contains("held by run"), "{msg}");
    // With --wait-for-lease the second waits, then finds the hours done.
    let mut waiting = args.to_vec();
    waiting.extend(["--wait-for-lease", "60s", "--json"]);
    let third = swelake(&waiting, &[], &[]);
    let o = first.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(third.status.success(), "{}", text(&third));
    let summary: serde_json::Value = serde_json::from_slice(&third.stdout).unwrap();
    assert_eq!((summary["files_ingested"].as_u64(), summary["files_skipped"].as_u64()), (Some(0), Some(2)));

    // The same for a SQL job of `swelake run`, which a scheduler sees in the JSON line.
    let run = ["run", "pr_timeline", "--lake", lake_loc.as_str(), "--json"];
    let first = Command::new(env!("CARGO_BIN_EXE_swelake"))
        .args(run)
        .env("SWELAKE_FAILPOINT", "lease.acquired:pr_timeline=pause")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while lake.leases(Some("pr_timeline")).await.unwrap().iter().all(|e| e.released) {
        assert!(Instant::now() < deadline + Duration::from_secs(20), "the run took no lease");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let second = swelake(&run, &[], &[]);
    assert_eq!(second.status.code(), Some(75), "{}", text(&second));
    let line: serde_json::Value = serde_json::from_slice(&second.stdout).unwrap();
    assert_eq!((line["ok"].as_bool(), line["failed_job"].as_str()), (Some(false), Some("pr_timeline")));
    assert!(first.wait_with_output().unwrap().status.success());
    let again = swelake(&run, &[], &[]);
    assert!(again.status.success(), "{}", text(&again));
    let line: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(line["ok"], true);
    let jobs = line["jobs"].as_array().unwrap();
    assert!(jobs.iter().any(|j| j["job"] == "ingest" && j["outcome"] == "skipped"), "{line}");
    assert!(jobs.iter().any(|j| j["job"] == "pr_timeline" && j["outcome"] == "up_to_date"), "{line}");
}

/// Failpoints of the pipeline: where a crash leaves a table committed but its run unrecorded,
/// or files uploaded but not committed.
const LOCAL_POINTS: [&str; 21] = [
    "commit.before:events",
    "commit.after:events",
    "commit.after:events_rejected",
    "commit.before:pr_timeline",
    "commit.after:pr_timeline",
    "commit.after:pull_requests",
    "commit.before:pr_files",
    "commit.after:pr_files",
    "commit.after:file_blobs",
    "commit.after:pr_snapshots",
    "commit.after:pr_commits",
    "commit.after:pr_issue_links",
    "commit.after:issues",
    "commit.before:pr_quality",
    "commit.after:pr_quality",
    "commit.after:pr_relevant_files",
    "commit.before:rl_seed",
    "commit.after:rl_seed",
    "shards.after",
    "commit.after:_job_runs#3",
    "commit.before:_job_runs#9",
];

const S3_POINTS: [&str; 4] =
    ["upload.before:events", "upload.after:events", "upload.after:pr_files", "commit.after:blob_embeddings"];

#[tokio::test(flavor = "multi_thread")]
async fn killed_runs_rerun_to_the_clean_tables() {
    let repos = sample_repos();
    let dir = tempfile::tempdir().unwrap();
    let clean_loc = dir.path().join("clean").display().to_string();
    let o = pipeline(&clean_loc, &repos, &[], &[]);
    assert!(o.status.success(), "{}", text(&o));
    let clean = dump(&Lake::open(&clean_loc).unwrap(), &["_job_runs"]).await;

    let (_moto, endpoint) = s3_server();
    create_bucket(&endpoint, "faults");
    let env = s3_env(&endpoint);
    // (failpoint, lake, environment)
    type Case = (String, String, Vec<(String, String)>);
    let mut cases: Vec<Case> = LOCAL_POINTS
        .iter()
        .enumerate()
        .map(|(i, p)| (p.to_string(), dir.path().join(format!("l{i}")).display().to_string(), Vec::new()))
        .collect();
    cases.extend(S3_POINTS.iter().enumerate().map(|(i, p)| (p.to_string(), format!("s3://faults/l{i}"), env.clone())));
    let mut hit = 0;
    for (point, loc, env) in &cases {
        let crashed = pipeline(loc, &repos, env, &[("SWELAKE_FAILPOINT", point)]);
        if !crashed.status.success() {
            hit += 1;
            let name = point.split('#').next().unwrap();
            assert!(
                String::from_utf8_lossy(&crashed.stderr).contains(&format!("failpoint {name}")),
                "{}",
                text(&crashed)
            );
        }
        let rerun = pipeline(loc, &repos, env, &[]);
        assert!(rerun.status.success(), "rerun after {point}: {}", text(&rerun));
        let lake = Lake::open_with(loc, &s3_options(&endpoint)).unwrap();
        assert_same(&clean, &dump(&lake, &["_job_runs"]).await, &format!("after a crash at {point}"));
    }
    assert_eq!(hit, cases.len(), "every failpoint is reached by the pipeline");

    // Kills at random moments (SIGKILL), each followed by a rerun.
    let mut rng = swelake::rng::Rng::new(17);
    for i in 0..3 {
        let loc = dir.path().join(format!("r{i}")).display().to_string();
        let cache = repos.cache.display().to_string();
        let mut child = Command::new(env!("CARGO_BIN_EXE_swelake"))
            .args(["-q", "run", "--all", "--source", &samples(), "--lake", &loc, "--repo-url", &repos.url])
            .args(["--cache-dir", &cache])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(300 + rng.below(4000)));
        let _ = child.kill();
        let _ = child.wait();
        let rerun = pipeline(&loc, &repos, &[], &[]);
        assert!(rerun.status.success(), "rerun after a kill: {}", text(&rerun));
        assert_same(&clean, &dump(&Lake::open(&loc).unwrap(), &["_job_runs"]).await, "after a random kill");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reader_sees_one_version_while_an_hour_is_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().join("lake").to_str().unwrap()).unwrap();
    let mut opts = crate::common::quiet_ingest(&gharchive("2015-01-01-15.json.gz"));
    swelake::ingest::run(&lake, &opts).await.unwrap();
    let n = count(&lake, "SELECT count(*) FROM events").await;
    opts.force = true;
    let writer = {
        let lake = lake.clone();
        tokio::spawn(async move {
            for _ in 0..6 {
                swelake::ingest::run(&lake, &opts).await.unwrap();
            }
        })
    };
    let mut scans = 0;
    while !writer.is_finished() {
        let fresh = Lake::open(dir.path().join("lake").to_str().unwrap()).unwrap();
        assert_eq!(count(&fresh, "SELECT count(*) FROM events").await, n, "a scan saw a partial rewrite");
        scans += 1;
    }
    writer.await.unwrap();
    assert!(scans >= 2, "the reader scanned during the rewrites ({scans})");
}

#[tokio::test(flavor = "multi_thread")]
async fn maintenance_compacts_checkpoints_and_keeps_old_readers() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().join("lake").to_str().unwrap()).unwrap();
    for i in 0..200u64 {
        let rec = swelake::lake::runs::RunRecord::ok("t", &format!("p{i}"), i, i, 0, None, serde_json::json!({}));
        swelake::lake::runs::record(&lake, rec).await.unwrap();
    }
    let before = dump(&lake, &[]).await;
    let files_before = lake.table_status("_job_runs").await.unwrap().files;
    assert_eq!(files_before, 200);
    // A reader that opened the current version before maintenance.
    let old = lake.open_table("_job_runs").await.unwrap();
    let old_version = old.version();
    let ctx = datafusion::prelude::SessionContext::new();
    old.update_datafusion_session(&ctx.state()).unwrap();
    ctx.register_table("old", old.table_provider().await.unwrap()).unwrap();

    let opts = swelake::lake::maintain::MaintainOptions {
        vacuum_retention: Some(Duration::from_secs(3600)),
        ..Default::default()
    };
    let done = lake.maintain(&opts).await.unwrap();
    assert_eq!(done[0].files_before, 200);
    let st = lake.table_status("_job_runs").await.unwrap();
    assert!(st.files <= files_before / 10, "{st:?}");
    assert_eq!(st.last_checkpoint_version, Some(st.version), "{st:?}");
    assert!(st.last_optimize_ms.is_some());
    assert_eq!(dump(&lake, &[]).await, before, "the same rows");
    // The old version's files are all still there.
    let rows: usize =
        ctx.sql("SELECT * FROM old").await.unwrap().collect().await.unwrap().iter().map(|b| b.num_rows()).sum();
    assert_eq!((rows, old_version), (200, old.version()));
    // A retention under an hour could delete what such readers need: refused.
    let short = swelake::lake::maintain::MaintainOptions {
        vacuum_retention: Some(Duration::from_secs(60)),
        ..Default::default()
    };
    assert!(lake.maintain(&short).await.unwrap_err().to_string().contains("at least 3600s"));
    // Compaction keeps keys: a re-ingested hour still replaces exactly its rows.
    let mut opts = crate::common::quiet_ingest(&gharchive("2015-01-01-15.json.gz"));
    swelake::ingest::run(&lake, &opts).await.unwrap();
    let n = count(&lake, "SELECT count(*) FROM events").await;
    lake.maintain(&Default::default()).await.unwrap();
    opts.force = true;
    swelake::ingest::run(&lake, &opts).await.unwrap();
    assert_eq!(count(&lake, "SELECT count(*) FROM events").await, n);

    // Add actions carry the statistics readers skip files by.
    let log = dir.path().join("lake/events/_delta_log/00000000000000000001.json");
    let text = std::fs::read_to_string(log).unwrap();
    let add = text.lines().find(|l| l.contains("\"add\"")).unwrap();
    let add: serde_json::Value = serde_json::from_str(add).unwrap();
    let stats: serde_json::Value = serde_json::from_str(add["add"]["stats"].as_str().unwrap()).unwrap();
    for col in ["created_at", "repo_name", "repo_id", "type"] {
        assert!(stats["minValues"].get(col).is_some() && stats["nullCount"].get(col).is_some(), "{col}: {stats}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn credentials_appear_in_no_output_log_or_table() {
    let (_moto, endpoint) = s3_server();
    create_bucket(&endpoint, "secrets");
    let env = s3_env(&endpoint);
    let repos = sample_repos();
    let mut seen = String::new();
    let o = pipeline("s3://secrets/lake", &repos, &env, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let cache = repos.cache.display().to_string();
    for args in [
        vec!["-vv", "ingest", "--source", &samples(), "--lake", "s3://secrets/lake", "--force"],
        vec!["-vv", "run", "--all", "--lake", "s3://secrets/lake", "--repo-url", &repos.url, "--cache-dir", &cache],
        vec!["-vv", "status", "--lake", "s3://secrets/lake", "--json"],
        vec!["-vv", "status", "--lake", "s3://secrets/lake"],
        vec!["-vv", "maintain", "--lake", "s3://secrets/lake"],
        // Failures: a bucket that does not exist, a bad option, given on the command line too.
        vec!["-vv", "ingest", "--source", &samples(), "--lake", "s3://no-such-bucket/lake"],
        vec![
            "-vv",
            "--storage-option",
            "aws_secret_access_key=sentinel-SECRET-6c1f2a9b",
            "sql",
            "--lake",
            "s3://no-such-bucket/x",
            "SELECT * FROM events",
        ],
    ] {
        let o = swelake(&args, &env, &[("RUST_LOG", "trace")]);
        seen.push_str(&text(&o));
    }
    assert!(seen.contains("no-such-bucket"), "the failures were reported");
    assert!(!seen.contains(SENTINEL), "the secret appeared in output");
    // Nor in any object of the lake (tables, run records, leases, shards).
    let s3 = Lake::open_with("s3://secrets/lake", &s3_options(&endpoint)).unwrap();
    let (store, root) = s3.object("");
    let objects: Vec<_> = futures::TryStreamExt::try_collect::<Vec<_>>(store.list(Some(&root))).await.unwrap();
    assert!(objects.len() > 30);
    for m in objects {
        let bytes =
            object_store::ObjectStoreExt::get(store.as_ref(), &m.location).await.unwrap().bytes().await.unwrap();
        assert!(!bytes.windows(SENTINEL.len()).any(|w| w == SENTINEL.as_bytes()), "{}", m.location);
    }
}

#[test]
fn example_deployments_are_valid() {
    let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples");
    let manifests: Vec<String> = ["kubernetes/cronjob.yaml", "kubernetes/ingest-indexed-job.yaml"]
        .iter()
        .map(|m| examples.join(m).display().to_string())
        .collect();
    match Command::new("kubernetes-validate").arg("--strict").args(&manifests).output() {
        Ok(o) => {
            assert!(o.status.success(), "{}", text(&o));
            assert_eq!(text(&o).matches(" passed for resource ").count(), 2, "{}", text(&o));
        }
        Err(_) => {
            eprintln!("SKIPPED: kubernetes-validate not installed (pip install kubernetes-validate; .ci/run does)")
        }
    }
    // Every swelake command line of the examples parses (clap rejects unknown flags).
    for (sub, flags) in [
        ("run", vec!["--all", "--json", "--wait-for-lease", "10m", "--cache-dir", "/tmp/x"]),
        ("ingest", vec!["--json", "--jobs", "2", "--from", "2024-01-01-0", "--to", "2024-01-31-23"]),
        ("maintain", vec!["--json", "--vacuum-retention", "7d"]),
    ] {
        let help = swelake(&[sub, "--help"], &[], &[]);
        for f in flags.iter().filter(|f| f.starts_with("--")) {
            assert!(String::from_utf8_lossy(&help.stdout).contains(*f), "swelake {sub} has no {f}");
        }
    }
    let python = std::env::var("SWELAKE_AIRFLOW_PYTHON").unwrap_or_else(|_| "python3".into());
    let has_airflow = Command::new(&python).args(["-c", "import airflow"]).stderr(Stdio::null()).status();
    if !has_airflow.is_ok_and(|s| s.success()) {
        eprintln!("SKIPPED: Airflow is not installed for {python} (.ci/run installs it in a venv)");
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let script = format!(
        "from airflow.models import DagBag\n\
         b = DagBag(dag_folder={:?}, include_examples=False)\n\
         assert not b.import_errors, b.import_errors\n\
         print(sorted((d, len(b.dags[d].tasks)) for d in b.dag_ids))\n",
        examples.join("airflow").display().to_string()
    );
    let o = Command::new(&python).args(["-c", &script]).env("AIRFLOW_HOME", home.path()).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert_eq!(out.trim().lines().last(), Some("[('swelake_hourly', 3), ('swelake_maintenance', 1)]"), "{out}");
}

/// The data files of table `name`, by path.
async fn table_files(lake: &Lake, name: &str) -> std::collections::BTreeSet<String> {
    let t = lake.open_table(name).await.unwrap();
    t.snapshot().unwrap().log_data().iter().map(|f| f.path().to_string()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn upserts_rewrite_only_the_files_holding_replaced_keys() {
    use arrow::array::{Int64Array, RecordBatch, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
    let schema = Arc::new(Schema::new(vec![
        Field::new("repo_name", DataType::Utf8, false),
        Field::new("pr_number", DataType::Int64, false),
        Field::new("updated", DataType::Int64, true),
        Field::new("title", DataType::Utf8, true),
    ]));
    let batch = |rows: &[(&str, i64, i64, &str)]| {
        RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.2))),
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.3))),
            ],
        )
        .unwrap()
    };
    let keys = vec!["repo_name".to_string(), "pr_number".to_string()];
    let upsert = |rows: Vec<(&'static str, i64, i64, &'static str)>, day: &'static str| {
        let (lake, schema, keys, b) = (&lake, &schema, &keys, batch(&rows));
        async move { lake.upsert_rows("prs", schema, &[b], keys, Some("updated"), day).await.unwrap() }
    };
    upsert(vec![("a", 1, 10, "a1"), ("a", 2, 10, "a2")], "day1").await;
    upsert(vec![("b", 1, 10, "b1"), ("b", 2, 10, "b2")], "day2").await;
    let before = table_files(&lake, "prs").await;
    assert_eq!(before.len(), 2, "{before:?}");

    // a#1 newer: replaces the stored row; b#2 older: the stored row stays; c#1 is new.
    let v = upsert(vec![("a", 1, 20, "a1 edited"), ("b", 2, 5, "b2 stale"), ("c", 1, 20, "c1")], "day3").await;
    assert_eq!(v, Some(3));
    let rows: Vec<(String, i64, String)> = swelake::query::rows(
        &lake.session().await.unwrap(),
        "SELECT repo_name, pr_number, title FROM prs ORDER BY repo_name, pr_number",
    )
    .await
    .unwrap();
    let want = [("a", 1, "a1 edited"), ("a", 2, "a2"), ("b", 1, "b1"), ("b", 2, "b2"), ("c", 1, "c1")];
    assert_eq!(rows, want.iter().map(|(r, n, t)| (r.to_string(), *n, t.to_string())).collect::<Vec<_>>());
    // Day 2's file (no replaced key) is untouched; day 1's is rewritten, keeping its key.
    let after = table_files(&lake, "prs").await;
    let day2: Vec<&String> = before.iter().filter(|p| p.starts_with("day2.")).collect();
    assert!(after.contains(day2[0]), "{before:?} -> {after:?}");
    assert!(!before.iter().any(|p| p.starts_with("day1.") && after.contains(p)), "{before:?} -> {after:?}");
    assert_eq!(after.iter().filter(|p| p.starts_with("day1.")).count(), 1, "{after:?}");
    assert_eq!(after.iter().filter(|p| p.starts_with("day3.")).count(), 1, "{after:?}");

    // The same rows again change nothing but their own files; a key twice is an error.
    upsert(vec![("a", 1, 20, "a1 edited"), ("c", 1, 20, "c1")], "day3").await;
    assert_eq!(count(&lake, "SELECT count(*) FROM prs").await, 5);
    let twice = lake
        .upsert_rows("prs", &schema, &[batch(&[("a", 1, 30, "x"), ("a", 1, 31, "y")])], &keys, None, "day4")
        .await
        .unwrap_err();
    assert!(format!("{twice:#}").contains("twice"), "{twice:#}");

    // A day's worth of new rows, as a query gives them (titles as string views, in several
    // batches), is written by one thread per core into a file each, every row once.
    let view_schema = Arc::new(Schema::new(vec![
        Field::new("repo_name", DataType::Utf8, false),
        Field::new("pr_number", DataType::Int64, false),
        Field::new("updated", DataType::Int64, true),
        Field::new("title", DataType::Utf8View, true),
    ]));
    let big: Vec<RecordBatch> = (0..3i64)
        .map(|b| {
            let n: Vec<i64> = (b * 25_000..(b + 1) * 25_000).collect();
            RecordBatch::try_new(
                view_schema.clone(),
                vec![
                    Arc::new(StringArray::from_iter_values(n.iter().map(|_| "big"))),
                    Arc::new(Int64Array::from(n.clone())),
                    Arc::new(Int64Array::from_iter_values(n.iter().map(|_| 1))),
                    Arc::new(arrow::array::StringViewArray::from_iter_values(
                        n.iter().map(|i| format!("title of a pull request, number {i}")),
                    )),
                ],
            )
            .unwrap()
        })
        .collect();
    lake.upsert_rows("prs", &schema, &big, &keys, None, "day5").await.unwrap();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let day5 = table_files(&lake, "prs").await.into_iter().filter(|p| p.starts_with("day5.")).count();
    assert_eq!(day5, cores.min(2), "75,000 rows at >= 32,768 per file, one file per core");
    assert_eq!(count(&lake, "SELECT count(*) FROM prs").await, 75_005);
    let t: Vec<(i64, String)> = swelake::query::rows(
        &lake.session().await.unwrap(),
        "SELECT count(DISTINCT pr_number), max(title) FROM prs WHERE repo_name = 'big'",
    )
    .await
    .unwrap();
    assert_eq!(t, vec![(75_000, "title of a pull request, number 9999".to_string())]);
}
