//! Past one machine: the SQL jobs on a real Ballista cluster on loopback (a scheduler and two
//! executors, started as `swelake ballista …` child processes), and the git stages split over
//! shard workers.

use std::collections::BTreeMap;
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use swelake::distributed::Engine;
use swelake::jobs::{run, CurationConfig, GitOptions, Registry, RunOptions};
use swelake::lake::Lake;

use crate::common::quiet_ingest;

/// Child processes killed (and reaped) when the test ends, pass or fail.
struct Cluster {
    children: Vec<(String, Child)>,
    pub scheduler: String,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (_, c) in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A free port whose successor is free too (an executor's gRPC port is its data port + 1).
fn free_port_pair() -> u16 {
    loop {
        let a = TcpListener::bind("127.0.0.1:0").unwrap();
        let p = a.local_addr().unwrap().port();
        if p < u16::MAX && TcpListener::bind(("127.0.0.1", p + 1)).is_ok() {
            return p;
        }
    }
}

fn wait_listening(port: u16, what: &str, children: &mut [(String, Child)]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        for (name, c) in children.iter_mut() {
            if let Ok(Some(status)) = c.try_wait() {
                panic!("{name} exited with {status} before {what} listened");
            }
        }
        assert!(Instant::now() < deadline, "{what} did not listen on {port} within 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `swelake ballista scheduler` and two `swelake ballista executor`s of one task slot each.
fn start_cluster(work: &Path, env: &[(&str, &str)]) -> Cluster {
    let exe = env!("CARGO_BIN_EXE_swelake");
    let sched = free_port_pair();
    let mut children = Vec::new();
    let log = |name: &str| std::fs::File::create(work.join(format!("{name}.log"))).unwrap();
    let child = Command::new(exe)
        .args(["-q", "ballista", "scheduler", "--bind", &format!("127.0.0.1:{sched}")])
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(log("scheduler"))
        .spawn()
        .expect("starting the scheduler");
    children.push(("scheduler".to_string(), child));
    wait_listening(sched, "the scheduler", &mut children);
    for i in 0..2 {
        let port = free_port_pair();
        let dir = work.join(format!("executor-{i}"));
        let child = Command::new(exe)
            .args(["-q", "ballista", "executor", "--scheduler", &format!("127.0.0.1:{sched}")])
            .args(["--bind", &format!("127.0.0.1:{port}"), "--concurrent-tasks", "1"])
            .arg("--work-dir")
            .arg(&dir)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log(&format!("executor-{i}")))
            .spawn()
            .expect("starting an executor");
        children.push((format!("executor {i}"), child));
        wait_listening(port, &format!("executor {i}"), &mut children);
    }
    Cluster { children, scheduler: format!("df://127.0.0.1:{sched}") }
}

/// Every row of `table` as a JSON object string, sorted: the table's row multiset.
async fn rows(lake: &Lake, table: &str) -> Vec<String> {
    let batches = swelake::sql::query(lake, &format!("SELECT * FROM {table}")).await.unwrap();
    let mut out = Vec::new();
    swelake::sql::write(&batches, swelake::sql::Format::Jsonl, &mut out).unwrap();
    let mut lines: Vec<String> = String::from_utf8(out).unwrap().lines().map(str::to_string).collect();
    lines.sort();
    lines
}

fn sample_git(dir: &Path) -> GitOptions {
    let repos = dir.join("repos");
    swelake::samples::create_repos(&repos).unwrap();
    GitOptions::new(swelake::git::Mirrors::new(format!("{}/{{repo}}.git", repos.display()), dir.join("mirrors")))
}

const SQL_OUTPUTS: [&str; 5] = ["pr_timeline", "pull_requests", "issues", "pr_issue_links", "pr_quality"];

#[tokio::test(flavor = "multi_thread")]
async fn sql_jobs_on_a_ballista_cluster_equal_the_local_engine() {
    let dir = tempfile::tempdir().unwrap();
    // The executors write the jobs' output files themselves: into a local lake's directory,
    // and (part 3) into a bucket of an S3-compatible server, reached with the AWS_* settings.
    let (_moto, endpoint) = crate::common::s3_server();
    crate::common::create_bucket(&endpoint, "ballista");
    let s3_env = [
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_ACCESS_KEY_ID", "swelake-test"),
        ("AWS_SECRET_ACCESS_KEY", "swelake-test"),
        ("AWS_REGION", "us-east-1"),
    ];
    let cluster = start_cluster(dir.path(), &s3_env);
    let registry = Registry::load(None, None).unwrap();
    let all: Vec<String> = registry.jobs.keys().cloned().collect();

    // 1. The demo, with a non-default config: `jonas` counts as a bot, so the filter functions
    //    on the executors must be built from the job's config, not their defaults.
    let mut config = CurationConfig::load(None).unwrap();
    config.filters.bot_login_patterns.push("^jonas$".into());
    let samples = Path::new(env!("CARGO_MANIFEST_DIR")).join("data-samples/gharchive");
    let git = sample_git(dir.path());
    let mut lakes = Vec::new();
    for (name, engine) in
        [("local", Engine::Local), ("ballista", Engine::Ballista { scheduler: cluster.scheduler.clone() })]
    {
        let lake = Lake::open(dir.path().join(format!("demo-{name}")).to_str().unwrap()).unwrap();
        swelake::ingest::run(&lake, &quiet_ingest(&samples)).await.unwrap();
        let opts = RunOptions {
            all: true,
            git: Some(git.clone()),
            curation: config.clone(),
            engine: engine.clone(),
            ..Default::default()
        };
        let s = run(&lake, &registry, &all, &opts).await.unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let filters = s.iter().find(|j| j.job == "filters").unwrap();
        assert!(!filters.partitions.is_empty(), "{name}: the filters job ran");
        lakes.push(lake);
    }
    for t in SQL_OUTPUTS {
        let (a, b) = (rows(&lakes[0], t).await, rows(&lakes[1], t).await);
        assert!(!a.is_empty(), "{t} has rows");
        assert_eq!(a, b, "{t}: Ballista's rows equal the local engine's");
    }
    // Every file the cluster's jobs committed is in the table's directory, with the size the
    // Delta log records (the executors wrote them; the client only committed).
    for t in ["pr_timeline", "pr_quality"] {
        let table = lakes[1].open_table(t).await.unwrap();
        for f in table.snapshot().unwrap().log_data().iter() {
            let path = lakes[1].local_root().unwrap().join(t).join(f.path().as_ref());
            assert_eq!(std::fs::metadata(&path).unwrap().len() as i64, f.size(), "{}", path.display());
        }
    }
    let bots = crate::common::count(
        &lakes[1],
        "SELECT count(*) FROM pr_quality q JOIN pull_requests p ON p.repo_name = q.repo_name AND p.number = q.pr_number \
         WHERE p.author_login = 'jonas' AND array_has(q.reasons, 'bot_author')",
    )
    .await;
    assert!(bots > 0, "the executors filtered with the job's config (jonas is a bot there)");
    // A rerun with nothing new does nothing on the cluster either.
    let opts = RunOptions {
        all: true,
        git: Some(git.clone()),
        curation: config.clone(),
        engine: Engine::Ballista { scheduler: cluster.scheduler.clone() },
        ..Default::default()
    };
    let again = run(&lakes[1], &registry, &all, &opts).await.unwrap();
    for j in again.iter().filter(|j| SQL_OUTPUTS.iter().any(|t| registry.jobs[&j.job].outputs.contains(&t.to_string())))
    {
        assert!(j.partitions.is_empty(), "{}: nothing to redo, got {:?}", j.job, j.partitions);
    }

    // 2. A generated multi-hour lake from the real excerpts (PRs spanning hours, two eras).
    let hours = dir.path().join("hours");
    let o = swelake::synthetic::SynthOptions {
        sources: vec![
            crate::common::gharchive("2015-01-01-15.json.gz"),
            crate::common::gharchive("2025-01-01-15.json.gz"),
        ],
        first_hour: "2025-03-01-22".into(),
        hours: 4,
        copies: 2,
        hours_before: 0,
    };
    let files = swelake::synthetic::synthesize_hours(&o, &hours).unwrap();
    assert_eq!(files.len(), 4);
    let sql_jobs: Vec<String> = ["pr_timeline", "pull_requests", "issues", "pr_issue_links"].map(String::from).to_vec();
    let mut lakes = Vec::new();
    for (name, engine) in
        [("local", Engine::Local), ("ballista", Engine::Ballista { scheduler: cluster.scheduler.clone() })]
    {
        let lake = Lake::open(dir.path().join(format!("gen-{name}")).to_str().unwrap()).unwrap();
        swelake::ingest::run(&lake, &quiet_ingest(&hours)).await.unwrap();
        let opts = RunOptions { engine, ..Default::default() };
        run(&lake, &registry, &sql_jobs, &opts).await.unwrap_or_else(|e| panic!("{name}: {e:#}"));
        lakes.push(lake);
    }
    let days = crate::common::count(&lakes[0], "SELECT count(DISTINCT event_date) FROM pr_timeline").await;
    assert_eq!(days, 2, "the hours span two dates (two partitions)");
    for t in ["pr_timeline", "pull_requests", "issues", "pr_issue_links"] {
        let (a, b) = (rows(&lakes[0], t).await, rows(&lakes[1], t).await);
        assert!(!a.is_empty(), "{t} has rows");
        assert_eq!(a.len(), b.len(), "{t}: row counts");
        assert_eq!(a, b, "{t}: Ballista's rows equal the local engine's");
    }

    // 3. The demo in a bucket: the executors upload what they write, the client commits it.
    let opts: Vec<(String, String)> = s3_env.iter().map(|(k, v)| (k.to_ascii_lowercase(), v.to_string())).collect();
    let s3 = Lake::open_with("s3://ballista/lake", &opts).unwrap();
    swelake::ingest::run(&s3, &quiet_ingest(&samples)).await.unwrap();
    let ballista = RunOptions {
        all: true,
        git: Some(git.clone()),
        curation: config.clone(),
        engine: Engine::Ballista { scheduler: cluster.scheduler.clone() },
        ..Default::default()
    };
    run(&s3, &registry, &all, &ballista).await.unwrap_or_else(|e| panic!("S3 lake on Ballista: {e:#}"));
    let demo_local = Lake::open(dir.path().join("demo-local").to_str().unwrap()).unwrap();
    for t in SQL_OUTPUTS {
        let (a, b) = (rows(&demo_local, t).await, rows(&s3, t).await);
        assert_eq!(a, b, "{t}: Ballista on S3 equals the local engine on a directory");
    }
    drop(cluster);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_scheduler_is_a_clear_error_not_a_local_run() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().join("lake").to_str().unwrap()).unwrap();
    let samples = Path::new(env!("CARGO_MANIFEST_DIR")).join("data-samples/gharchive");
    swelake::ingest::run(&lake, &quiet_ingest(&samples)).await.unwrap();
    let registry = Registry::load(None, None).unwrap();
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let opts =
        RunOptions { engine: Engine::Ballista { scheduler: format!("df://127.0.0.1:{port}") }, ..Default::default() };
    let err = run(&lake, &registry, &["pr_timeline".to_string()], &opts).await.unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains(&format!("127.0.0.1:{port}")), "{msg}");
    assert!(!lake.has_table("pr_timeline").await.unwrap(), "nothing was computed elsewhere");
}

/// `pr_files`, `file_blobs` and `pr_snapshots` of a lake as row multisets, and blobs stored more
/// than once.
async fn snapshot_tables(lake: &Lake) -> (BTreeMap<&'static str, Vec<String>>, i64) {
    let mut out = BTreeMap::new();
    for t in ["pr_files", "file_blobs", "pr_commits"] {
        out.insert(t, rows(lake, t).await);
    }
    let ctx = lake.session().await.unwrap();
    let snaps: Vec<(String, i64, String)> =
        swelake::query::rows(&ctx, "SELECT repo_name, pr_number, status FROM pr_snapshots").await.unwrap();
    let mut snaps: Vec<String> = snaps.into_iter().map(|(r, n, s)| format!("{r}#{n} {s}")).collect();
    snaps.sort();
    out.insert("pr_snapshots", snaps);
    let twice = crate::common::count(
        lake,
        "SELECT count(*) FROM (SELECT blob_sha FROM file_blobs GROUP BY blob_sha HAVING count(*) > 1)",
    )
    .await;
    (out, twice)
}

/// One worker, then `n` shard workers at once on a copy of the same lake: the same rows, each
/// repository done by exactly one shard, no blob stored twice.
async fn shards_equal_one_worker(dir: &Path, hours: &Path, git: GitOptions, n: u32) -> usize {
    let registry = Registry::load(None, None).unwrap();
    let one = Lake::open(dir.join("one").to_str().unwrap()).unwrap();
    swelake::ingest::run(&one, &quiet_ingest(hours)).await.unwrap();
    let opts = RunOptions { git: Some(git.clone()), ..Default::default() };
    run(&one, &registry, &["snapshots".to_string()], &opts).await.unwrap();

    let many = Lake::open(dir.join("many").to_str().unwrap()).unwrap();
    swelake::ingest::run(&many, &quiet_ingest(hours)).await.unwrap();
    // The PR tables first (one run), then the shard workers on the git stage alone, at once.
    run(&many, &registry, &["pull_requests".to_string()], &RunOptions::default()).await.unwrap();
    let workers = (0..n).map(|i| {
        let mut g = git.clone();
        g.scope.shard = Some(swelake::git::Shard { index: i, count: n });
        // Each worker its own mirror cache, as on separate machines.
        g.scope.mirrors =
            swelake::git::Mirrors::new(g.scope.mirrors.repo_url.clone(), dir.join(format!("mirrors-{i}")));
        let many = &many;
        let registry = &registry;
        async move {
            let opts = RunOptions { git: Some(g), ..Default::default() };
            run(many, registry, &["snapshots".to_string()], &opts).await.unwrap()
        }
    });
    let results = futures::future::join_all(workers).await;
    let mut done: BTreeMap<String, u32> = BTreeMap::new();
    for (i, r) in results.iter().enumerate() {
        let s = r.iter().find(|j| j.job == "snapshots").unwrap();
        for repo in &s.partitions {
            assert!(swelake::git::Shard { index: i as u32, count: n }.owns(repo), "{repo} done by shard {i}");
            *done.entry(repo.clone()).or_default() += 1;
        }
    }
    assert!(done.values().all(|&k| k == 1), "no repository done twice: {done:?}");
    let (a, twice_a) = snapshot_tables(&one).await;
    let (b, twice_b) = snapshot_tables(&many).await;
    assert_eq!(twice_a, 0);
    assert_eq!(twice_b, 0, "no blob stored twice by the shard workers");
    for (t, rows) in &a {
        assert!(!rows.is_empty(), "{t} has rows");
        assert_eq!(rows, &b[t], "{t}: {n} shard workers equal one worker");
    }
    done.len()
}

#[tokio::test(flavor = "multi_thread")]
async fn shard_workers_cover_the_demo_repositories_once() {
    let dir = tempfile::tempdir().unwrap();
    let git = sample_git(dir.path());
    let samples = Path::new(env!("CARGO_MANIFEST_DIR")).join("data-samples/gharchive");
    let repos = shards_equal_one_worker(dir.path(), &samples, git, 2).await;
    assert!(repos >= 2, "the demo has several repositories with merged PRs");
}

#[tokio::test(flavor = "multi_thread")]
async fn shard_workers_over_two_real_histories() {
    let Some(history) = crate::common::history() else { return };
    let dir = tempfile::tempdir().unwrap();
    // Both histories' events as one hour file (ingest keys rows by hour file).
    let hour = dir.path().join("2011-04-25-18.json");
    let mut all = String::new();
    for name in ["pallets/jinja", "pallets/werkzeug"] {
        let stem = name.replace('/', "-");
        crate::common::mirror_of_bundle(&history, name, dir.path());
        let part = dir.path().join(format!("{stem}.json"));
        crate::history::concatenated(&history.join(&stem).join("events"), &part);
        all.push_str(&std::fs::read_to_string(&part).unwrap());
    }
    std::fs::write(&hour, all).unwrap();
    let git = GitOptions::new(swelake::git::Mirrors::new(
        format!("{}/{{repo}}.git", dir.path().join("src").display()),
        dir.path().join("cache"),
    ));
    // Three shards: jinja and werkzeug hash to different ones of three (and to the same one
    // of two), so one worker gets nothing, as real shards sometimes do.
    let repos = shards_equal_one_worker(dir.path(), &hour, git, 3).await;
    assert_eq!(repos, 2);
}
