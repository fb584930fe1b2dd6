//! GRPO training: learning on CPU with a learnable reward, the Parquet pipeline (generate →
//! train with rewards computed from the seed shards → resume → eval) through the CLI, and
//! SmolLM2 loaded from its GGUF.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use candle_core::{Device, Tensor};
use swelake::train::data::{self, Rollout};
use swelake::train::generate::{gather_logprobs, Sampling};
use swelake::train::grpo::Objective;
use swelake::train::optim::OptimConfig;
use swelake::train::tokenizer::Message;
use swelake::train::trainer::{TrainConfig, Trainer};
use swelake::train::Policy;

/// Share of lowercase ASCII letters in a completion: ~10% for a random byte-level policy,
/// 1.0 when it has learnt to answer in letters only.
fn letters(items: &[(String, String)]) -> Vec<swelake::train::reward::Scored> {
    items
        .iter()
        .map(|(_, completion)| {
            let n = completion.chars().count().max(1);
            let share = completion.chars().filter(|c| c.is_ascii_lowercase()).count() as f64 / n as f64;
            swelake::train::reward::Scored { reward: Some(share), ..Default::default() }
        })
        .collect()
}

#[test]
fn grpo_learns_a_learnable_reward_on_cpu_across_seeds() {
    for seed in [1u64, 2, 3] {
        let dir = tempfile::tempdir().unwrap();
        let policy = Policy::load("tiny", &Device::Cpu, seed, 128).unwrap();
        let cfg = TrainConfig {
            objective: Objective { beta: 0.01, norm_len: 8, ..Default::default() },
            optim: OptimConfig { lr: 3e-3, warmup_steps: 2, total_steps: 30, min_lr_ratio: 0.1, ..Default::default() },
            groups_per_step: 4,
            group_size: 8,
            micro_batch: 16,
            seed,
            steps: 30,
            sampling: Sampling { temperature: 1.0, top_p: 1.0, max_new_tokens: 8 },
            ..Default::default()
        };
        let mut t = Trainer::new(policy, cfg, dir.path()).unwrap();
        let prompts: Vec<(String, String)> = ["Spell a word.", "Name an animal.", "Say hello.", "Write a letter."]
            .iter()
            .enumerate()
            .map(|(i, p)| (format!("toy#{i}"), t.policy.tokenizer.render_chat(&[Message::new("user", p)], true)))
            .collect();
        for _ in 0..30 {
            let (groups, _) = t.sample_groups(&prompts, &letters, "letters").unwrap();
            t.step(&groups).unwrap();
        }
        let r: Vec<f64> = t.metrics.iter().map(|m| m.reward_mean).collect();
        let start = r[..3].iter().sum::<f64>() / 3.0;
        let end = r[r.len() - 3..].iter().sum::<f64>() / 3.0;
        eprintln!("seed {seed}: mean reward of the first 3 steps {start:.3}, of the last 3 {end:.3}");
        assert!(end > start + 0.3, "seed {seed}: reward {start:.3} -> {end:.3}: {r:?}");
        // The KL to the reference grows from zero as the policy moves.
        assert_eq!(t.metrics[0].kl, 0.0);
        assert!(t.metrics.last().unwrap().kl > 0.0);
    }
}

fn swelake(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_swelake")).args(args).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "swelake {args:?} failed:\n{text}");
    text
}

fn swelake_fails(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_swelake")).args(args).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "swelake {args:?} succeeded:\n{text}");
    text
}

/// Sum of log-probabilities of `completion` after the chat prompt of `messages`.
fn sequence_logprob(policy: &Policy, messages: &[Message], completion: &str) -> f64 {
    let tok = &policy.tokenizer;
    let prompt = tok.encode(&tok.render_chat(messages, true)).unwrap();
    let mut comp = tok.encode(completion).unwrap();
    comp.push(tok.eos_id());
    let full: Vec<u32> = prompt.iter().chain(comp.iter()).copied().collect();
    let t = Tensor::new(full.as_slice(), &Device::Cpu).unwrap().unsqueeze(0).unwrap();
    let n = full.len() - 1;
    let logits = policy.model.forward(&t.narrow(1, 0, n).unwrap(), 0, None).unwrap();
    let lp = gather_logprobs(&logits, &t.narrow(1, 1, n).unwrap()).unwrap();
    lp.narrow(1, prompt.len() - 1, comp.len()).unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap() as f64
}

#[tokio::test(flavor = "multi_thread")]
async fn generate_train_resume_and_eval_from_parquet() {
    let dir = tempfile::tempdir().unwrap();
    let (lake, _) = crate::curation::sample_lake(dir.path(), None).await;
    let shards = format!("{}/shards/seed/*.parquet", lake.local_root().unwrap().display());
    let seed = data::read_seed(&shards, None).unwrap();
    assert_eq!(seed.len(), 3);
    let d = |p: &str| dir.path().join(p).to_string_lossy().into_owned();
    let common = ["--model", "tiny-bpe", "--max-seq", "4096", "--max-new-tokens", "12"];

    // Sampling with the policy writes a rollout table.
    let mut args = vec!["generate", "--seed-shards", &shards, "--group-size", "3", "--split", "", "--out"];
    let out = d("rollouts");
    args.push(&out);
    args.extend(common);
    swelake(&args);
    let sampled = data::read_rollouts(&format!("{out}/*.parquet")).unwrap();
    assert_eq!(sampled.len(), 9);
    assert!(sampled
        .iter()
        .all(|r| r.completion_ids.as_ref().unwrap().len() == r.behavior_logprobs.as_ref().unwrap().len()));

    // Rollouts of another engine: text only, no rewards. Per instance the oracle answer
    // (SEARCH/REPLACE built from the patch) and a malformed one.
    let shard =
        std::fs::read_dir(lake.local_root().unwrap().join("shards/seed")).unwrap().next().unwrap().unwrap().path();
    let patches = oracle_patches(&shard);
    let mut other = Vec::new();
    for inst in &seed {
        for (k, completion) in [
            crate::curation::edits_from_patch(&patches[&inst.instance_id], &inst.context, &inst.oracle),
            "no tags here".to_string(),
        ]
        .into_iter()
        .enumerate()
        {
            other.push(Rollout {
                instance_id: inst.instance_id.clone(),
                group_id: format!("{}/engine", inst.instance_id),
                sample_index: k as i64,
                completion,
                ..Default::default()
            });
        }
    }
    data::write_rollouts(Path::new(&format!("{out}/part-00001.parquet")), &other).unwrap();

    // The polars plan (rollouts ⋈ seed, per-group statistics) over the real seed shards, checked
    // against what was written and against the parquet-crate implementation.
    let all = format!("{out}/*.parquet");
    let stats = swelake::train::group_stats::group_stats(&all, Some(&shards)).unwrap();
    let baseline = swelake::train::group_stats::group_stats_arrow(&all, &shards).unwrap();
    assert_eq!(stats.len(), 6);
    assert_eq!(stats.len(), baseline.len());
    for (p, b) in stats.iter().zip(&baseline) {
        let inst = seed.iter().find(|i| i.instance_id == p.instance_id).unwrap();
        assert_eq!(p.split.as_deref(), Some(inst.split.as_str()));
        assert_eq!((p.instances, p.unknown), (1, 0));
        if p.group_id.ends_with("/engine") {
            assert_eq!((p.rollouts, p.scored, p.reward_mean), (2, 0, None));
        } else {
            let rewards: Vec<f64> =
                sampled.iter().filter(|r| r.group_id == p.group_id).map(|r| r.reward.unwrap()).collect();
            assert_eq!((p.rollouts, p.scored), (3, 3));
            let mean = rewards.iter().sum::<f64>() / 3.0;
            assert!((p.reward_mean.unwrap() - mean).abs() < 1e-12);
            assert_eq!(p.reward_max, rewards.iter().copied().reduce(f64::max));
        }
        assert_eq!(
            (&p.group_id, &p.instance_id, p.rollouts, p.scored, &p.split),
            (&b.group_id, &b.instance_id, b.rollouts, b.scored, &b.split)
        );
        assert_eq!(p.reward_mean.is_some(), b.reward_mean.is_some());
        assert!((p.reward_std.unwrap_or(0.0) - b.reward_std.unwrap_or(0.0)).abs() < 1e-12);
    }

    let before = Policy::load("tiny-bpe", &Device::Cpu, 0, 4096).unwrap();
    let run = d("run");
    let rollouts = format!("{out}/*.parquet");
    let train = |run: &str, steps: &str, extra: &[&str]| {
        let mut a = vec!["train", "--rollouts", &rollouts, "--seed-shards", &shards, "--out", run, "--steps", steps];
        a.extend([
            "--groups-per-step",
            "6",
            "--micro-batch",
            "2",
            "--lr",
            "1e-3",
            "--beta",
            "0.05",
            "--save-every",
            "2",
        ]);
        a.extend(common);
        a.extend(extra);
        swelake(&a)
    };
    // The default split leaves the test instances' groups out, before anything is scored.
    let only_train = train(&d("run-train-split"), "1", &[]);
    assert!(only_train.contains("groups per split {\"test\": 4, \"train\": 2}"), "{only_train}");
    assert!(only_train.contains("2 scored here"), "{only_train}");
    // Rollouts that carry their prompt and reward (the sampled ones) train without the seed
    // shards, and say that splits go unchecked; rollouts without them (the engine's) cannot.
    let sampled_only = format!("{out}/part-00000.parquet");
    let alone = swelake(
        &[&["train", "--rollouts", &sampled_only, "--out", &d("run-no-seed"), "--steps", "1"][..], &common[..]]
            .concat(),
    );
    assert!(alone.contains("splits are not checked") && alone.contains("trained 1 steps"), "{alone}");
    let engine_only = format!("{out}/part-00001.parquet");
    let refused = swelake_fails(
        &[&["train", "--rollouts", &engine_only, "--out", &d("run-no-seed-2"), "--steps", "1"][..], &common[..]]
            .concat(),
    );
    assert!(refused.contains("6 rollout(s) without a reward") && refused.contains("give the seed shards"), "{refused}");
    let first = train(&run, "2", &["--split", ""]);
    assert!(first.contains("6 scored here, 0 could not be scored"), "{first}");
    let resumed = train(&run, "3", &["--resume", "--split", ""]);
    assert!(resumed.contains("resumed at step 2"), "{resumed}");
    let ckpt = Path::new(&run).join("checkpoints/step-000003");
    assert!(ckpt.join("model.safetensors").exists() && ckpt.join("optimizer.safetensors").exists());
    assert_eq!(std::fs::read_to_string(Path::new(&run).join("checkpoints/latest")).unwrap(), "step-000003");
    let metrics = swelake::train::trainer::read_metrics(&Path::new(&run).join("metrics.parquet")).unwrap();
    assert_eq!(metrics.iter().map(|m| m.step).collect::<Vec<_>>(), vec![0, 1, 2]);
    // Every step sees all 6 groups: the 3 engine groups have a 1.0 and a -1 reward, the
    // sampled ones (all malformed) are flat and dropped.
    for m in &metrics {
        assert_eq!((m.groups, m.groups_zero_std), (6, 3), "{m:?}");
        assert!(m.grad_norm > 0.0 && m.tokens > 0);
    }
    assert!(metrics[2].kl > 0.0);
    let png = std::fs::read(Path::new(&run).join("metrics.png")).unwrap();
    assert_eq!(&png[..4], b"\x89PNG");

    // Training made the oracle answers more likely, relative to the malformed ones.
    let after = Policy::load(ckpt.to_str().unwrap(), &Device::Cpu, 0, 4096).unwrap();
    for inst in &seed {
        let good = crate::curation::edits_from_patch(&patches[&inst.instance_id], &inst.context, &inst.oracle);
        let gain = sequence_logprob(&after, &inst.messages, &good) - sequence_logprob(&before, &inst.messages, &good);
        let bad = sequence_logprob(&after, &inst.messages, "no tags here")
            - sequence_logprob(&before, &inst.messages, "no tags here");
        assert!(gain > bad, "{}: oracle {gain:+.3}, malformed {bad:+.3}", inst.instance_id);
    }

    // Evaluation of the checkpoint and of the engine's rollouts.
    let report = d("eval.json");
    let text = swelake(&[
        "eval",
        "--seed-shards",
        &shards,
        "--split",
        "",
        "--model",
        ckpt.to_str().unwrap(),
        "--max-new-tokens",
        "8",
        "--json",
        &report,
        "--max-seq",
        "4096",
    ]);
    assert!(text.contains("(all)"), "{text}");
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(r["overall"]["instances"], 3);
    let engine = format!("{out}/part-00001.parquet");
    swelake(&["eval", "--seed-shards", &shards, "--split", "", "--rollouts", &engine, "--json", &report]);
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(r["overall"]["samples"], 6);
    assert_eq!(r["overall"]["exact_match_rate"], 0.5);
    assert_eq!(r["overall"]["mean_reward"], 0.0);
}

fn oracle_patches(shard: &Path) -> HashMap<String, String> {
    use arrow::array::AsArray;
    let f = std::fs::File::open(shard).unwrap();
    let mut out = HashMap::new();
    for b in parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f).unwrap().build().unwrap() {
        let b = b.unwrap();
        let ids = b.column_by_name("instance_id").unwrap().as_string::<i32>().clone();
        let p = b.column_by_name("oracle_patch").unwrap().as_string::<i32>().clone();
        for i in 0..b.num_rows() {
            out.insert(ids.value(i).to_string(), p.value(i).to_string());
        }
    }
    out
}

#[test]
fn smollm2_greedy_decodes_a_coherent_answer() {
    let policy = Policy::load("smollm2", &Device::Cpu, 0, 512).unwrap();
    assert_eq!((policy.model.cfg.layers, policy.model.cfg.dim, policy.model.cfg.vocab), (30, 576, 49152));
    let tok = &policy.tokenizer;
    let prompt = tok.render_chat(&[Message::new("user", "What is the capital of France?")], true);
    assert!(prompt.starts_with("<|im_start|>system\n"), "SmolLM2's default system prompt: {prompt}");
    let ids = tok.encode(&prompt).unwrap();
    let greedy = Sampling { temperature: 0.0, top_p: 1.0, max_new_tokens: 24 };
    let out = swelake::train::generate::sample_group(
        &policy.model,
        &ids,
        1,
        tok.eos_id(),
        &greedy,
        &mut swelake::train::generate::Rng::new(0),
    )
    .unwrap();
    let text = tok.decode(&out[0].ids).unwrap();
    assert!(text.contains("Paris"), "{text:?}");
}
