//! The recipes of `docs/design.md`, walked: a stage added in a test is its module and one line
//! (the registry's `with_stage`), and the scheduler does the rest for it; every built-in stage
//! has a schema for each output, a guide naming them, and a line in `status`; every console
//! page has its route and its script.

use std::path::{Path, PathBuf};

use anyhow::Result;
use swelake::jobs::{run, JobSummary, Registry, RunOptions};
use swelake::lake::Lake;
use swelake::stage::{Stage, StageCtx, Unit};

use crate::common::{gharchive, quiet_ingest};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A stage as a newcomer adds one: it counts the lake's events by type.
struct EventTypes;

#[async_trait::async_trait(?Send)]
impl Stage for EventTypes {
    fn name(&self) -> &'static str {
        "event_types"
    }

    fn description(&self) -> &'static str {
        "How many events of each type the lake holds."
    }

    fn inputs(&self) -> &'static [&'static str] {
        &["events"]
    }

    fn outputs(&self) -> &'static [&'static str] {
        &[]
    }

    fn unit(&self) -> Unit {
        Unit::Whole
    }

    fn depends_on(&self) -> &'static [&'static str] {
        &["ingest"]
    }

    async fn run(&self, lake: &Lake, _ctx: &StageCtx<'_>) -> Result<JobSummary> {
        let ctx = lake.session().await?;
        let counts: Vec<(String, i64)> =
            swelake::query::rows(&ctx, "SELECT type, count(*) FROM events GROUP BY type ORDER BY type").await?;
        let mut s = JobSummary::named(self.name());
        s.rows_out = counts.iter().map(|(_, n)| *n as u64).sum();
        s.notes = counts.into_iter().collect();
        Ok(s)
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stage_added_in_a_test_is_scheduled_watermarked_and_listed() {
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().join("lake").to_str().unwrap()).unwrap();
    let hours = dir.path().join("hours");
    std::fs::create_dir_all(&hours).unwrap();
    std::fs::copy(gharchive("2015-01-01-15.json.gz"), hours.join("2015-01-01-15.json.gz")).unwrap();
    let registry = Registry::load(None, None).unwrap().with_stage(&EventTypes).unwrap();
    let with_source = RunOptions { ingest: Some(quiet_ingest(&hours)), ..Default::default() };

    // Its dependency (ingest) runs first; the stage sees what ingest wrote.
    let done = run(&lake, &registry, &["event_types".to_string()], &with_source).await.unwrap();
    assert_eq!(done.iter().map(|s| s.job.as_str()).collect::<Vec<_>>(), ["ingest", "event_types"]);
    let events = crate::common::count(&lake, "SELECT count(*) FROM events").await;
    assert_eq!(done[1].rows_out, events as u64);
    let pushes = crate::common::count(&lake, "SELECT count(*) FROM events WHERE type = 'PushEvent'").await;
    assert_eq!(done[1].notes["PushEvent"], pushes);

    // A whole-input stage: nothing new, nothing done; `status` says so.
    let again = run(&lake, &registry, &["event_types".to_string()], &RunOptions::default()).await.unwrap();
    assert!(again[1].partitions.is_empty() && again[1].skipped_reason.is_none(), "{:?}", again[1]);
    let st = swelake::jobs::status::status(&lake, &registry, &RunOptions::default()).await.unwrap();
    let mine = st.jobs.iter().find(|j| j.job == "event_types").expect("status lists the new stage");
    assert_eq!(mine.partitions_pending, Some(vec![]));
    assert!(mine.last_run.is_some());

    // A new hour: due again.
    std::fs::copy(gharchive("2025-01-01-15.json.gz"), hours.join("2025-01-01-15.json.gz")).unwrap();
    let more = run(&lake, &registry, &["event_types".to_string()], &with_source).await.unwrap();
    assert_eq!(more[1].partitions, ["__all__"]);
    let events = crate::common::count(&lake, "SELECT count(*) FROM events").await;
    assert_eq!(more[1].rows_out, events as u64);

    // Without its dependency's source, named: ingest is the error; in --all, skipped.
    let named = run(&lake, &registry, &["ingest".to_string()], &RunOptions::default()).await;
    assert!(format!("{:#}", named.unwrap_err()).contains("needs --source"));
}

/// The guide of each stage, from the stage table of `docs/design.md`.
fn guides() -> Vec<(String, String)> {
    let design = std::fs::read_to_string(root().join("docs/design.md")).unwrap();
    let table = design.split("## The stages").nth(1).unwrap().split("\n\n").nth(1).unwrap().to_string();
    table
        .lines()
        .skip(2)
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let name = cells.get(1)?.trim_matches('`').to_string();
            let link = cells.get(2)?.split("](").nth(1)?.trim_end_matches(')').to_string();
            Some((name, link))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_stage_has_schemas_a_guide_a_status_line_and_a_known_config_section() {
    let guides = guides();
    let registry = Registry::load(None, None).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
    let st = swelake::jobs::status::status(&lake, &registry, &RunOptions::default()).await.unwrap();
    for stage in swelake::jobs::stages::STAGES {
        let name = stage.name();
        let (_, guide) = guides.iter().find(|(n, _)| n == name).unwrap_or_else(|| {
            panic!("docs/design.md's stage table has no row for `{name}`");
        });
        let text = std::fs::read_to_string(root().join("docs").join(guide)).unwrap();
        for out in stage.outputs() {
            swelake::schema::arrow(out).unwrap_or_else(|e| panic!("{name} writes `{out}`: {e:#}"));
            assert!(text.contains(&format!("`{out}`")), "docs/{guide} does not name `{out}`, an output of {name}");
        }
        for input in stage.inputs().iter().filter(|i| **i != "gharchive") {
            swelake::schema::arrow(input).unwrap_or_else(|e| panic!("{name} reads `{input}`: {e:#}"));
        }
        if let Some(section) = stage.config_section() {
            assert!(swelake::jobs::CurationConfig::SECTIONS.contains(&section), "{name}: section {section}");
        }
        assert!(st.jobs.iter().any(|j| j.job == name), "`swelake status` has no line for {name}");
        assert_eq!(registry.jobs[name].step.name(), name);
    }
    assert_eq!(guides.len(), swelake::jobs::stages::STAGES.len(), "the stage table lists a stage that is not one");
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(root().join(path)).unwrap()
}

#[test]
fn every_console_page_has_its_route_and_script() {
    let index = read(Path::new("src/console/assets/index.html"));
    let api = read(Path::new("src/console/api.rs"));
    let app = read(Path::new("src/console/assets/app.js"));
    let pages: Vec<&str> = index.split("data-page=\"").skip(1).filter_map(|s| s.split('"').next()).collect();
    assert!(pages.len() >= 4, "{pages:?}");
    for page in pages {
        assert!(api.contains(&format!(".route(\"/{page}\", get(page))")), "no route for /{page} in api.rs");
        let js = format!("page{}{}()", page[..1].to_uppercase(), &page[1..]);
        assert!(app.contains(&format!("async function {js}")), "no {js} in app.js");
        assert!(app.contains(&format!("return {js};")), "route() does not reach {js}");
    }
}

/// Runs the CLI; answers (success, stdout + stderr).
fn cli(args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_swelake"))
        .args(args)
        .env_remove("GITHUB_TOKEN")
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// Every registered job and stage, each by name and then all together, on lakes that give it
/// nothing to write: an empty lake (no hour, no repository), a lake of one repository read from
/// git whose PRs name no issue, and a lake filled only through GitHub's API whose PRs name no
/// issue. Zero rows written is a commit or nothing, never an error.
#[tokio::test(flavor = "multi_thread")]
async fn every_job_runs_on_a_lake_that_gives_it_nothing() {
    use crate::git_prs::{commit, git, merge, write, ALICE, BOB};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let hours = d.join("hours");
    std::fs::create_dir_all(&hours).unwrap();
    // A repository whose one merged PR names no issue.
    let work = d.join("work");
    std::fs::create_dir_all(&work).unwrap();
    git(&work, &["init", "-q"]);
    write(&work, "README.md", "# quiet\n");
    write(&work, "quiet.py", "def f():\n    return 1\n");
    commit(&work, BOB, 1_700_000_000, "Initial import");
    git(&work, &["checkout", "-q", "-b", "tidy"]);
    write(&work, "quiet.py", "def f():\n    return 2\n");
    commit(&work, ALICE, 1_700_000_100, "Return two");
    git(&work, &["checkout", "-q", "main"]);
    merge(&work, "tidy", 1_700_000_200, "Merge pull request #1 from alice/tidy\n\nReturn two");
    let src = d.join("src/acme/quiet.git");
    git(d, &["clone", "-q", "--mirror", work.to_str().unwrap(), src.to_str().unwrap()]);
    let (none, quiet) = (d.join("none.txt"), d.join("quiet.txt"));
    std::fs::write(&none, "").unwrap();
    std::fs::write(&quiet, "acme/quiet\n").unwrap();
    let url = format!("{}/{{repo}}.git", d.join("src").display());
    let cache = d.join("cache");
    let config = d.join("curation.toml");
    std::fs::write(&config, "[relevance]\nranker = \"bm25\"\n").unwrap();
    let s = |p: &Path| p.to_str().unwrap().to_string();

    // The API: the five repositories of a real hour, their PRs' texts naming no issue.
    let mut data = crate::github_mock::excerpt_objects();
    for repo in data.as_object_mut().unwrap().values_mut() {
        for pr in repo["pulls"].as_array_mut().unwrap() {
            pr["body"] = serde_json::Value::Null;
            let title = pr["title"].as_str().unwrap_or("").replace('#', "");
            pr["title"] = title.into();
        }
    }
    let names: Vec<String> = data.as_object().unwrap().keys().cloned().collect();
    let api_repos = d.join("api-repos.txt");
    std::fs::write(&api_repos, names.join("\n")).unwrap();
    let (base, _mock) = crate::github_mock::serve_api(data, Vec::new(), 100).await;
    let api_lake = s(&d.join("api-lake"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_swelake"))
        .args(["ingest", "--github", "--repos-file", &s(&api_repos), "--lake", &api_lake, "--api-url", &base])
        .env("GITHUB_TOKEN", crate::github_mock::TOKEN)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let registry = Registry::load(None, None).unwrap();
    let jobs: Vec<String> = registry.jobs.keys().cloned().collect();
    assert!(jobs.len() >= 10, "{jobs:?}");
    // An empty repos file is refused, as bad input should be.
    let (ok, out) = cli(&["run", "--all", "--lake", &s(&d.join("x")), "--repo-url", &url, "--repos-file", &s(&none)]);
    assert!(!ok && out.contains("names no repository"), "{out}");
    for (lake, repos, from_git) in [
        (s(&d.join("empty-lake")), None, false),
        (s(&d.join("git-lake")), Some(s(&quiet)), true),
        (api_lake.clone(), None, false),
    ] {
        let mut common: Vec<String> = [
            "--lake",
            &lake,
            "--source",
            &s(&hours),
            "--repo-url",
            &url,
            "--cache-dir",
            &s(&cache),
            "--config",
            &s(&config),
        ]
        .iter()
        .map(|x| x.to_string())
        .collect();
        if let Some(r) = &repos {
            common.extend(["--repos-file".to_string(), r.clone()]);
        }
        let common: Vec<&str> = common.iter().map(String::as_str).collect();
        for job in &jobs {
            let (ok, out) = cli(&[&["run", job.as_str(), "--verify"][..], &common].concat());
            assert!(ok, "swelake run {job} on {lake}:\n{out}");
        }
        let (ok, out) = cli(&[&["run", "--all", "--verify"][..], &common].concat());
        assert!(ok, "swelake run --all on {lake}:\n{out}");
        let lk = Lake::open(&lake).unwrap();
        if from_git || lake == api_lake {
            // PRs, and none of them names an issue: the links table exists and is empty.
            assert!(crate::common::count(&lk, "SELECT count(*) FROM pull_requests").await > 0, "{lake}");
            assert_eq!(crate::common::count(&lk, "SELECT count(*) FROM pr_issue_links").await, 0, "{lake}");
        }
        let (ok, out) = cli(&["status", "--lake", &lake]);
        assert!(ok, "{out}");
    }
}
