//! Rewards that run the tests: rollouts scored by `swelake reward --mode`, online training and
//! eval graded through the same grader, and the grading service called by the Python package
//! the way verl and TRL call a reward function. On acme/calc (made in `verify.rs`): PRs 1 and
//! 4 verify, 2 and 3 do not.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use arrow::array::{Array, AsArray};
use swelake::train::data::{write_rollouts, Rollout};

use crate::verify::{can_verify, make_repo, swelake, Fixture};

/// A SWE-RL answer with one search/replace edit of `path`.
fn answer(path: &str, search: &str, replace: &str) -> String {
    format!(
        "<think>\nLook at {path}.\n</think>\n<solution>\n```python\n### {path}\n<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n```\n</solution>"
    )
}

const MEAN: &str = "def mean(xs):\n    return sum(xs) / len(xs)";
const MEAN_FIXED: &str = "def mean(xs):\n    if not xs:\n        return 0.0\n    return sum(xs) / len(xs)";

/// The fix of PR 1 as a unified diff, in a fenced block of an answer.
const FIX_DIFF: &str = "Here it is:\n```diff\ndiff --git a/src/calc/__init__.py b/src/calc/__init__.py\n--- a/src/calc/__init__.py\n+++ b/src/calc/__init__.py\n@@ -1,4 +1,6 @@\n def mean(xs):\n+    if not xs:\n+        return 0.0\n     return sum(xs) / len(xs)\n \n \n```\n";

/// The first record batch of a Parquet file.
fn first_batch(path: &std::path::Path) -> arrow::array::RecordBatch {
    let f = std::fs::File::open(path).unwrap();
    parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
        .unwrap()
        .build()
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
}

fn rollout(id: &str, group: &str, k: i64, completion: &str) -> Rollout {
    Rollout {
        instance_id: id.into(),
        group_id: group.into(),
        sample_index: k,
        completion: completion.into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn rewards_run_the_tests_for_rollouts_training_eval_and_the_grading_service() {
    if !can_verify() {
        return;
    }
    let fx = Fixture::new("acme/calc", make_repo, false);
    let common = fx.common();
    let out = swelake(&[&["run", "verify"][..], &common].concat(), &[]);
    assert!(out.contains("status:verified: 2"), "{out}");
    let dir = fx.dir.path();
    let grade_flags =
        ["--lake", fx.lake.as_str(), "--repo-url", &fx.url, "--cache-dir", &fx.cache, "--config", &fx.config];

    // Rollouts of every kind the modes tell apart.
    let wrong_fix = answer(
        "src/calc/__init__.py",
        MEAN,
        "def mean(xs):\n    if not xs:\n        return None\n    return sum(xs) / len(xs)",
    );
    let tests_only = answer(
        "tests/test_calc.py",
        "def test_double():",
        "def test_mean_empty():\n    assert mean([]) == 0.0\n\n\ndef test_double():",
    );
    let garbage = "diff --git a/nowhere.py b/nowhere.py\n--- a/nowhere.py\n+++ b/nowhere.py\n@@ -3,2 +3,2 @@\n-x\n+y\n";
    let gold = answer("src/calc/__init__.py", MEAN, MEAN_FIXED);
    let rows = vec![
        rollout("acme/calc#1", "g1", 0, &gold),
        rollout("acme/calc#1", "g1", 1, FIX_DIFF),
        rollout("acme/calc#1", "g1", 2, ""),
        rollout("acme/calc#1", "g1", 3, &wrong_fix),
        rollout("acme/calc#1", "g1", 4, &tests_only),
        rollout("acme/calc#4", "g4", 0, garbage),
        // The same patch again: answered from the cache of graded patches.
        rollout("acme/calc#1", "g1b", 0, &gold),
    ];
    let input = dir.join("rollouts/part-00000.parquet");
    write_rollouts(&input, &rows).unwrap();
    let scored_dir = dir.join("scored");
    let out = swelake(
        &[
            &[
                "reward",
                "--rollouts",
                input.to_str().unwrap(),
                "--mode",
                "hybrid",
                "--out",
                scored_dir.to_str().unwrap(),
            ][..],
            &grade_flags,
        ]
        .concat(),
        &[],
    );
    let summary: serde_json::Value = serde_json::from_str(out.lines().find(|l| l.starts_with('{')).unwrap()).unwrap();
    assert_eq!(summary["mode"], "hybrid", "{out}");
    assert_eq!((summary["rows"].as_u64(), summary["unscoreable"].as_u64()), (Some(7), Some(0)), "{out}");
    let f = std::fs::File::open(scored_dir.join("part-00000.parquet")).unwrap();
    let batches: Vec<_> = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
        .unwrap()
        .build()
        .unwrap()
        .map(|b| b.unwrap())
        .collect();
    let b = arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap();
    let doc = swelake::schema::load("rollouts").unwrap();
    // The columns reward writes match the contract (the generator's own pass through as they
    // came: swelake's writes sample_index as long and token ids as uint32).
    let errs: Vec<String> = swelake::schema::diff_open(&doc, &b.schema())
        .into_iter()
        .filter(|e| !e.starts_with("sample_index:") && !e.starts_with("completion_ids:"))
        .collect();
    assert!(errs.is_empty(), "{errs:?}");
    let f64s = |c: &str| -> Vec<Option<f64>> {
        let a = b.column_by_name(c).unwrap().as_primitive::<arrow::datatypes::Float64Type>();
        (0..a.len()).map(|i| (!a.is_null(i)).then(|| a.value(i))).collect()
    };
    let strs = |c: &str| -> Vec<Option<String>> {
        let a = b.column_by_name(c).unwrap().as_string::<i32>();
        (0..a.len()).map(|i| (!a.is_null(i)).then(|| a.value(i).to_string())).collect()
    };
    let (reward, sim, tests, hybrid, similarity) =
        (f64s("reward"), f64s("reward_similarity"), f64s("reward_tests"), f64s("reward_hybrid"), f64s("similarity"));
    let status = strs("grade_status");
    let resolved = b.column_by_name("resolved").unwrap().as_boolean().clone();
    let f2p = b.column_by_name("f2p_passed").unwrap().as_primitive::<arrow::datatypes::Int64Type>().clone();
    let p2p = b.column_by_name("p2p_passed").unwrap().as_primitive::<arrow::datatypes::Int64Type>().clone();
    // The gold fix: resolved, 1 in the test modes; its similarity is 0.5, the reference's mean
    // over the PR's two changed files (the oracle has the PR's test file too, the answer not).
    assert_eq!((sim[0], tests[0], hybrid[0], reward[0]), (Some(0.5), Some(1.0), Some(1.0), Some(1.0)));
    assert!(resolved.value(0));
    // A diff answer: malformed to the reference (-1), resolved by the tests.
    assert_eq!((sim[1], tests[1], hybrid[1]), (Some(-1.0), Some(1.0), Some(1.0)));
    assert!(strs("predicted_patch")[1].as_deref().unwrap().starts_with("diff --git a/src/calc/__init__.py"));
    // Empty: -1 in every mode, never graded.
    assert_eq!((sim[2], tests[2], hybrid[2]), (Some(-1.0), Some(-1.0), Some(-1.0)));
    assert!(resolved.is_null(2) && status[2].is_none());
    // A wrong fix: applies, FAIL_TO_PASS fails, PASS_TO_PASS pass; hybrid is a quarter of its
    // similarity (no FAIL_TO_PASS passed).
    assert_eq!((tests[3], resolved.value(3), f2p.value(3), p2p.value(3)), (Some(0.0), false, 0, 2));
    assert!(sim[3].unwrap() > 0.0 && sim[3].unwrap() < 1.0);
    assert_eq!(hybrid[3], Some(similarity[3].unwrap() / 4.0));
    // Only the tests changed: the PR's test files are put back over them, unresolved.
    assert_eq!((tests[4], resolved.value(4)), (Some(0.0), false));
    assert_eq!(status[4].as_deref(), Some("unresolved"));
    // A diff that does not apply: 0, with the reason.
    assert_eq!((tests[5], hybrid[5], status[5].as_deref()), (Some(0.0), Some(0.0), Some("patch_failed")));
    assert!(strs("grade_reason")[5].as_deref().unwrap().contains("does not apply"), "{:?}", strs("grade_reason")[5]);
    // The repeated gold patch: the same grade, from the cache.
    assert_eq!((tests[6], f64s("grade_seconds")[6]), (Some(1.0), Some(0.0)));
    assert!(f64s("grade_seconds")[0].unwrap() > 0.0);

    // evaluate agrees on every graded patch.
    let patches = strs("predicted_patch");
    for (i, want) in [(0, true), (3, false), (4, false)] {
        let preds = dir.join(format!("preds-{i}.jsonl"));
        let line = serde_json::json!({"instance_id": "acme__calc-1", "model_patch": patches[i].clone().unwrap()});
        std::fs::write(&preds, format!("{line}\n")).unwrap();
        let report = dir.join(format!("eval-{i}/report.json"));
        swelake(
            &[
                &["evaluate", "--predictions", preds.to_str().unwrap(), "--out", report.to_str().unwrap()][..],
                &grade_flags,
            ]
            .concat(),
            &[],
        );
        let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        assert_eq!(r["resolved_instances"] == 1, want, "row {i}: {r:#}");
        assert_eq!(resolved.value(i), want);
    }

    // A mode that runs tests without a lake is refused; an instance the lake did not verify
    // is not graded (reward NULL, the reason, exit status 1), nothing dropped.
    let only = dir.join("unverified.parquet");
    write_rollouts(&only, &[rollout("acme/calc#3", "g3", 0, FIX_DIFF)]).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_swelake"))
        .args(["reward", "--rollouts", only.to_str().unwrap(), "--mode", "tests", "--out"])
        .arg(dir.join("x"))
        .output()
        .unwrap();
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("--lake"));
    let o = Command::new(env!("CARGO_BIN_EXE_swelake"))
        .args(["reward", "--rollouts", only.to_str().unwrap(), "--mode", "tests", "--out"])
        .arg(dir.join("unverified-out.parquet"))
        .args(grade_flags)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", String::from_utf8_lossy(&o.stderr));
    let b3 = first_batch(&dir.join("unverified-out.parquet"));
    assert!(b3.column_by_name("reward").unwrap().is_null(0));
    assert!(b3.column_by_name("reward_error").unwrap().as_string::<i32>().value(0).contains("not a verified instance"));

    // Online training with the hybrid reward: metrics carry the graded share and resolved
    // rate per step, and the same seed gives the same metrics.
    let train = |name: &str| -> Vec<serde_json::Value> {
        let out_dir = dir.join(name);
        swelake(
            &[
                &[
                    "train",
                    "--online",
                    "--reward",
                    "hybrid",
                    "--model",
                    "tiny",
                    "--steps",
                    "2",
                    "--group-size",
                    "2",
                    "--groups-per-step",
                    "1",
                    "--max-new-tokens",
                    "8",
                    "--split",
                    "",
                    "--seed",
                    "7",
                    "--out",
                    out_dir.to_str().unwrap(),
                ][..],
                &grade_flags,
            ]
            .concat(),
            &[],
        );
        let b = first_batch(&out_dir.join("metrics.parquet"));
        assert!(b.column_by_name("resolved_rate").is_some() && b.column_by_name("graded").is_some());
        let mut rows = Vec::new();
        for i in 0..b.num_rows() {
            let mut row = serde_json::Map::new();
            for (k, field) in b.schema().fields().iter().enumerate() {
                // Wall-clock figures differ run to run; everything else must not.
                if ["train_s", "generate_s", "tokens_per_s"].contains(&field.name().as_str()) {
                    continue;
                }
                let v = arrow::util::display::array_value_to_string(b.column(k), i).unwrap();
                row.insert(field.name().clone(), serde_json::json!(v));
            }
            rows.push(serde_json::Value::Object(row));
        }
        rows
    };
    let (m1, m2) = (train("run1"), train("run2"));
    assert_eq!(m1.len(), 2);
    assert_eq!(m1, m2, "the same seed gave different metrics");
    let step_rollouts = dir.join("run1/rollouts/step-000000.parquet");
    let sb = first_batch(&step_rollouts);
    let modes = sb.column_by_name("reward_mode").unwrap().as_string::<i32>();
    assert!((0..modes.len()).all(|i| modes.value(i) == "hybrid"));

    // eval grades another engine's answers through the same grader: resolved rate beside.
    let report = dir.join("eval.json");
    swelake(
        &[
            &["eval", "--rollouts", input.to_str().unwrap(), "--split", "", "--json", report.to_str().unwrap()][..],
            &grade_flags,
        ]
        .concat(),
        &[],
    );
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    // Resolved: the gold answer twice and the diff answer, of 7.
    assert_eq!(r["overall"]["resolved_rate"].as_f64(), Some(3.0 / 7.0), "{r:#}");

    // The grading service, called by the Python package as verl and TRL call a reward function.
    let Some(py) = crate::python::python() else { return };
    let token = format!("tok-{}-{}", std::process::id(), uuid::Uuid::new_v4().simple());
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let planted = std::path::PathBuf::from(&home).join(format!(".swelake-grader-token-{}", std::process::id()));
    std::fs::write(&planted, &token).unwrap();
    std::fs::set_permissions(&planted, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let mut server = Command::new(env!("CARGO_BIN_EXE_swelake"))
        .args(["grade-server", "--bind", "127.0.0.1:0", "--max-patch-bytes", "64KiB"])
        .args(grade_flags)
        .env("SWELAKE_GRADER_TOKEN", &token)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stderr.take().unwrap()).lines();
    let url = loop {
        let l = lines.next().expect("grade-server ended before listening").unwrap();
        if let Some(rest) = l.strip_prefix("grade-server: http://") {
            break format!("http://{}", rest.split('/').next().unwrap());
        }
    };
    std::thread::spawn(move || for _ in lines {});
    let port = url.rsplit(':').next().unwrap().to_string();
    // Resolved only if it got something out: a connection to the service, the token file in
    // the host's home, the token in any process's environment or its own.
    let leak = answer(
        "src/calc/__init__.py",
        MEAN,
        &format!(
            "def _leaked():\n    import os, socket\n    got = []\n    try:\n        socket.create_connection((\"127.0.0.1\", {port}), timeout=2)\n        got.append(\"tcp\")\n    except OSError:\n        pass\n    try:\n        got.append(open({planted:?}).read())\n    except OSError:\n        pass\n    for pid in os.listdir(\"/proc\"):\n        try:\n            if b\"SWELAKE_GRADER_TOKEN\" in open(\"/proc/%s/environ\" % pid, \"rb\").read():\n                got.append(pid)\n        except OSError:\n            pass\n    if os.environ.get(\"SWELAKE_GRADER_TOKEN\"):\n        got.append(\"env\")\n    return got\n\n\ndef mean(xs):\n    if not xs:\n        return 0.0 if _leaked() else 1.0\n    return sum(xs) / len(xs)"
        ),
    );
    let big = format!(
        "diff --git a/big.txt b/big.txt\nnew file mode 100644\n--- /dev/null\n+++ b/big.txt\n@@ -0,0 +1,4000 @@\n{}",
        "+0123456789abcdef\n".repeat(4000)
    );
    let payload = serde_json::json!({
        "items": [
            {"completion": gold, "extra_info": {"repo_name": "acme/calc", "pr_number": 1}, "instance_id": "acme/calc#1"},
            {"completion": leak, "extra_info": {"repo_name": "acme/calc", "pr_number": 1}, "instance_id": "acme/calc#1"},
            {"completion": FIX_DIFF, "extra_info": {"repo_name": "acme/calc", "pr_number": 3}, "instance_id": "acme/calc#3"},
            {"completion": big, "extra_info": {"repo_name": "acme/calc", "pr_number": 4}, "instance_id": "acme/calc#4"},
        ]
    });
    let payload_file = dir.join("payload.json");
    std::fs::write(&payload_file, payload.to_string()).unwrap();
    let out = crate::python::script(
        &py,
        "grade_service.py",
        &[payload_file.to_str().unwrap()],
        &[("SWELAKE_GRADER_URL", &url), ("SWELAKE_GRADER_TOKEN", &token)],
    );
    // Stopped as a service manager stops it: it ends by itself.
    let _ = Command::new("kill").args(["-TERM", &server.id().to_string()]).status();
    let status = server.wait().unwrap();
    assert!(status.success(), "grade-server on SIGTERM: {status}");
    let _ = std::fs::remove_file(&planted);
    assert!(!out.contains(&token), "the token came back: {out}");
    let got: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    for how in ["verl", "verl_batch"] {
        let r = &got[how];
        assert_eq!(r[0]["score"], 1.0, "{how}: {r:#}");
        assert_eq!(r[0]["resolved"], true, "{how}: {r:#}");
        assert_eq!(r[1]["resolved"], false, "{how}: the sandboxed patch got something out: {r:#}");
        assert_eq!(r[1]["f2p_passed"], 0, "{how}: {r:#}");
        assert_eq!(r[2]["score"], 0.0, "{how}: {r:#}");
        assert!(r[2]["error"].as_str().unwrap().contains("not a verified instance"), "{how}: {r:#}");
        assert!(r[3]["error"].as_str().unwrap().contains("over the limit"), "{how}: {r:#}");
    }
    // TRL's reward_funcs: one value per completion, None where the service could not grade.
    assert_eq!(got["trl"], serde_json::json!([1.0, 0.0, null, null]), "{got:#}");
    assert_eq!(got["unauthorized"], 401, "{got:#}");
}
