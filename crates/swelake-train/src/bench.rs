//! `swelake bench train`: tokens/s of one GRPO training step (forward, clipped objective,
//! entropy, backward, clipping, AdamW) for the tiny and the SmolLM2-135M shapes, next to the
//! same step in PyTorch (src/train/bench_step.py) when `torch` is importable.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use candle_core::{DType, Device};

use super::model::{Config, Model};
use super::optim::OptimConfig;
use super::tokenizer::ChatTokenizer;
use super::trainer::{Group, Seq, TrainConfig, Trainer};
use super::Policy;

#[derive(Debug, Clone)]
pub struct TrainBenchOptions {
    /// Sequences per step.
    pub batch: usize,
    /// Tokens per sequence (half prompt, half completion).
    pub seq_len: usize,
    /// Timed steps (after one warm-up step), at least.
    pub steps: usize,
    /// Keep stepping until this many seconds have passed (both sides): the tiny model's step
    /// takes milliseconds, and a few of them are too short to time on a shared machine.
    pub min_seconds: f64,
    /// Timing windows per side, alternating swelake and PyTorch; the best of each side is
    /// reported (this machine is shared: a window can land in a slow spell of either side).
    pub runs: usize,
    /// Model shapes to measure: tiny, smollm2 (random weights of SmolLM2-135M's shape).
    pub models: Vec<String>,
    /// Python interpreter for the PyTorch baseline.
    pub python: String,
}

impl Default for TrainBenchOptions {
    fn default() -> Self {
        TrainBenchOptions {
            batch: 4,
            seq_len: 256,
            steps: 3,
            min_seconds: 3.0,
            runs: 3,
            models: vec!["tiny".to_string(), "smollm2".to_string()],
            python: "python3".to_string(),
        }
    }
}

const SCRIPT: &str = include_str!("bench_step.py");

fn shape(name: &str) -> Result<Config> {
    Ok(match name {
        "tiny" => Config::tiny(259),
        // SmolLM2-135M-Instruct's dimensions (as read from its GGUF).
        "smollm2" => Config {
            vocab: 49152,
            dim: 576,
            layers: 30,
            heads: 9,
            kv_heads: 3,
            hidden: 1536,
            rope_theta: 100_000.0,
            eps: 1e-5,
            max_seq: 8192,
        },
        other => anyhow::bail!("unknown model shape {other:?} (tiny, smollm2)"),
    })
}

/// The Rust side: a trainer on random weights and one fixed batch, warmed up by one step.
struct Ours {
    trainer: Trainer,
    groups: Vec<Group>,
    /// Seconds of the untimed warm-up step (first touches of fresh optimiser state land there).
    first_step: f64,
    _dir: tempfile::TempDir,
}

impl Ours {
    fn new(cfg: &Config, a: &TrainBenchOptions) -> Result<Ours> {
        let mut cfg = cfg.clone();
        cfg.max_seq = cfg.max_seq.max(a.seq_len + 1);
        let model = Model::random(cfg.clone(), 0, &Device::Cpu, DType::F32)?;
        let policy = Policy { model, tokenizer: ChatTokenizer::bytes()? };
        let tc = TrainConfig {
            optim: OptimConfig { lr: 1e-5, ..Default::default() },
            groups_per_step: 1,
            micro_batch: a.batch,
            ..Default::default()
        };
        let dir = tempfile::tempdir()?;
        let mut trainer = Trainer::new(policy, tc, dir.path())?;
        let mut rng = swelake_core::rng::Rng::new(1);
        let half = a.seq_len / 2;
        let seqs = (0..a.batch)
            .map(|i| Seq {
                prompt: (0..a.seq_len + 1 - half).map(|_| (rng.next_u64() % cfg.vocab as u64) as u32).collect(),
                completion: (0..half).map(|_| (rng.next_u64() % cfg.vocab as u64) as u32).collect(),
                behavior: None,
                reward: if i % 2 == 0 { 1.0 } else { -1.0 },
                format_error: false,
                resolved: None,
            })
            .collect();
        let groups = vec![Group { id: "bench".into(), seqs }];
        let start = Instant::now();
        trainer.step(&groups)?;
        Ok(Ours { trainer, groups, first_step: start.elapsed().as_secs_f64(), _dir: dir })
    }

    /// Tokens/s over at least `steps` steps and `min_seconds`.
    fn window(&mut self, a: &TrainBenchOptions) -> Result<f64> {
        let start = Instant::now();
        let mut done = 0;
        while done < a.steps || start.elapsed().as_secs_f64() < a.min_seconds {
            self.trainer.step(&self.groups)?;
            done += 1;
        }
        let per_step = start.elapsed().as_secs_f64() / done as f64;
        Ok((a.batch * a.seq_len) as f64 / per_step)
    }
}

fn torch_importable(python: &str) -> bool {
    std::process::Command::new(python)
        .args(["-c", "import torch"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn torch_step(cfg: &Config, a: &TrainBenchOptions) -> Result<Option<f64>> {
    let dir = tempfile::tempdir()?;
    let script: PathBuf = dir.path().join("bench_step.py");
    std::fs::write(&script, SCRIPT)?;
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let arg = serde_json::json!({
        "vocab": cfg.vocab, "dim": cfg.dim, "layers": cfg.layers, "heads": cfg.heads, "kv_heads": cfg.kv_heads,
        "hidden": cfg.hidden, "rope_theta": cfg.rope_theta, "eps": cfg.eps, "batch": a.batch, "seq_len": a.seq_len,
        "steps": a.steps, "min_seconds": a.min_seconds, "threads": threads,
    });
    let out = std::process::Command::new(&a.python).arg(&script).arg(arg.to_string()).output()?;
    if !out.status.success() {
        anyhow::bail!("the PyTorch baseline failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let v: serde_json::Value = serde_json::from_slice(out.stdout.trim_ascii()).context("PyTorch baseline output")?;
    Ok(v["tokens_per_s"].as_f64())
}

pub fn run(a: &TrainBenchOptions) -> Result<()> {
    let kept = swelake_core::memory::keep_freed_memory();
    println!(
        "GRPO train step, batch {} x {} tokens, best of {} alternating windows of at least {} steps and {} s, {} threads, matmul kernels {}, freed memory {}",
        a.batch,
        a.seq_len,
        a.runs.max(1),
        a.steps,
        a.min_seconds,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        matmul_kernels(),
        if kept { "kept for reuse" } else { "returned to the OS (allocator default)" },
    );
    let torch = torch_importable(&a.python);
    let list = |v: &[f64]| v.iter().map(|x| format!("{x:.1}")).collect::<Vec<_>>().join(", ");
    for name in &a.models {
        let cfg = shape(name)?;
        let mut bench = Ours::new(&cfg, a)?;
        let (mut ours, mut base) = (Vec::new(), Vec::new());
        for _ in 0..a.runs.max(1) {
            ours.push(bench.window(a)?);
            if torch {
                base.extend(torch_step(&cfg, a)?);
            }
        }
        let best = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
        let o = best(&ours);
        if base.is_empty() {
            println!("{name:<8} swelake (candle) {o:>10.1} tokens/s   pytorch: not importable with {}", a.python);
        } else {
            let b = best(&base);
            println!(
                "{name:<8} swelake (candle) {o:>10.1} tokens/s   pytorch {b:>10.1} tokens/s   ratio {:.2}x",
                o / b
            );
        }
        println!(
            "         windows: swelake [{}]  pytorch [{}]; swelake's first (untimed) step {:.2} s",
            list(&ours),
            list(&base),
            bench.first_step
        );
    }
    Ok(())
}

fn matmul_kernels() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return "AVX-512";
        }
        if std::arch::is_x86_feature_detected!("fma") {
            return "AVX2/FMA";
        }
    }
    "portable"
}

#[derive(Debug, Clone)]
pub struct RolloutsBenchOptions {
    /// Rollout rows to synthesise.
    pub rows: usize,
    /// Completions per group.
    pub group_size: usize,
    /// Bytes of completion text per rollout (read by neither plan: projection skips it).
    pub completion_bytes: usize,
    /// Timed repetitions of each plan (the best is reported).
    pub repeat: usize,
    /// Where to write the synthetic files (a temporary directory when omitted).
    pub dir: Option<PathBuf>,
}

impl Default for RolloutsBenchOptions {
    fn default() -> Self {
        RolloutsBenchOptions { rows: 400_000, group_size: 8, completion_bytes: 1024, repeat: 3, dir: None }
    }
}

/// `swelake bench rollouts`: the rollout ⋈ seed join and group statistics with polars' lazy
/// Parquet scan against the `parquet` crate's reader and a hash join, on the same files.
pub fn rollouts(a: &RolloutsBenchOptions) -> Result<()> {
    use super::data::{write_rollouts, Rollout};
    use crate::group_stats::{group_stats, group_stats_arrow};

    let tmp = tempfile::tempdir()?;
    let dir = a.dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(dir.join("rollouts"))?;
    let groups = a.rows.div_ceil(a.group_size.max(1));
    let instances = groups.div_ceil(4).max(1);
    // Seed: one row per instance, with a prompt-sized text column the plans must not read.
    {
        use arrow::array::{RecordBatch, StringArray};
        let ids: Vec<String> = (0..instances).map(|i| format!("org{}/repo{}#{}", i % 97, i % 13, i)).collect();
        let splits: Vec<&str> = (0..instances).map(|i| if i % 10 == 0 { "test" } else { "train" }).collect();
        let filler = "x".repeat(4096);
        let batch = RecordBatch::try_from_iter([
            ("instance_id", std::sync::Arc::new(StringArray::from_iter_values(&ids)) as arrow::array::ArrayRef),
            ("split", std::sync::Arc::new(StringArray::from_iter_values(&splits))),
            ("problem_statement", std::sync::Arc::new(StringArray::from_iter_values(ids.iter().map(|_| &filler)))),
        ])?;
        let mut w = parquet::arrow::ArrowWriter::try_new(
            std::fs::File::create(dir.join("seed.parquet"))?,
            batch.schema(),
            None,
        )?;
        w.write(&batch)?;
        w.close()?;
    }
    let mut rng = swelake_core::rng::Rng::new(7);
    let text = "y".repeat(a.completion_bytes);
    let shard_rows = 100_000;
    let mut written = 0;
    let mut shard = 0;
    while written < a.rows {
        let n = shard_rows.min(a.rows - written);
        let rows: Vec<Rollout> = (written..written + n)
            .map(|r| {
                let g = r / a.group_size.max(1);
                // Every ~50th instance is not in the seed (a stale rollout file).
                let inst = g % instances;
                let id = if g % 50 == 49 {
                    format!("gone/repo#{g}")
                } else {
                    format!("org{}/repo{}#{}", inst % 97, inst % 13, inst)
                };
                Rollout {
                    instance_id: id,
                    group_id: format!("g{g:08}"),
                    sample_index: (r % a.group_size.max(1)) as i64,
                    completion: text.clone(),
                    reward: (!g.is_multiple_of(3)).then(|| (rng.next_u64() % 1000) as f64 / 1000.0),
                    ..Default::default()
                }
            })
            .collect();
        write_rollouts(&dir.join(format!("rollouts/part-{shard:05}.parquet")), &rows)?;
        written += n;
        shard += 1;
    }
    let rglob = format!("{}/rollouts/*.parquet", dir.display());
    let sglob = format!("{}/seed.parquet", dir.display());
    let bytes: u64 =
        std::fs::read_dir(dir.join("rollouts"))?.filter_map(|e| e.ok()?.metadata().ok()).map(|m| m.len()).sum();
    println!(
        "rollouts: {} rows in {groups} groups over {instances} seed instances, {shard} files, {:.1} MB",
        a.rows,
        bytes as f64 / 1e6
    );
    let time = |f: &dyn Fn() -> Result<Vec<crate::group_stats::GroupStat>>| -> Result<(f64, Vec<crate::group_stats::GroupStat>)> {
        let mut best = f64::INFINITY;
        let mut out = Vec::new();
        for _ in 0..a.repeat.max(1) {
            let t = Instant::now();
            out = f()?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        Ok((best, out))
    };
    let (tp, p) = time(&|| group_stats(&rglob, Some(&sglob)))?;
    let (ta, b) = time(&|| group_stats_arrow(&rglob, &sglob))?;
    let same = p.len() == b.len()
        && p.iter().zip(&b).all(|(x, y)| {
            let close = |u: Option<f64>, v: Option<f64>| match (u, v) {
                (Some(u), Some(v)) => (u - v).abs() <= 1e-9 * (1.0 + u.abs()) || (u.is_nan() && v.is_nan()),
                (u, v) => u.is_none() && v.is_none(),
            };
            (&x.group_id, &x.instance_id, x.rollouts, x.unknown, x.scored, &x.split)
                == (&y.group_id, &y.instance_id, y.rollouts, y.unknown, y.scored, &y.split)
                && close(x.reward_mean, y.reward_mean)
                && close(x.reward_std, y.reward_std)
        });
    // polars sizes its pool from POLARS_MAX_THREADS, else from the cores.
    let threads = std::env::var("POLARS_MAX_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    println!(
        "polars lazy scan ⋈ group_by : {:>8.3} s  {:>10.0} rows/s ({threads} threads; POLARS_MAX_THREADS=1 for one)",
        tp,
        a.rows as f64 / tp
    );
    println!("parquet reader + hash join   : {:>8.3} s  {:>10.0} rows/s (1 thread)", ta, a.rows as f64 / ta);
    println!("ratio polars / parquet crate : {:.2}x   results identical: {same}", ta / tp);
    if !same {
        anyhow::bail!("the two plans disagree");
    }
    Ok(())
}
