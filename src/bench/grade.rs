//! `bench reward --execute`: gradings per second of the test reward on a lake's verified
//! instances — cold (each instance's first grading: its environment looked up, its base tree
//! written) and warm, for a GRPO group of 8 completions of one instance and a batch of 64 over
//! 16 instances. Each patch is the instance's gold patch with a file of its own added, so that
//! no two are the same (a repeated patch is answered from the grader's cache, not run).

use std::time::Instant;

use anyhow::{bail, Result};

use crate::git::Mirrors;
use crate::lake::Lake;
use crate::verify::grade::Grader;
use crate::verify::VerifyConfig;

#[derive(Debug, Clone)]
pub struct GradeBenchOptions {
    pub lake: String,
    pub mirrors: Mirrors,
    pub cfg: VerifyConfig,
    /// Gradings at once (0: `[verify] jobs`, else the cores).
    pub jobs: usize,
}

/// The gold patch of an instance with `bench-K.txt` added: distinct text, the same verdict.
fn variant(gold: &str, k: usize) -> String {
    let mut p = gold.to_string();
    if !p.ends_with('\n') {
        p.push('\n');
    }
    p.push_str(&format!(
        "diff --git a/swelake-bench-{k}.txt b/swelake-bench-{k}.txt\nnew file mode 100644\n--- /dev/null\n+++ b/swelake-bench-{k}.txt\n@@ -0,0 +1 @@\n+{k}\n"
    ));
    p
}

struct Timed {
    n: usize,
    wall: f64,
    resolved: usize,
    graded_seconds: f64,
}

fn timed(g: &Grader, items: &[(String, String)]) -> Timed {
    let t0 = Instant::now();
    let out = g.grade_many(items);
    let wall = t0.elapsed().as_secs_f64();
    Timed {
        n: items.len(),
        wall,
        resolved: out.iter().filter(|o| o.outcome.resolved).count(),
        graded_seconds: out.iter().map(|o| o.outcome.seconds).sum(),
    }
}

pub async fn grade(a: &GradeBenchOptions) -> Result<()> {
    let lake = Lake::open(&a.lake)?;
    let gold: Vec<(String, String)> = crate::query::rows(
        &lake.session().await?,
        "SELECT instance_id, oracle_patch FROM rl_seed WHERE verified ORDER BY instance_id",
    )
    .await?;
    if gold.is_empty() {
        bail!("{}: no verified instance in rl_seed: run `swelake run verify` first", a.lake);
    }
    let grader = Grader::open(&lake, a.mirrors.clone(), a.cfg.clone(), a.jobs).await?;
    let jobs = grader.jobs();
    eprintln!("bench reward --execute: {} verified instance(s), {jobs} grading(s) at once", gold.len());
    let (cold, group, batch) = tokio::task::block_in_place(|| {
        let mut k = 0;
        let mut next = |id: &str, patch: &str| {
            k += 1;
            (id.to_string(), variant(patch, k))
        };
        let cold_items: Vec<_> = gold.iter().take(16).map(|(id, p)| next(id, p)).collect();
        let cold = timed(&grader, &cold_items);
        let group_items: Vec<_> = (0..8).map(|_| next(&gold[0].0, &gold[0].1)).collect();
        let group = timed(&grader, &group_items);
        let sixteen: Vec<&(String, String)> = gold.iter().cycle().take(16).collect();
        let batch_items: Vec<_> = (0..64).map(|i| next(&sixteen[i % 16].0, &sixteen[i % 16].1)).collect();
        let batch = timed(&grader, &batch_items);
        (cold, group, batch)
    });
    println!("| gradings ({jobs} at once) | n | wall s | gradings/s | s per grading (wall / n) | mean s of one grading | resolved |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (name, t) in [
        (format!("cold: first grading of {} instance(s)", cold.n), &cold),
        ("warm: a GRPO group, 8 completions of one instance".to_string(), &group),
        (format!("warm: a batch of 64 over {} instance(s)", gold.len().min(16)), &batch),
    ] {
        println!(
            "| {name} | {} | {:.1} | {:.2} | {:.2} | {:.2} | {}/{} |",
            t.n,
            t.wall,
            t.n as f64 / t.wall,
            t.wall / t.n as f64,
            t.graded_seconds / t.n as f64,
            t.resolved,
            t.n
        );
    }
    println!(
        "warm batch vs cold: {:.2}x gradings/s; aim: <= 1 s per grading warm (here {:.2} s)",
        (batch.n as f64 / batch.wall) / (cold.n as f64 / cold.wall),
        batch.wall / batch.n as f64
    );
    println!(
        "Docker per rollout: not measured (no Docker daemon on this machine); see docs/benchmarks.md for the cited figure"
    );
    Ok(())
}
