//! The verify stage and `swelake evaluate` on a Python repository made here (four PRs: a fix
//! with its test, a change without tests, a refactor whose new test passed before, a feature
//! with a flaky test beside its own), run through the command line from `--repos-file` alone:
//! real git, real uv against PyPI as of the PRs' day, real bubblewrap, real pytest. Then a
//! model's patch that tries to leave the sandbox. A JavaScript repository (mocha, a committed
//! lockfile) verifies the same way. The real histories of `../shared/history`
//! are verified in `history.rs`.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use swelake::lake::Lake;

use crate::git_prs::{commit, git, merge, write, ALICE, BOB};

/// Whether the sandbox and the registry are reachable here: with SWELAKE_REQUIRE_PYTHON=1 (CI)
/// their absence fails the test instead of skipping it.
pub(crate) fn can_verify() -> bool {
    let bwrap = Command::new("bwrap")
        .args(["--ro-bind", "/", "/", "--unshare-all", "--", "/bin/true"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    let required = std::env::var("SWELAKE_REQUIRE_PYTHON").is_ok_and(|v| v == "1");
    if !bwrap {
        assert!(!required, "SWELAKE_REQUIRE_PYTHON=1 but bubblewrap (bwrap) does not run here");
        eprintln!("skipping: bubblewrap (bwrap) is not installed or cannot create namespaces here");
        return false;
    }
    true
}

/// Where uv, the locks and the environments stay between test runs (the build's tmp dir).
pub(crate) fn verify_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("verify-cache")
}

const PYPROJECT: &str =
    "[project]\nname = \"calc\"\nversion = \"1.2.0\"\nrequires-python = \">=3.8\"\ndependencies = [\"packaging==21.3\"]\n";
const CALC: &str = "def mean(xs):\n    return sum(xs) / len(xs)\n\n\ndef double(x):\n    return x * 2\n";
const TESTS: &str =
    "from calc import double, mean\n\n\ndef test_mean():\n    assert mean([1, 2, 3]) == 2\n\n\ndef test_double():\n    assert double(2) == 4\n";
const COUNTER: &str = "import os\n\n\ndef test_counter():\n    path = os.path.join(os.path.dirname(__file__), \"counter.txt\")\n    n = int(open(path).read()) if os.path.exists(path) else 0\n    open(path, \"w\").write(str(n + 1))\n    assert n % 2 == 0\n";

/// acme/calc with four merged PRs, each a merge commit of GitHub's form.
pub(crate) fn make_repo(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    git(dir, &["init", "-q"]);
    write(dir, "pyproject.toml", PYPROJECT);
    write(dir, "src/calc/__init__.py", CALC);
    write(dir, "tests/test_calc.py", TESTS);
    write(dir, "README.md", "# calc\n");
    // 2024-03-01: what PyPI held then is what the environments get.
    let t0 = 1_709_251_200;
    commit(dir, BOB, t0, "Initial import");
    let pr = |n: i64, branch: &str, who, edits: &dyn Fn(), title: &str| {
        git(dir, &["checkout", "-q", "-b", branch]);
        edits();
        commit(dir, who, t0 + n * 1000, title);
        git(dir, &["checkout", "-q", "main"]);
        let msg = format!(
            "Merge pull request #{n} from someone/{branch}\n\n{title}\n\nWhat the issue reported is handled now, with care.\nFixes #{}",
            n + 10
        );
        merge(dir, branch, t0 + n * 1000 + 500, &msg);
    };
    let read = |p: &str| std::fs::read_to_string(dir.join(p)).unwrap();
    pr(
        1,
        "empty-mean",
        ALICE,
        &|| {
            write(
                dir,
                "src/calc/__init__.py",
                &read("src/calc/__init__.py").replace(
                    "    return sum(xs) / len(xs)",
                    "    if not xs:\n        return 0.0\n    return sum(xs) / len(xs)",
                ),
            );
            write(
                dir,
                "tests/test_calc.py",
                &format!("{}\n\ndef test_mean_empty():\n    assert mean([]) == 0.0\n", read("tests/test_calc.py")),
            );
        },
        "mean() of an empty list raises ZeroDivisionError",
    );
    pr(
        2,
        "docs",
        BOB,
        &|| {
            write(dir, "README.md", "# calc\n\nSmall numeric helpers.\n");
            write(
                dir,
                "src/calc/__init__.py",
                &format!("\"\"\"Small numeric helpers.\"\"\"\n\n{}", read("src/calc/__init__.py")),
            );
        },
        "Document what the package is for, in its docstring",
    );
    pr(
        3,
        "double-negative",
        ALICE,
        &|| {
            write(dir, "src/calc/__init__.py", &read("src/calc/__init__.py").replace("return x * 2", "return x + x"));
            write(
                dir,
                "tests/test_calc.py",
                &format!(
                    "{}\n\ndef test_double_negative():\n    assert double(-3) == -6\n",
                    read("tests/test_calc.py")
                ),
            );
        },
        "double() written as an addition, with a test of negatives",
    );
    pr(
        4,
        "triple",
        BOB,
        &|| {
            write(
                dir,
                "src/calc/__init__.py",
                &format!("{}\n\ndef triple(x):\n    return x * 3\n", read("src/calc/__init__.py")),
            );
            write(
                dir,
                "tests/test_calc.py",
                &format!(
                    "{}\n\ndef test_triple():\n    from calc import triple\n\n    assert triple(2) == 6\n",
                    read("tests/test_calc.py")
                ),
            );
            write(dir, "tests/test_counter.py", COUNTER);
        },
        "triple() is missing from the helpers people asked for",
    );
}

#[derive(Deserialize, Debug)]
struct Verdict {
    pr_number: i64,
    status: String,
    reason: String,
    fail_to_pass: Vec<String>,
    pass_to_pass: Vec<String>,
    flaky: Vec<String>,
    env_key: String,
    package_version: String,
}

/// The lake's verdicts, by PR number.
async fn verdicts(ctx: &datafusion::prelude::SessionContext) -> Vec<Verdict> {
    swelake::query::rows(
        ctx,
        "SELECT pr_number, status, reason, fail_to_pass, pass_to_pass, flaky, env_key, package_version \
         FROM pr_verification ORDER BY pr_number",
    )
    .await
    .unwrap()
}

/// Runs the CLI; panics with its output when it fails.
pub(crate) fn swelake(args: &[&str], env: &[(&str, &str)]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_swelake")).args(args).envs(env.iter().copied()).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "swelake {args:?}:\n{text}");
    text
}

/// The one split of a one-repository lake's seed.
async fn seed_split(lake: &Lake) -> String {
    let splits: Vec<(String,)> =
        swelake::query::rows(&lake.session().await.unwrap(), "SELECT DISTINCT split FROM rl_seed").await.unwrap();
    assert_eq!(splits.len(), 1, "{splits:?}");
    splits[0].0.clone()
}

/// Whether a process with exactly this command line is alive on the host.
fn process_running(argv: &[&str]) -> bool {
    let want = argv.join("\0") + "\0";
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        let mut s = String::new();
        std::fs::File::open(e.path().join("cmdline")).and_then(|mut f| f.read_to_string(&mut s)).is_ok() && s == want
    })
}

/// A repository made by `make`, its mirror as `src/<name>.git`, a repos file naming it, and a
/// config whose environments stay in [`verify_dir`] between test runs.
pub(crate) struct Fixture {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) lake: String,
    pub(crate) list: String,
    pub(crate) url: String,
    pub(crate) cache: String,
    pub(crate) config: String,
}

impl Fixture {
    pub(crate) fn new(name: &str, make: fn(&Path), keep_trees: bool) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        make(&work);
        let src = dir.path().join("src").join(format!("{name}.git"));
        git(dir.path(), &["clone", "-q", "--mirror", work.to_str().unwrap(), src.to_str().unwrap()]);
        let list = dir.path().join("repos.txt");
        std::fs::write(&list, format!("{name}\n")).unwrap();
        let config = dir.path().join("curation.toml");
        std::fs::write(
            &config,
            format!(
                "[relevance]\nranker = \"bm25\"\n\n[verify]\nrepeat = 2\ntimeout_secs = 120\nkeep_trees = {keep_trees}\ndir = \"{}\"\n",
                verify_dir().display()
            ),
        )
        .unwrap();
        let s = |p: &Path| p.to_str().unwrap().to_string();
        Fixture {
            lake: s(&dir.path().join("lake")),
            list: s(&list),
            url: format!("{}/{{repo}}.git", dir.path().join("src").display()),
            cache: s(&dir.path().join("cache")),
            config: s(&config),
            dir,
        }
    }

    /// The flags every command of the test shares.
    pub(crate) fn common(&self) -> [&str; 10] {
        [
            "--lake",
            &self.lake,
            "--repos-file",
            &self.list,
            "--repo-url",
            &self.url,
            "--cache-dir",
            &self.cache,
            "--config",
            &self.config,
        ]
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn prs_verify_in_the_sandbox_and_evaluate_grades_predictions_there() {
    if !can_verify() {
        return;
    }
    let fx = Fixture::new("acme/calc", make_repo, true);
    let dir = &fx.dir;
    let lake_dir = dir.path().join("lake");
    let (lake_s, cache_s, config_s, url) = (fx.lake.as_str(), fx.cache.as_str(), fx.config.as_str(), fx.url.clone());
    let common = fx.common();

    // Without --verify, --all leaves the stage out and says why.
    let out = swelake(&[&["run", "--all"][..], &common].concat(), &[]);
    assert!(out.contains("verify") && out.contains("untrusted code"), "{out}");
    let lake = Lake::open(lake_s).unwrap();
    assert!(!lake.has_table("pr_verification").await.unwrap());

    // As docs/verify.md has users do it: the pipeline first, then the verify stage by name,
    // which brings the seed (and so the shards and exports) up to its verdicts.
    let out = swelake(&[&["run", "verify"][..], &common].concat(), &[]);
    assert!(out.contains("status:verified: 2"), "{out}");
    assert!(
        out.lines().any(|l| l.starts_with("seed ") && l.contains("partition")),
        "seed did not follow verify: {out}"
    );
    let ctx = lake.session().await.unwrap();
    let v: Vec<Verdict> = verdicts(&ctx).await;
    let got: Vec<(i64, &str)> = v.iter().map(|x| (x.pr_number, x.status.as_str())).collect();
    assert_eq!(got, [(1, "verified"), (2, "no_test_change"), (3, "no_fail_to_pass"), (4, "verified")], "{v:#?}");
    assert_eq!(v[0].fail_to_pass, ["tests/test_calc.py::test_mean_empty"]);
    assert_eq!(v[0].pass_to_pass, ["tests/test_calc.py::test_double", "tests/test_calc.py::test_mean"]);
    assert_eq!(v[0].package_version, "1.2.0");
    assert!(v[2].reason.contains("also passes before"), "{:?}", v[2]);
    // PR 4: its own new test fails before and passes after; the counter test alternates and
    // is left out of both lists.
    assert_eq!(v[3].fail_to_pass, ["tests/test_calc.py::test_triple"]);
    assert_eq!(v[3].flaky, ["tests/test_counter.py::test_counter"]);
    assert!(!v[3].pass_to_pass.iter().any(|t| t.contains("counter")));
    // Both ran in one environment (no dependency but pytest, resolved as of early 2024).
    assert!(!v[0].env_key.is_empty() && v[0].env_key == v[3].env_key);
    let envs: Vec<(String, Vec<String>, String)> =
        swelake::query::rows(&ctx, "SELECT status, packages, resolved_as_of FROM environments").await.unwrap();
    assert_eq!(envs.len(), 1, "{envs:?}");
    assert_eq!(envs[0].0, "ready");
    let pytest = envs[0].1.iter().find(|p| p.starts_with("pytest==")).unwrap();
    assert!(pytest.starts_with("pytest==8.0") || pytest.starts_with("pytest==7."), "as of 2024-03: {pytest}");
    // Every run of every side is recorded: PR 1, two sides, two runs, three tests after.
    assert_eq!(
        crate::common::count(&lake, "SELECT count(*) FROM pr_tests WHERE pr_number = 1 AND side = 'after'").await,
        6
    );

    // The scratch tree's git holds the base alone: the fix is not in it.
    let tree = verify_dir().join("work/acme_calc-1/before/tree");
    // The tree is the sandbox's uid's now: git asks to be told it is safe to read.
    let log = git(&tree, &["-c", "safe.directory=*", "log", "--all", "--format=%s"]);
    assert_eq!(log.lines().count(), 1, "{log}");
    assert!(!std::fs::read_to_string(tree.join("src/calc/__init__.py")).unwrap().contains("return 0.0"));

    // The seed and the SWE-bench export carry the verdicts.
    let seed: Vec<(String, bool, Vec<String>)> =
        swelake::query::rows(&ctx, "SELECT instance_id, verified, fail_to_pass FROM rl_seed ORDER BY instance_id")
            .await
            .unwrap();
    assert!(
        seed.contains(&("acme/calc#1".into(), true, vec!["tests/test_calc.py::test_mean_empty".into()])),
        "{seed:?}"
    );
    assert!(seed.iter().any(|s| s.0 == "acme/calc#3" && !s.1 && s.2.is_empty()), "{seed:?}");
    let export = dir.path().join("swebench");
    swelake(
        &["export", "--lake", lake_s, "--format", "swebench", "--verified-only", "--out", export.to_str().unwrap()],
        &[],
    );
    let mut instances: Vec<serde_json::Value> = Vec::new();
    for split in ["train", "test"] {
        let text = std::fs::read_to_string(export.join(format!("{split}.jsonl"))).unwrap_or_default();
        instances.extend(text.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()));
    }
    let ids: Vec<&str> = instances.iter().map(|i| i["instance_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["acme__calc-1", "acme__calc-4"]);
    let one = &instances[0];
    assert_eq!(one["FAIL_TO_PASS"], "[\"tests/test_calc.py::test_mean_empty\"]");
    assert_eq!(one["version"], "1.2");
    // SWE-bench's own loader reads the lists it grades by.
    if let Some(py) = crate::python::python() {
        let files: Vec<String> = ["train", "test"]
            .iter()
            .map(|s| export.join(format!("{s}.jsonl")))
            .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.len() > 0))
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        let out =
            crate::python::script(&py, "load_swebench.py", &files.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
        let first: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
        assert_eq!(first["FAIL_TO_PASS"], serde_json::json!(["tests/test_calc.py::test_mean_empty"]), "{out}");
        assert_eq!(out.lines().count(), 2, "{out}");
    }

    // One repository: every instance in one split. The Hub layout leaves the empty split out
    // (files and configs), and `datasets.load_dataset(DIR)` loads the one there is.
    let hf = dir.path().join("hf");
    swelake(&["export", "--lake", lake_s, "--format", "hf", "--out", hf.to_str().unwrap()], &[]);
    let split = seed_split(&lake).await;
    let card = std::fs::read_to_string(hf.join("README.md")).unwrap();
    assert!(card.contains(&format!("  - split: {split}\n")), "{card}");
    let other = if split == "train" { "test" } else { "train" };
    assert!(!card.contains(&format!("  - split: {other}\n")), "{card}");
    let files: Vec<String> =
        std::fs::read_dir(hf.join("data")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert!(files.iter().all(|f| f.starts_with(&split)), "{files:?}");
    if let Some(py) = crate::python::python() {
        let out = crate::python::script(&py, "load_hf_export.py", &[hf.to_str().unwrap()], &[]);
        let loaded: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(loaded, serde_json::json!({ split.as_str(): seed.len() }), "{out}");
    }

    // evaluate: the gold patch resolves; a test-only patch and an instance not verified do not.
    let preds = dir.path().join("preds.jsonl");
    let line = |id: &str, patch: &str| {
        serde_json::json!({"instance_id": id, "model_name_or_path": "m", "model_patch": patch}).to_string() + "\n"
    };
    std::fs::write(
        &preds,
        line("acme__calc-1", one["patch"].as_str().unwrap())
            + &line("acme__calc-4", instances[1]["test_patch"].as_str().unwrap())
            + &line("acme__calc-2", "diff --git a/x b/x\n"),
    )
    .unwrap();
    let report_path = dir.path().join("eval/report.json");
    let eval_args = |p: &Path| -> Vec<String> {
        [
            "evaluate",
            "--lake",
            lake_s,
            "--predictions",
            p.to_str().unwrap(),
            "--repo-url",
            &url,
            "--cache-dir",
            cache_s,
            "--config",
            config_s,
            "--out",
            report_path.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let args = eval_args(&preds);
    swelake(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report_path).unwrap()).unwrap();
    assert_eq!(report["resolved_ids"], serde_json::json!(["acme__calc-1"]), "{report:#}");
    assert_eq!(report["unresolved_ids"], serde_json::json!(["acme__calc-4"]), "{report:#}");
    assert_eq!(report["error_ids"], serde_json::json!(["acme__calc-2"]), "{report:#}");
    assert_eq!(report["total_instances"], 2);
    assert!(dir.path().join("eval/logs/acme__calc-1/test_output.txt").exists());

    // A prediction that tries to leave: a TCP connection to a listener on the host's loopback,
    // a file outside its tree, a secret of the parent's environment, a child left running
    // past the timeout. None of it succeeds; the verdict is recorded; the host is unchanged.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    // The lake's own directory: on the host, beside the run's tree, and not in the sandbox.
    let outside = lake_dir.join("escaped.txt");
    let host_tmp = std::env::temp_dir().join(format!("swelake-escape-{}", std::process::id()));
    let etc_plant = format!("/etc/swelake-eval-planted-{}", std::process::id());
    let _in_etc = is_root().then(|| Planted::new(PathBuf::from(&etc_plant), "ETC-SECRET-e11a"));
    let evil = format!(
        "import os, socket, subprocess, time\n\n\ndef _leave():\n    found = []\n    for p in [{etc_plant:?}, \"/etc/shadow\"]:\n        try:\n            print(\"LEAKED\", open(p).read(), flush=True)\n        except OSError as e:\n            found.append(\"no read %s: %s\" % (p, e.errno))\n    side = os.path.join(os.path.dirname(__file__), \"..\", \"..\", \"..\")\n    try:\n        os.symlink({etc_plant:?}, os.path.join(side, \"out\", \"eval.log.new\"))\n        os.replace(os.path.join(side, \"out\", \"eval.log.new\"), os.path.join(side, \"out\", \"eval.log\"))\n        found.append(\"log linked\")\n    except OSError as e:\n        found.append(\"no link: %s\" % e)\n    try:\n        socket.create_connection((\"127.0.0.1\", {port}), timeout=2)\n        found.append(\"tcp\")\n    except OSError as e:\n        found.append(\"no tcp: %s\" % e)\n    for p in [{outside:?}, {host_tmp:?}]:\n        try:\n            with open(p, \"w\") as f:\n                f.write(\"x\")\n            found.append(\"wrote \" + p)\n        except OSError as e:\n            found.append(\"no write: %s\" % e)\n    found.append(\"secret=\" + os.environ.get(\"SWELAKE_TEST_SECRET\", \"absent\"))\n    with open(os.path.join(os.path.dirname(__file__), \"..\", \"..\", \"escape-report.txt\"), \"w\") as f:\n        f.write(repr(found))\n    subprocess.Popen([\"sleep\", \"987654\"], start_new_session=True)\n    time.sleep(600)\n\n\n_leave()\n",
    );
    let evil_patch = format!(
        "diff --git a/src/calc/evil.py b/src/calc/evil.py\nnew file mode 100644\n--- /dev/null\n+++ b/src/calc/evil.py\n@@ -0,0 +1,{} @@\n{}diff --git a/src/calc/__init__.py b/src/calc/__init__.py\n--- a/src/calc/__init__.py\n+++ b/src/calc/__init__.py\n@@ -1,2 +1,3 @@\n+from calc import evil  # noqa\n \"\"\"Small numeric helpers.\"\"\"\n \n",
        evil.lines().count(),
        evil.lines().map(|l| format!("+{l}\n")).collect::<String>()
    );
    let preds2 = dir.path().join("preds2.jsonl");
    std::fs::write(&preds2, line("acme__calc-1", "") + &line("acme__calc-4", &evil_patch)).unwrap();
    let mut args = eval_args(&preds2);
    args.extend(["--timeout".to_string(), "15s".to_string()]);
    swelake(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[("SWELAKE_TEST_SECRET", "hunter2-sentinel")]);
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report_path).unwrap()).unwrap();
    assert_eq!(report["empty_patch_ids"], serde_json::json!(["acme__calc-1"]), "{report:#}");
    assert_eq!(report["unresolved_ids"], serde_json::json!(["acme__calc-4"]), "{report:#}");
    assert!(report["reasons"]["acme__calc-4"].as_str().unwrap().contains("timeout"), "{report:#}");
    let seen = std::fs::read_to_string(dir.path().join("eval/logs/acme__calc-4/run/tree/escape-report.txt")).unwrap();
    assert!(seen.contains("no tcp") && !seen.contains("'tcp'"), "{seen}");
    // Its /tmp is its own: what it wrote there is gone with it.
    assert!(!seen.contains(&format!("wrote {}", outside.display())), "{seen}");
    assert!(seen.contains("secret=absent") && !seen.contains("hunter2"), "{seen}");
    assert!(matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock), "a connection came in");
    assert!(!outside.exists() && !host_tmp.exists());
    assert!(!process_running(&["sleep", "987654"]), "a child of the sandbox outlived it");
    // Root's file in /etc was read neither by the patch nor, through the link it left in place
    // of its log, by the host: not in the report, not in any log.
    assert!(seen.contains("no read") && seen.contains("log linked"), "{seen}");
    let mut texts = vec![std::fs::read_to_string(&report_path).unwrap()];
    let mut stack = vec![dir.path().join("eval/logs")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                texts.push(String::from_utf8_lossy(&std::fs::read(e.path()).unwrap()).into_owned());
            }
        }
    }
    assert!(texts.iter().all(|t| !t.contains("ETC-SECRET")), "a planted secret left");

    // A verify run after the seed was built, which the seed has not taken in: export and the
    // card refuse it and name the command.
    swelake::lake::runs::record(
        &lake,
        swelake::lake::runs::RunRecord::ok("verify", "acme/calc", 1, 1, 0, None, serde_json::json!({})),
    )
    .await
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_swelake"))
        .args(["export", "--lake", lake_s, "--format", "swebench", "--verified-only", "--out"])
        .arg(dir.path().join("stale"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && text.contains("swelake run seed"), "{text}");
}

#[test]
fn the_sandbox_refuses_what_is_not_its_own() {
    if !can_verify() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(&tree).unwrap();
    let sb = swelake::verify::sandbox::Sandbox::new("bwrap", 1024, 4096).unwrap();
    let mounts =
        swelake::verify::sandbox::Mounts { read_only: vec![], writable: vec![tree.clone()], ..Default::default() };
    let log = dir.path().join("log.txt");
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let script = format!(
        "ls {home} >/dev/null 2>&1 && echo HOME-VISIBLE; echo x > /usr/x 2>/dev/null && echo USR-WRITABLE; \
         cat /etc/shadow 2>/dev/null | head -c 1 | grep -q . && echo SHADOW; echo ok > {}/inside.txt; env; \
         (sleep 987655 &) ; sleep 30",
        tree.display()
    );
    let argv: Vec<String> = ["/bin/sh", "-c", &script].iter().map(|s| s.to_string()).collect();
    let exit = sb
        .run(&argv, &tree, &[("PATH".into(), "/usr/bin:/bin".into())], &mounts, &log, std::time::Duration::from_secs(3))
        .unwrap();
    assert!(exit.timed_out);
    let out = std::fs::read_to_string(&log).unwrap();
    assert!(!out.contains("HOME-VISIBLE") && !out.contains("USR-WRITABLE") && !out.contains("SHADOW"), "{out}");
    assert!(out.contains("PATH=/usr/bin:/bin") && !out.contains("HOME="), "an empty environment but PATH: {out}");
    assert_eq!(std::fs::read_to_string(tree.join("inside.txt")).unwrap(), "ok\n");
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(!process_running(&["sleep", "987655"]), "a background child outlived the timeout");
    assert!(swelake::verify::sandbox::Sandbox::new("docker", 1, 1).unwrap_err().to_string().contains("bwrap or none"));
}

/// A root-only (0600) file on the host, removed when dropped.
struct Planted(PathBuf);

impl Planted {
    fn new(path: PathBuf, secret: &str) -> Planted {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(&path, secret).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        Planted(path)
    }
}

impl Drop for Planted {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Whether the tests run as root (CI does): only then do `/etc` plants and the uid drop apply.
fn is_root() -> bool {
    // SAFETY: a plain system call.
    unsafe { libc::geteuid() == 0 }
}

/// The interpreter the verify stage would use, and its prefix (mounted into the sandbox).
fn host_python() -> (String, String) {
    let tools = swelake::verify::python::env::PyTools::prepare(&Default::default(), &verify_dir()).unwrap();
    (tools.python.to_string_lossy().into_owned(), tools.python_prefix.to_string_lossy().into_owned())
}

/// As an attacker's test or patch would: read root-only files planted in `/etc` and in a
/// mount it sees, list `/etc`, start 600 processes against `max_processes = 256`, and hold
/// 600 MB in four processes against a run's 256 MiB. It reads nothing, starts at most 256,
/// and the memory of the run as a whole is bounded where a cgroup can be made (CI: root).
#[test]
fn a_run_is_a_uid_of_its_own_and_bounded_as_a_whole() {
    if !can_verify() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    let ro = dir.path().join("ro");
    std::fs::create_dir_all(&tree).unwrap();
    std::fs::create_dir_all(&ro).unwrap();
    let _in_mount = Planted::new(ro.join("secret.txt"), "MOUNTED-SECRET-7f3a");
    let etc_plant = format!("/etc/swelake-planted-{}", std::process::id());
    let _in_etc = is_root().then(|| Planted::new(PathBuf::from(&etc_plant), "ETC-SECRET-9c2e"));
    let (python, prefix) = host_python();
    let sb = swelake::verify::sandbox::Sandbox::new("bwrap", 1024, 256).unwrap().with_run_memory(256);
    let bounds = sb.bounds();
    eprintln!("sandbox: {bounds}");
    let mounts = swelake::verify::sandbox::Mounts {
        read_only: vec![ro.clone(), PathBuf::from(&prefix)],
        writable: vec![tree.clone()],
        ..Default::default()
    };
    let run = |script: &str, name: &str| {
        let log = dir.path().join(format!("{name}.log"));
        let argv = vec![python.clone(), "-c".to_string(), script.to_string()];
        let env = [("PATH".to_string(), "/usr/bin:/bin".to_string()), ("HOME".to_string(), "/tmp".to_string())];
        let exit = sb.run(&argv, &tree, &env, &mounts, &log, std::time::Duration::from_secs(60)).unwrap();
        (exit, std::fs::read_to_string(&log).unwrap())
    };

    let reads = format!(
        "import os\nprint('UID', os.getuid())\nfor p in [{etc_plant:?}, {:?}, '/etc/shadow', '/etc/ssl/private']:\n    try:\n        print('READ', p, open(p).read() if os.path.isfile(p) else os.listdir(p))\n    except OSError as e:\n        print('DENIED', p, e.errno)\nprint('ETC', sorted(os.listdir('/etc')))\nprint('PASSWD', open('/etc/passwd').read().count(chr(10)))\n",
        ro.join("secret.txt").display()
    );
    let (exit, out) = run(&reads, "reads");
    assert_eq!(exit.code, Some(0), "{out}");
    assert!(!out.contains("SECRET") && !out.contains("READ"), "a host secret was read:\n{out}");
    let etc = out.lines().find(|l| l.starts_with("ETC ")).unwrap();
    for absent in ["shadow", "sudoers", "swelake-planted", "ssh"] {
        assert!(!etc.contains(absent), "{absent} in the sandbox's /etc: {etc}");
    }
    assert!(etc.contains("'hosts'") && etc.contains("'passwd'") && etc.contains("'ld.so.cache'"), "{etc}");
    if is_root() {
        let uid: u64 = out.lines().find_map(|l| l.strip_prefix("UID ")).unwrap().trim().parse().unwrap();
        assert!(uid >= u64::from(swelake::verify::sandbox::SANDBOX_UID), "ran as uid {uid}: {out}");
        assert!(bounds.contains("not root"), "{bounds}");
    }

    let forks = "import os, time\nn = 0\nwhy = ''\nfor i in range(600):\n    try:\n        pid = os.fork()\n    except OSError as e:\n        why = str(e)\n        break\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n    n += 1\nprint('STARTED', n, why, flush=True)\n";
    let (_, out) = run(forks, "forks");
    let started: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("STARTED "))
        .unwrap_or_else(|| panic!("{out}"))
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(started < 256, "{started} processes started past max_processes = 256: {out}");
    assert!(out.contains("Resource temporarily unavailable"), "{out}");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(!process_running(&[&python, "-c", forks]), "a forked child outlived the run");

    let memory = "import os, time\npids = []\nfor i in range(4):\n    pid = os.fork()\n    if pid == 0:\n        b = bytearray(150 << 20)\n        for j in range(0, len(b), 4096):\n            b[j] = 1\n        time.sleep(2)\n        os._exit(0)\n    pids.append(pid)\nkilled = 0\nfor p in pids:\n    _, status = os.waitpid(p, 0)\n    killed += os.WIFSIGNALED(status)\nprint('KILLED', killed, flush=True)\n";
    let (exit, out) = run(memory, "memory");
    if bounds.contains("cgroup") {
        assert!(!out.contains("KILLED 0"), "600 MB were held in a run of 256 MiB: {out}");
        assert!(out.contains("KILLED") || exit.code != Some(0), "{out}");
    } else {
        eprintln!("no cgroup can be made here ({bounds}): a run's memory is bounded per process only");
    }
}

/// An environment whose one dependency is an sdist with a hostile `setup.py`: uv builds it
/// (to read its metadata) in the sandbox, where it reads neither the host's home nor a
/// root-only file planted in `/etc` or in uv's cache, cannot write beside the environments or
/// in the test's directory, and sees none of the host's environment variables; it records
/// what it found in uv's cache, the one place it may write, and fails the build.
#[test]
fn an_environment_build_runs_package_code_in_the_sandbox() {
    if !can_verify() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("verify");
    let cache = root.join("uv-cache");
    std::fs::create_dir_all(&cache).unwrap();
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let home_plant = PathBuf::from(&home).join(format!(".swelake-build-planted-{}", std::process::id()));
    let _in_home = Planted::new(home_plant.clone(), "HOME-SECRET-0a7c");
    let etc_plant = format!("/etc/swelake-build-planted-{}", std::process::id());
    let _in_etc = is_root().then(|| Planted::new(PathBuf::from(&etc_plant), "ETC-SECRET-b41d"));
    let cache_plant = cache.join("planted-secret.txt");
    let outside = [root.join("escaped.txt"), dir.path().join("escaped.txt")];
    let setup = format!(
        "import os\nfound = ['uid=%d' % os.getuid()]\nfor p in [{:?}, {etc_plant:?}, {:?}]:\n    try:\n        found.append('read %s: %r' % (p, os.listdir(p) if os.path.isdir(p) else open(p).read()))\n    except OSError as e:\n        found.append('denied %s: %s' % (p, e.errno))\nfor p in [{:?}, {:?}]:\n    try:\n        open(p, 'w').write('x')\n        found.append('wrote ' + p)\n    except OSError as e:\n        found.append('no write %s: %s' % (p, e.errno))\nfound.append('env=' + ','.join(sorted(k for k in os.environ if 'SECRET' in k or 'TOKEN' in k or 'AWS' in k)))\nopen(os.path.join(os.environ['UV_CACHE_DIR'], 'probe-findings.txt'), 'w').write('\\n'.join(found))\nraise RuntimeError('swelake build probe done')\n",
        home_plant.display(),
        cache_plant.display(),
        outside[0].display(),
        outside[1].display()
    );
    let pkg = dir.path().join("pkg/swelake_build_probe-1.0");
    std::fs::create_dir_all(&pkg).unwrap();
    std::fs::write(pkg.join("setup.py"), setup).unwrap();
    std::fs::write(pkg.join("PKG-INFO"), "Metadata-Version: 2.1\nName: swelake-build-probe\nVersion: 1.0\n").unwrap();
    // Where the build can read it: a download in uv's cache.
    let sdist = cache.join("downloads/swelake_build_probe-1.0.tar.gz");
    std::fs::create_dir_all(sdist.parent().unwrap()).unwrap();
    let tar = Command::new("tar")
        .args([
            "czf",
            sdist.to_str().unwrap(),
            "-C",
            dir.path().join("pkg").to_str().unwrap(),
            "swelake_build_probe-1.0",
        ])
        .status()
        .unwrap();
    assert!(tar.success());
    let cfg = swelake::verify::VerifyConfig { dir: root.to_string_lossy().into_owned(), ..Default::default() };
    let tools = swelake::verify::python::env::PyTools::prepare(&cfg, dir.path()).unwrap();
    // Planted after uv's cache is handed to the build uid: root's file, 0600, inside it.
    let sb = swelake::verify::sandbox::Sandbox::new("bwrap", 4096, 4096).unwrap();
    let spec = swelake::verify::python::spec::Spec {
        files: vec!["pyproject.toml".into()],
        name: Some("victim".into()),
        dependencies: vec![format!("swelake-build-probe @ file://{}", sdist.display())],
        ..Default::default()
    };
    let _in_cache = {
        // Hand the cache over first (a first build does that), then plant root's file in it.
        let mounts = swelake::verify::sandbox::Mounts { kept: vec![cache.clone()], ..Default::default() };
        let log = dir.path().join("handover.log");
        let opts = swelake::verify::sandbox::RunOptions { network: false, build: true };
        sb.run_with(
            &["/bin/true".to_string()],
            Path::new("/"),
            &[],
            &mounts,
            &log,
            std::time::Duration::from_secs(10),
            opts,
        )
        .unwrap();
        Planted::new(cache_plant.clone(), "CACHE-SECRET-55e0")
    };
    let row = swelake::verify::python::env::prepare("acme/victim", &spec, "2024-03-01T00:00:00Z", &tools, &sb, true)
        .expect_err("the probe fails its build");
    assert_eq!(row.status, "failed");
    let found = std::fs::read_to_string(cache.join("probe-findings.txt"))
        .unwrap_or_else(|e| panic!("the build did not run its setup.py ({e}): {}", row.reason));
    eprintln!("what the build found:\n{found}");
    assert!(!found.contains("SECRET-") && !found.contains("read "), "{found}");
    assert!(found.contains(&format!("denied {}", home_plant.display())), "{found}");
    assert!(!found.contains("wrote "), "{found}");
    assert!(found.lines().any(|l| l == "env="), "{found}");
    for p in &outside {
        assert!(!p.exists(), "{} was written", p.display());
    }
    if is_root() {
        assert!(!found.contains("uid=0"), "{found}");
    }
    assert!(row.reason.contains("swelake-build-probe"), "{}", row.reason);
}

const JS_PACKAGE: &str = r#"{
  "name": "calc-js",
  "version": "0.3.0",
  "private": true,
  "scripts": { "test": "NODE_ENV=test mocha --timeout 5000 --reporter dot test/" },
  "devDependencies": { "mocha": "^10.2.0" }
}
"#;
const JS_CALC: &str = "'use strict';\n\nfunction mean(xs) {\n  return xs.reduce((a, b) => a + b, 0) / xs.length;\n}\n\nmodule.exports = { mean };\n";
const JS_TEST: &str = "'use strict';\nconst assert = require('assert');\nconst { mean } = require('../lib/calc');\n\ndescribe('mean', () => {\n  it('of numbers', () => assert.strictEqual(mean([1, 2, 3]), 2));\n});\n";

/// Alice's PR `n` on `branch` (its edits, one commit), merged into main by GitHub's merge
/// commit, `n` thousand seconds after `t0`, naming the issue it fixes.
fn alice_pr(dir: &Path, t0: i64, n: i64, issue: i64, branch: &str, edits: &dyn Fn(), title: &str) {
    git(dir, &["checkout", "-q", "-b", branch]);
    edits();
    commit(dir, ALICE, t0 + n * 1000, title);
    git(dir, &["checkout", "-q", "main"]);
    let msg = format!(
        "Merge pull request #{n} from alice/{branch}\n\n{title}\n\nThe reported case works now.\nFixes #{issue}"
    );
    merge(dir, branch, t0 + n * 1000 + 500, &msg);
}

/// acme/calc-js (mocha, its package-lock.json committed) with two merged PRs: a fix with its
/// test, and a new module whose test file cannot load before it.
fn make_js_repo(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    git(dir, &["init", "-q"]);
    write(dir, "package.json", JS_PACKAGE);
    let lock = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/verify/calc-js/package-lock.json");
    write(dir, "package-lock.json", &std::fs::read_to_string(lock).unwrap());
    write(dir, "lib/calc.js", JS_CALC);
    write(dir, "test/calc.test.js", JS_TEST);
    write(dir, ".gitignore", "node_modules/\n");
    let t0 = 1_717_200_000; // 2024-06-01
    commit(dir, BOB, t0, "Initial import");
    let read = |p: &str| std::fs::read_to_string(dir.join(p)).unwrap();
    let pr = |n: i64, branch: &str, edits: &dyn Fn(), title: &str| alice_pr(dir, t0, n, n + 20, branch, edits, title);
    pr(
        1,
        "empty-mean",
        &|| {
            write(
                dir,
                "lib/calc.js",
                &read("lib/calc.js")
                    .replace("  return xs.reduce", "  if (xs.length === 0) return 0;\n  return xs.reduce"),
            );
            write(
                dir,
                "test/calc.test.js",
                &read("test/calc.test.js")
                    .replace("});\n", "  it('of nothing is 0', () => assert.strictEqual(mean([]), 0));\n});\n"),
            );
        },
        "mean() of an empty list is NaN",
    );
    pr(
        2,
        "median",
        &|| {
            write(
                dir,
                "lib/median.js",
                "'use strict';\n\nmodule.exports = function median(xs) {\n  const s = [...xs].sort((a, b) => a - b);\n  const m = s.length >> 1;\n  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;\n};\n",
            );
            write(
                dir,
                "test/median.test.js",
                "'use strict';\nconst assert = require('assert');\nconst median = require('../lib/median');\n\ndescribe('median', () => {\n  it('of an odd count', () => assert.strictEqual(median([3, 1, 2]), 2));\n  it('of an even count', () => assert.strictEqual(median([4, 1, 3, 2]), 2.5));\n});\n",
            );
        },
        "A median() helper, as asked",
    );
}

/// Whether node and npm are here; with SWELAKE_REQUIRE_PYTHON=1 (CI) their absence fails.
fn has_node() -> bool {
    let ok =
        ["node", "npm"].iter().all(|t| Command::new(t).arg("--version").output().is_ok_and(|o| o.status.success()));
    if !ok {
        assert!(
            !std::env::var("SWELAKE_REQUIRE_PYTHON").is_ok_and(|v| v == "1"),
            "SWELAKE_REQUIRE_PYTHON=1 but node or npm does not run here"
        );
        eprintln!("skipping: node and npm are not installed");
    }
    ok
}

#[tokio::test(flavor = "multi_thread")]
async fn javascript_prs_verify_with_their_runner_and_lockfile() {
    if !can_verify() || !has_node() {
        return;
    }
    let fx = Fixture::new("acme/calc-js", make_js_repo, false);
    // A machine without Python verifies JavaScript all the same (uv is never fetched).
    let mut config = std::fs::read_to_string(&fx.config).unwrap();
    config.push_str("python = \"/nonexistent/python3\"\n");
    std::fs::write(&fx.config, config).unwrap();
    let dir = &fx.dir;
    let (lake_s, cache_s, config_s, url) = (fx.lake.as_str(), fx.cache.as_str(), fx.config.as_str(), fx.url.clone());
    let common = fx.common();
    // As docs/verify.md has users do it: the pipeline first, then the verify stage by name,
    // which brings the seed (and so the shards and exports) up to its verdicts.
    let out = swelake(&[&["run", "verify"][..], &common].concat(), &[]);
    assert!(out.contains("status:verified: 2"), "{out}");
    assert!(
        out.lines().any(|l| l.starts_with("seed ") && l.contains("partition")),
        "seed did not follow verify: {out}"
    );
    let lake = Lake::open(lake_s).unwrap();
    let ctx = lake.session().await.unwrap();
    let v: Vec<Verdict> = verdicts(&ctx).await;
    assert_eq!(v.len(), 2, "{v:#?}");
    assert_eq!(v[0].fail_to_pass, ["test/calc.test.js::mean > of nothing is 0"], "{v:#?}");
    assert_eq!(v[0].pass_to_pass, ["test/calc.test.js::mean > of numbers"]);
    assert_eq!(v[0].package_version, "0.3.0");
    // The new module's test file does not load before it: its tests fail there.
    assert_eq!(
        v[1].fail_to_pass,
        ["test/median.test.js::median > of an even count", "test/median.test.js::median > of an odd count"],
        "{v:#?}"
    );
    assert!(v[1].pass_to_pass.is_empty() && v[1].flaky.is_empty());
    assert_eq!(v[0].env_key, v[1].env_key);
    // The environment is the committed lock's: mocha as it pins it, no date involved.
    #[derive(Deserialize, Debug)]
    struct EnvRow {
        language: String,
        status: String,
        packages: Vec<String>,
        spec_files: Vec<String>,
        resolved_as_of: String,
    }
    let envs: Vec<EnvRow> =
        swelake::query::rows(&ctx, "SELECT language, status, packages, spec_files, resolved_as_of FROM environments")
            .await
            .unwrap();
    assert_eq!(envs.len(), 1, "{envs:?}");
    let e = &envs[0];
    assert_eq!((e.language.as_str(), e.status.as_str()), ("javascript", "ready"));
    assert!(e.packages.contains(&"mocha==10.8.2".to_string()), "{:?}", e.packages);
    assert_eq!(e.spec_files, ["package.json", "package-lock.json"]);
    assert_eq!(e.resolved_as_of, "package-lock.json (committed)");

    // The gold patch resolves under evaluate; the test-only patch does not.
    let export = dir.path().join("swebench");
    swelake(&["export", "--lake", lake_s, "--format", "swebench", "--out", export.to_str().unwrap()], &[]);
    let mut instances: Vec<serde_json::Value> = Vec::new();
    for split in ["train", "test"] {
        let text = std::fs::read_to_string(export.join(format!("{split}.jsonl"))).unwrap_or_default();
        instances.extend(text.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()));
    }
    instances.sort_by_key(|i| i["instance_id"].as_str().unwrap().to_string());
    assert_eq!(instances.len(), 2);
    // SWE-bench's own loader reads JavaScript test ids (`path::describe > title`) as it reads pytest's.
    if let Some(py) = crate::python::python() {
        let files: Vec<String> = ["train", "test"]
            .iter()
            .map(|s| export.join(format!("{s}.jsonl")))
            .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.len() > 0))
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        let out =
            crate::python::script(&py, "load_swebench.py", &files.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
        let loaded: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert!(
            loaded
                .iter()
                .any(|i| i["FAIL_TO_PASS"] == serde_json::json!(["test/calc.test.js::mean > of nothing is 0"])),
            "{out}"
        );
    }
    let line = |id: &str, patch: &str| {
        serde_json::json!({"instance_id": id, "model_name_or_path": "m", "model_patch": patch}).to_string() + "\n"
    };
    let preds = dir.path().join("preds.jsonl");
    std::fs::write(
        &preds,
        line("acme__calc-js-1", instances[0]["patch"].as_str().unwrap())
            + &line("acme__calc-js-2", instances[1]["test_patch"].as_str().unwrap()),
    )
    .unwrap();
    let report_path = dir.path().join("eval/report.json");
    swelake(
        &[
            "evaluate",
            "--lake",
            lake_s,
            "--predictions",
            preds.to_str().unwrap(),
            "--repo-url",
            &url,
            "--cache-dir",
            cache_s,
            "--config",
            config_s,
            "--out",
            report_path.to_str().unwrap(),
        ],
        &[],
    );
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report_path).unwrap()).unwrap();
    assert_eq!(report["resolved_ids"], serde_json::json!(["acme__calc-js-1"]), "{report:#}");
    assert_eq!(report["unresolved_ids"], serde_json::json!(["acme__calc-js-2"]), "{report:#}");
}

const NODE_TEST_PACKAGE: &str = r#"{
  "name": "units-js",
  "version": "1.4.0",
  "private": true,
  "scripts": {
    "build": "node scripts/build.js",
    "lint": "eslint .",
    "test": "npm run lint && npm run build && NODE_ENV=test node --test test/"
  }
}
"#;
const NODE_TEST_LOCK: &str = r#"{
  "name": "units-js",
  "version": "1.4.0",
  "lockfileVersion": 3,
  "requires": true,
  "packages": {
    "": {
      "name": "units-js",
      "version": "1.4.0"
    }
  }
}
"#;
/// The build step writes `lib/table.js` from `units.json`: without it the tests do not load.
const NODE_TEST_BUILD: &str = "'use strict';\nconst fs = require('fs');\nconst path = require('path');\nconst root = path.join(__dirname, '..');\nconst units = JSON.parse(fs.readFileSync(path.join(root, 'units.json'), 'utf8'));\nfs.writeFileSync(path.join(root, 'lib/table.js'), 'module.exports = ' + JSON.stringify(units) + ';\\n');\n";
const NODE_TEST_LIB: &str = "'use strict';\nconst table = require('./table');\n\nfunction toMeters(value, unit) {\n  return value * table[unit];\n}\n\nmodule.exports = { toMeters };\n";
const NODE_TEST_TEST: &str = "'use strict';\nconst { describe, it } = require('node:test');\nconst assert = require('node:assert');\nconst { toMeters } = require('../lib/convert');\n\ndescribe('toMeters', () => {\n  it('of kilometers', () => assert.strictEqual(toMeters(2, 'km'), 2000));\n});\n";

/// acme/units-js: tests on node's own runner behind a lint step (skipped) and a build step
/// (run in the sandbox: the tests need what it writes), with two merged PRs: a unit the table
/// lacked, and a new module whose test file cannot load before it.
fn make_node_test_repo(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    git(dir, &["init", "-q"]);
    write(dir, "package.json", NODE_TEST_PACKAGE);
    write(dir, "package-lock.json", NODE_TEST_LOCK);
    write(dir, "scripts/build.js", NODE_TEST_BUILD);
    write(dir, "units.json", "{\"km\": 1000, \"m\": 1}\n");
    write(dir, "lib/convert.js", NODE_TEST_LIB);
    write(dir, "test/convert.test.js", NODE_TEST_TEST);
    write(dir, ".gitignore", "node_modules/\nlib/table.js\n");
    let t0 = 1_717_200_000; // 2024-06-01
    commit(dir, BOB, t0, "Initial import");
    let read = |p: &str| std::fs::read_to_string(dir.join(p)).unwrap();
    let pr = |n: i64, branch: &str, edits: &dyn Fn(), title: &str| alice_pr(dir, t0, n, n + 40, branch, edits, title);
    pr(
        1,
        "miles",
        &|| {
            write(dir, "units.json", "{\"km\": 1000, \"m\": 1, \"mi\": 1609.344}\n");
            write(
                dir,
                "test/convert.test.js",
                &read("test/convert.test.js").replace(
                    "});\n",
                    "  it('of miles', () => assert.strictEqual(toMeters(1, 'mi'), 1609.344));\n});\n",
                ),
            );
        },
        "toMeters() of miles is NaN",
    );
    pr(
        2,
        "round",
        &|| {
            write(dir, "lib/round.js", "'use strict';\n\nmodule.exports = function round(x, places) {\n  const f = 10 ** places;\n  return Math.round(x * f) / f;\n};\n");
            write(
                dir,
                "test/round.test.js",
                "'use strict';\nconst test = require('node:test');\nconst assert = require('node:assert');\nconst round = require('../lib/round');\n\ntest('to two places', () => assert.strictEqual(round(1.005, 2), 1));\ntest('to none', () => assert.strictEqual(round(2.5, 0), 3));\n",
            );
        },
        "A round() helper",
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn node_test_prs_verify_after_their_build_step_with_two_at_once() {
    if !can_verify() || !has_node() {
        return;
    }
    let fx = Fixture::new("acme/units-js", make_node_test_repo, false);
    let common = fx.common();
    // Two PRs at once, each in sandboxes of its own.
    let out = swelake(&[&["run", "verify", "--jobs", "2"][..], &common].concat(), &[]);
    assert!(out.contains("status:verified: 2"), "{out}");
    let lake = Lake::open(&fx.lake).unwrap();
    let ctx = lake.session().await.unwrap();
    let v: Vec<Verdict> = verdicts(&ctx).await;
    assert_eq!(v.len(), 2, "{v:#?}");
    assert_eq!(v[0].fail_to_pass, ["test/convert.test.js::toMeters > of miles"], "{v:#?}");
    assert_eq!(v[0].pass_to_pass, ["test/convert.test.js::toMeters > of kilometers"], "{v:#?}");
    // The new module's test file does not load before it: its tests are absent there.
    assert_eq!(v[1].fail_to_pass, ["test/round.test.js::to none", "test/round.test.js::to two places"], "{v:#?}");
    assert_eq!(v[0].package_version, "1.4.0");
    let relaxed: Vec<(String, Vec<String>)> =
        swelake::query::rows(&ctx, "SELECT interpreter, relaxed FROM environments").await.unwrap();
    assert_eq!(relaxed.len(), 1, "{relaxed:?}");
    assert!(relaxed[0].0.starts_with("node "), "{relaxed:?}");
    assert_eq!(relaxed[0].1, ["lint step `eslint .` is not a test: skipped"], "{relaxed:?}");
    // One at a time gives the same verdicts.
    let out = swelake(&[&["run", "verify", "--jobs", "1", "--force"][..], &common].concat(), &[]);
    assert!(out.contains("status:verified: 2"), "{out}");
    let again: Vec<Verdict> = verdicts(&lake.session().await.unwrap()).await;
    assert_eq!(format!("{v:?}"), format!("{again:?}"));
}

const CLI_PYPROJECT: &str = "[build-system]\nrequires = [\"setuptools>=61\"]\nbuild-backend = \"setuptools.build_meta\"\n\n[project]\nname = \"calc-cli\"\nversion = \"0.9.1\"\nrequires-python = \">=3.8\"\ndependencies = [\"packaging==21.3\"]\n\n[project.scripts]\ncalc = \"calc_cli:main\"\n";
const CLI_MODULE: &str = "import sys\nfrom importlib.metadata import version\n\n__version__ = version(\"calc-cli\")\n\n\ndef main():\n    print(sum(int(a) for a in sys.argv[1:]))\n";
const CLI_TESTS: &str = "import subprocess\n\nimport calc_cli\n\n\ndef test_version():\n    assert calc_cli.__version__ == \"0.9.1\"\n\n\ndef test_script_adds():\n    assert subprocess.run([\"calc\", \"1\", \"2\"], capture_output=True, text=True).stdout == \"3\\n\"\n";

const CLI_VERSIONS: &str = "from packaging.version import InvalidVersion, parse\n\n\ndef parse_version(text):\n    try:\n        return parse(text)\n    except InvalidVersion:\n        return None\n";
const CLI_VERSION_TESTS: &str = "from calc_cli.versions import parse_version\n\n\ndef test_not_a_version():\n    assert parse_version(\"not a version\") is None\n\n\ndef test_a_version():\n    assert str(parse_version(\"1.2\")) == \"1.2\"\n";

/// acme/calc-cli: a project whose tests need it installed (its version from its own metadata,
/// its console script), with two merged PRs: one changes what the script prints, one bumps the
/// dependency its fix needs.
fn make_cli_repo(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    git(dir, &["init", "-q"]);
    write(dir, "pyproject.toml", CLI_PYPROJECT);
    write(dir, "src/calc_cli/__init__.py", CLI_MODULE);
    write(dir, "tests/test_cli.py", CLI_TESTS);
    let t0 = 1_709_251_200; // 2024-03-01
    commit(dir, BOB, t0, "Initial import");
    git(dir, &["checkout", "-q", "-b", "floats"]);
    write(
        dir,
        "src/calc_cli/__init__.py",
        &CLI_MODULE
            .replace("int(a)", "float(a)")
            .replace("print(sum(", "print(format(sum(")
            .replace("argv[1:]))", "argv[1:]), \"g\"))"),
    );
    write(
        dir,
        "tests/test_cli.py",
        &format!("{CLI_TESTS}\n\ndef test_script_adds_fractions():\n    assert subprocess.run([\"calc\", \"0.5\", \"2\"], capture_output=True, text=True).stdout == \"2.5\\n\"\n"),
    );
    commit(dir, ALICE, t0 + 1000, "calc adds fractions too");
    git(dir, &["checkout", "-q", "main"]);
    merge(
        dir,
        "floats",
        t0 + 1500,
        "Merge pull request #1 from alice/floats\n\ncalc adds fractions too\n\nThe reported case works now.\nFixes #7",
    );
    // A fix that is a dependency bump: packaging 22 raises on what 21.3 parsed as a legacy
    // version, which the module already turns into None.
    write(dir, "src/calc_cli/versions.py", CLI_VERSIONS);
    commit(dir, BOB, t0 + 2000, "versions helper");
    git(dir, &["checkout", "-q", "-b", "packaging-22"]);
    write(dir, "pyproject.toml", &CLI_PYPROJECT.replace("packaging==21.3", "packaging==22.0"));
    write(dir, "tests/test_versions.py", CLI_VERSION_TESTS);
    commit(dir, ALICE, t0 + 3000, "Not a version is None: packaging 22");
    git(dir, &["checkout", "-q", "main"]);
    merge(
        dir,
        "packaging-22",
        t0 + 3500,
        "Merge pull request #2 from alice/packaging-22\n\nNot a version is None: packaging 22\n\nThe reported case works now.\nFixes #8",
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_project_whose_tests_need_it_installed_is_installed_per_side() {
    if !can_verify() {
        return;
    }
    let fx = Fixture::new("acme/calc-cli", make_cli_repo, false);
    let out = swelake(&[&["run", "verify"][..], &fx.common()].concat(), &[]);
    assert!(out.contains("status:verified: 2"), "{out}");
    let lake = Lake::open(&fx.lake).unwrap();
    let ctx = lake.session().await.unwrap();
    let v: Vec<Verdict> = verdicts(&ctx).await;
    // Its metadata and its script are there on both sides: the installed project's.
    assert_eq!(v[0].fail_to_pass, ["tests/test_cli.py::test_script_adds_fractions"], "{v:#?}");
    assert_eq!(v[0].pass_to_pass, ["tests/test_cli.py::test_script_adds", "tests/test_cli.py::test_version"], "{v:#?}");
    // The bump's test fails on the merge base's packaging and passes on the PR's own.
    assert_eq!(v[1].fail_to_pass, ["tests/test_versions.py::test_not_a_version"], "{v:#?}");
    assert!(v[1].pass_to_pass.contains(&"tests/test_versions.py::test_a_version".to_string()), "{v:#?}");
    assert_eq!(v[0].env_key, v[1].env_key, "the verdict names the merge base's environment");
    let envs: Vec<(String, Vec<String>, Vec<String>)> =
        swelake::query::rows(&ctx, "SELECT env_key, relaxed, packages FROM environments ORDER BY env_key")
            .await
            .unwrap();
    assert_eq!(envs.len(), 2, "the merge base's environment and the bump's: {envs:?}");
    let with = |pin: &str| envs.iter().filter(|e| e.2.iter().any(|p| p == pin)).count();
    assert_eq!((with("packaging==21.3"), with("packaging==22.0")), (1, 1), "{envs:?}");
    assert!(envs[0].1.iter().any(|r| r.contains("installed into each side's tree (console scripts)")), "{envs:?}");
}

const NUMPARSE_TOML: &str = "[package]\nname = \"numparse\"\nversion = \"0.1.0\"\nedition = \"2021\"\n";
const NUMPARSE_LOCK: &str = "# This file is automatically @generated by Cargo.\n# It is not intended for manual editing.\nversion = 3\n\n[[package]]\nname = \"numparse\"\nversion = \"0.1.0\"\n";
const NUMPARSE_LIB: &str = "//! Numbers from text.\n\n/// A decimal number of digits alone.\npub fn parse(s: &str) -> Option<i64> {\n    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {\n        return None;\n    }\n    s.parse().ok()\n}\n\n#[cfg(test)]\nmod tests;\n";
const NUMPARSE_UNIT: &str =
    "use super::*;\n\n#[test]\nfn digits() {\n    assert_eq!(parse(\"42\"), Some(42));\n}\n\n#[test]\nfn empty() {\n    assert_eq!(parse(\"\"), None);\n}\n";
const NUMPARSE_API: &str = "#[test]\nfn public_parse() {\n    assert_eq!(numparse::parse(\"7\"), Some(7));\n}\n";

/// A Rust crate without dependencies (its lock committed): PR 1 parses negative numbers, its
/// test in `tests/api.rs`; PR 2 adds `parse_hex`, its unit tests in the `tests` module of
/// `src/`, which do not compile on the merge base.
fn make_rust_repo(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    git(dir, &["init", "-q"]);
    write(dir, "Cargo.toml", NUMPARSE_TOML);
    write(dir, "Cargo.lock", NUMPARSE_LOCK);
    write(dir, "src/lib.rs", NUMPARSE_LIB);
    write(dir, "src/tests.rs", NUMPARSE_UNIT);
    write(dir, "tests/api.rs", NUMPARSE_API);
    write(dir, ".gitignore", "/target\n");
    let t0 = 1_709_251_200; // 2024-03-01
    commit(dir, BOB, t0, "Initial import");
    let pr = |n: i64, branch: &str, edits: &dyn Fn(), title: &str| {
        git(dir, &["checkout", "-q", "-b", branch]);
        edits();
        commit(dir, ALICE, t0 + n * 1000, title);
        git(dir, &["checkout", "-q", "main"]);
        let msg = format!(
            "Merge pull request #{n} from alice/{branch}\n\n{title}\n\nWhat the issue reported is handled now, with care.\nFixes #{}",
            n + 10
        );
        merge(dir, branch, t0 + n * 1000 + 500, &msg);
    };
    let read = |p: &str| std::fs::read_to_string(dir.join(p)).unwrap();
    pr(
        1,
        "negative",
        &|| {
            write(
                dir,
                "src/lib.rs",
                &read("src/lib.rs").replace(
                    "pub fn parse(s: &str) -> Option<i64> {\n",
                    "pub fn parse(s: &str) -> Option<i64> {\n    if let Some(rest) = s.strip_prefix('-') {\n        return parse(rest).map(|n| -n);\n    }\n",
                ),
            );
            write(
                dir,
                "tests/api.rs",
                &format!(
                    "{}\n#[test]\nfn negative() {{\n    assert_eq!(numparse::parse(\"-12\"), Some(-12));\n}}\n",
                    read("tests/api.rs")
                ),
            );
        },
        "parse negative numbers",
    );
    pr(
        2,
        "hex",
        &|| {
            write(
                dir,
                "src/lib.rs",
                &read("src/lib.rs").replace(
                    "#[cfg(test)]",
                    "/// A hexadecimal number after `0x`.\npub fn parse_hex(s: &str) -> Option<i64> {\n    i64::from_str_radix(s.strip_prefix(\"0x\")?, 16).ok()\n}\n\n#[cfg(test)]",
                ),
            );
            write(
                dir,
                "src/tests.rs",
                &format!(
                    "{}\n#[test]\nfn hex() {{\n    assert_eq!(parse_hex(\"0x1f\"), Some(31));\n}}\n",
                    read("src/tests.rs")
                ),
            );
        },
        "parse hexadecimal numbers",
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn rust_prs_verify_per_test_and_evaluate_grades_them_offline() {
    if !can_verify() {
        return;
    }
    if swelake::verify::sandbox::which("cargo").is_none() {
        eprintln!("skipping: cargo is not on PATH");
        return;
    }
    let fx = Fixture::new("acme/numparse", make_rust_repo, true);
    let out = swelake(&[&["run", "verify"][..], &fx.common()].concat(), &[]);
    assert!(out.contains("status:verified: 2"), "{out}");
    let lake = Lake::open(&fx.lake).unwrap();
    let ctx = lake.session().await.unwrap();
    let v: Vec<Verdict> = verdicts(&ctx).await;
    // An integration test target by name: the new test fails before, the old one passes.
    assert_eq!(v[0].fail_to_pass, ["api::negative"], "{v:#?}");
    assert_eq!(v[0].pass_to_pass, ["api::public_parse"], "{v:#?}");
    // The unit tests of src/tests.rs by their module path: the module does not compile on the
    // merge base (parse_hex is the fix), so its tests are absent before and pass after.
    assert_eq!(v[1].fail_to_pass, ["numparse::tests::digits", "numparse::tests::empty", "numparse::tests::hex"]);
    assert!(v[1].pass_to_pass.is_empty(), "{v:#?}");
    assert_eq!(v[0].env_key, v[1].env_key, "one lock, one environment");
    let envs: Vec<(String, String, String, Vec<String>)> = swelake::query::rows(
        &ctx,
        "SELECT language, status, resolved_as_of, relaxed FROM environments ORDER BY env_key",
    )
    .await
    .unwrap();
    assert_eq!(envs.len(), 1, "{envs:?}");
    assert_eq!((envs[0].0.as_str(), envs[0].1.as_str()), ("rust", "ready"), "{envs:?}");
    assert_eq!(envs[0].2, "Cargo.lock (committed)");

    // evaluate through the same path: gold patches resolve, an empty one does not.
    let export = fx.dir.path().join("swebench");
    swelake(
        &["export", "--lake", &fx.lake, "--format", "swebench", "--verified-only", "--out", export.to_str().unwrap()],
        &[],
    );
    let mut instances: Vec<serde_json::Value> = Vec::new();
    for split in ["train", "test"] {
        let text = std::fs::read_to_string(export.join(format!("{split}.jsonl"))).unwrap_or_default();
        instances.extend(text.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()));
    }
    let ids: Vec<&str> = instances.iter().map(|i| i["instance_id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["acme__numparse-1", "acme__numparse-2"]);
    assert_eq!(instances[0]["FAIL_TO_PASS"], "[\"api::negative\"]");
    let line = |id: &str, patch: &str| {
        serde_json::json!({"instance_id": id, "model_name_or_path": "m", "model_patch": patch}).to_string() + "\n"
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let secret = fx.dir.path().join("lake-secret.txt");
    std::fs::write(&secret, "RUST-SECRET-5f1c").unwrap();
    // A file in the host's home (its directories above the toolchain are there in the sandbox,
    // as mount points, with none of the home's own files).
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let in_home = PathBuf::from(&home).join(format!(".swelake-rust-probe-{}", std::process::id()));
    let _planted = Planted::new(in_home.clone(), "RUST-HOME-SECRET-7d2e");
    // The gold fix, plus a build script that tries the network, the host's home and a file
    // outside its tree, and leaves what it got in its tree.
    let build_rs = format!(
        "fn main() {{\n    let mut found = Vec::new();\n    let addr = \"127.0.0.1:{port}\".parse().unwrap();\n    match std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(2)) {{\n        Ok(_) => found.push(\"tcp\".to_string()),\n        Err(e) => found.push(format!(\"no tcp: {{e}}\")),\n    }}\n    match std::fs::read_to_string({in_home:?}) {{\n        Ok(t) => found.push(format!(\"LEAKED home: {{t}}\")),\n        Err(e) => found.push(format!(\"no home: {{e}}\")),\n    }}\n    match std::fs::read_to_string({secret:?}) {{\n        Ok(t) => found.push(format!(\"LEAKED {{t}}\")),\n        Err(e) => found.push(format!(\"no read: {{e}}\")),\n    }}\n    let dir = std::env::var(\"CARGO_MANIFEST_DIR\").unwrap();\n    std::fs::write(format!(\"{{dir}}/escape-report.txt\"), found.join(\"\\n\")).unwrap();\n}}\n"
    );
    let evil = format!(
        "{}diff --git a/build.rs b/build.rs\nnew file mode 100644\n--- /dev/null\n+++ b/build.rs\n@@ -0,0 +1,{} @@\n{}",
        instances[0]["patch"].as_str().unwrap(),
        build_rs.lines().count(),
        build_rs.lines().map(|l| format!("+{l}\n")).collect::<String>()
    );
    let preds = fx.dir.path().join("preds.jsonl");
    std::fs::write(
        &preds,
        line("acme__numparse-1", &evil) + &line("acme__numparse-2", instances[1]["patch"].as_str().unwrap()),
    )
    .unwrap();
    let report_path = fx.dir.path().join("eval/report.json");
    let eval = |p: &Path| {
        swelake(
            &[
                "evaluate",
                "--lake",
                &fx.lake,
                "--predictions",
                p.to_str().unwrap(),
                "--repo-url",
                &fx.url,
                "--cache-dir",
                &fx.cache,
                "--config",
                &fx.config,
                "--out",
                report_path.to_str().unwrap(),
            ],
            &[],
        );
        serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(&report_path).unwrap()).unwrap()
    };
    let report = eval(&preds);
    assert_eq!(report["resolved_ids"], serde_json::json!(["acme__numparse-1", "acme__numparse-2"]), "{report:#}");
    let seen =
        std::fs::read_to_string(fx.dir.path().join("eval/logs/acme__numparse-1/run/tree/escape-report.txt")).unwrap();
    assert!(seen.contains("no tcp") && seen.contains("no home") && seen.contains("no read"), "{seen}");
    assert!(!seen.contains("LEAKED"), "{seen}");
    let output = std::fs::read_to_string(fx.dir.path().join("eval/logs/acme__numparse-2/test_output.txt")).unwrap();
    assert!(output.contains("test tests::hex ... ok"), "{output}");
    assert!(matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock), "a connection came in");
    let empty = fx.dir.path().join("empty.jsonl");
    std::fs::write(&empty, line("acme__numparse-1", "") + &line("acme__numparse-2", "")).unwrap();
    let report = eval(&empty);
    assert_eq!(report["resolved_ids"], serde_json::json!([]), "{report:#}");
    assert_eq!(report["empty_patch_ids"], serde_json::json!(["acme__numparse-1", "acme__numparse-2"]), "{report:#}");
}
