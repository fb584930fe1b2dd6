//! `swelake train`, `swelake generate` and `swelake eval`.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;

use super::data::{self, Rollout, SeedInstance};
use super::eval;
use super::generate::{Rng, Sampling};
use super::grpo::{LossAgg, Objective};
use super::optim::OptimConfig;
use super::trainer::{groups_from_rollouts, TrainConfig, Trainer};
use super::{device, Policy, MODEL_SPECS};

#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 1.0)]
    temperature: f64,
    /// Nucleus sampling: keep the most likely tokens up to this probability mass.
    #[arg(long, default_value_t = 1.0)]
    top_p: f64,
    /// Longest completion, in tokens.
    #[arg(long, default_value_t = 512)]
    max_new_tokens: usize,
}

impl SamplingArgs {
    fn sampling(&self) -> Sampling {
        Sampling { temperature: self.temperature, top_p: self.top_p, max_new_tokens: self.max_new_tokens }
    }
}

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// The policy: a checkpoint directory, a .gguf file, `smollm2`, `tiny` or `tiny-bpe`.
    #[arg(long)]
    model: String,
    /// Context length of the model (prompt + completion), for models that do not fix it.
    #[arg(long, default_value_t = 8192)]
    max_seq: usize,
    /// Seed of sampling and of the tiny models' initial weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

impl ModelArgs {
    fn load(&self) -> Result<Policy> {
        let dev = device();
        let p = Policy::load(&self.model, &dev, self.seed, self.max_seq)?;
        eprintln!(
            "policy: {} ({} parameters, {} layers, vocabulary {}) on {:?}",
            self.model,
            p.model.parameter_count(),
            p.model.cfg.layers,
            p.model.cfg.vocab,
            dev
        );
        Ok(p)
    }
}

#[derive(Args, Debug)]
#[command(after_help = "\
Offline (rollouts from any engine, see schemas/rollouts.toml):
  swelake train --rollouts 'rollouts/*.parquet' --seed-shards 'lake/shards/seed/*.parquet' --model smollm2 --out runs/r1
Online (sample with the current policy, score, train, repeat):
  swelake train --online --seed-shards 'lake/shards/seed/*.parquet' --model smollm2 --group-size 8 --out runs/r2
Resume an interrupted run: the same command with --resume.

Rows without a reward are scored with the SWE-RL reward (context/oracle from the seed shards);
groups whose rewards are all equal carry no signal and are dropped (counted as groups_zero_std).
Writes DIR/checkpoints/step-N (weights, tokenizer, optimizer state), DIR/metrics.parquet (one row
per step) and DIR/metrics.png.")]
pub struct TrainArgs {
    /// Rollout Parquet files (glob). Not with --online.
    #[arg(long, required_unless_present = "online")]
    rollouts: Option<String>,
    /// Seed shards (glob): prompts, context and oracle by instance_id.
    #[arg(long)]
    seed_shards: String,
    #[command(flatten)]
    model: ModelArgs,
    /// Output directory.
    #[arg(long)]
    out: PathBuf,
    /// Optimiser steps.
    #[arg(long, default_value_t = 100)]
    steps: usize,
    /// Groups (prompts) per step.
    #[arg(long, default_value_t = 4)]
    groups_per_step: usize,
    /// Sequences per forward/backward pass (gradients accumulate over the step).
    #[arg(long, default_value_t = 4)]
    micro_batch: usize,
    #[arg(long, default_value_t = 1e-6)]
    lr: f64,
    #[arg(long, default_value_t = 0)]
    warmup_steps: usize,
    /// Final learning rate of the cosine schedule, as a fraction of --lr.
    #[arg(long, default_value_t = 0.1)]
    min_lr_ratio: f64,
    #[arg(long, default_value_t = 0.01)]
    weight_decay: f64,
    /// Global gradient-norm clipping bound (0 = off).
    #[arg(long, default_value_t = 1.0)]
    max_grad_norm: f64,
    /// Lower clip of the ratio: 1 - eps_low.
    #[arg(long, default_value_t = 0.2)]
    eps_low: f64,
    /// Upper clip of the ratio: 1 + eps_high (clip-higher when above eps_low).
    #[arg(long, default_value_t = 0.28)]
    eps_high: f64,
    /// Coefficient of the k3 KL penalty to the initial policy (0 = none, no reference kept).
    #[arg(long, default_value_t = 0.0)]
    beta: f64,
    /// How token losses are aggregated.
    #[arg(long, value_enum, default_value_t = LossAgg::TokenMean)]
    loss_agg: LossAgg,
    /// Do not divide advantages by the group's standard deviation (Dr. GRPO).
    #[arg(long)]
    no_std_scaling: bool,
    /// Checkpoint every N steps (and at the end).
    #[arg(long, default_value_t = 50)]
    save_every: usize,
    /// Continue from the newest checkpoint in --out.
    #[arg(long)]
    resume: bool,
    /// Sample completions with the current policy each step instead of reading --rollouts.
    #[arg(long)]
    online: bool,
    /// Completions per prompt (--online).
    #[arg(long, default_value_t = 8)]
    group_size: usize,
    /// Seed split to train on: groups of other splits' instances are left out, so a test set
    /// cannot leak into training (all when empty). Groups mixing instances are always left out.
    #[arg(long, default_value = "train")]
    split: String,
    #[command(flatten)]
    sampling: SamplingArgs,
}

#[derive(Args, Debug)]
#[command(after_help = "\
Example:
  swelake generate --seed-shards 'lake/shards/seed/*.parquet' --model smollm2 --group-size 8 --out rollouts/
Writes OUT/part-00000.parquet (schemas/rollouts.toml) with rewards already scored, ready for
`swelake train --rollouts`. Another engine (vLLM, ...) can write the same table instead.")]
pub struct GenerateArgs {
    /// Seed shards (glob).
    #[arg(long)]
    seed_shards: String,
    #[command(flatten)]
    model: ModelArgs,
    /// Completions per prompt (one GRPO group).
    #[arg(long, default_value_t = 8)]
    group_size: usize,
    /// Output directory.
    #[arg(long)]
    out: PathBuf,
    /// Seed split to sample (all when empty).
    #[arg(long, default_value = "train")]
    split: String,
    /// At most this many instances.
    #[arg(long)]
    limit: Option<usize>,
    #[command(flatten)]
    sampling: SamplingArgs,
}

#[derive(Args, Debug)]
#[command(after_help = "\
Examples:
  swelake eval --seed-shards 'lake/shards/seed/*.parquet' --split test --model runs/r1/checkpoints/step-000100
  swelake eval --seed-shards 'lake/shards/seed/*.parquet' --split test --rollouts 'vllm-out/*.parquet' --json report.json
Reports per repository the share of well-formed answers, the mean reward (malformed = -1) and the
exact-match rate (reward 1.0), as a table and optionally JSON.")]
pub struct EvalArgs {
    /// Seed shards (glob).
    #[arg(long)]
    seed_shards: String,
    /// Split to evaluate.
    #[arg(long, default_value = "test")]
    split: String,
    /// The policy to sample (see `swelake train --help`); or give --rollouts.
    #[arg(long, required_unless_present = "rollouts", conflicts_with = "rollouts")]
    model: Option<String>,
    /// Score completions another engine produced (rollout Parquet glob) instead of sampling.
    #[arg(long)]
    rollouts: Option<String>,
    /// Answers per instance.
    #[arg(long, default_value_t = 1)]
    samples: usize,
    /// At most this many instances.
    #[arg(long)]
    limit: Option<usize>,
    #[arg(long, default_value_t = 8192)]
    max_seq: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Also write the sampled answers as a rollout table here.
    #[arg(long)]
    save_rollouts: Option<PathBuf>,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    #[arg(long, default_value_t = 1.0)]
    top_p: f64,
    #[arg(long, default_value_t = 512)]
    max_new_tokens: usize,
}

fn seed_split(glob: &str, split: &str) -> Result<Vec<SeedInstance>> {
    let inst = data::read_seed(glob, (!split.is_empty()).then_some(split))?;
    if inst.is_empty() {
        bail!("no instances of split {split:?} in {glob}");
    }
    Ok(inst)
}

fn reward_of(seed: &HashMap<String, SeedInstance>) -> impl Fn(&str, &str) -> Option<(f64, Option<String>)> + '_ {
    move |id, completion| {
        let inst = seed.get(id)?;
        crate::reward::search_replace_reward(&inst.context, &inst.oracle, completion)
            .ok()
            .map(|r| (r.reward, r.format_error))
    }
}

pub fn train(a: &TrainArgs) -> Result<()> {
    crate::memory::keep_freed_memory();
    let policy = a.model.load()?;
    let cfg = TrainConfig {
        objective: Objective {
            eps_low: a.eps_low,
            eps_high: a.eps_high,
            beta: a.beta,
            agg: a.loss_agg,
            norm_len: a.sampling.max_new_tokens,
        },
        optim: OptimConfig {
            lr: a.lr,
            weight_decay: a.weight_decay,
            max_grad_norm: a.max_grad_norm,
            warmup_steps: a.warmup_steps,
            total_steps: a.steps,
            min_lr_ratio: a.min_lr_ratio,
            ..Default::default()
        },
        groups_per_step: a.groups_per_step,
        group_size: a.group_size,
        micro_batch: a.micro_batch,
        scale_advantages: !a.no_std_scaling,
        seed: a.model.seed,
        steps: a.steps,
        save_every: a.save_every.max(1),
        sampling: a.sampling.sampling(),
    };
    let seed: HashMap<String, SeedInstance> =
        data::read_seed(&a.seed_shards, None)?.into_iter().map(|i| (i.instance_id.clone(), i)).collect();
    let mut trainer = Trainer::new(policy, cfg, &a.out)?;
    if a.resume && trainer.resume()? {
        eprintln!("resumed at step {}", trainer.step_count());
    }
    let bar = crate::progress::count_bar(a.steps as u64, "steps");
    bar.set_position(trainer.step_count() as u64);
    if a.online {
        let pool: Vec<&SeedInstance> = {
            let mut v: Vec<&SeedInstance> =
                seed.values().filter(|i| a.split.is_empty() || i.split == a.split).collect();
            v.sort_by(|x, y| x.instance_id.cmp(&y.instance_id));
            v
        };
        if pool.is_empty() {
            bail!("no seed instances of split {:?}", a.split);
        }
        let reward = reward_of(&seed);
        while trainer.step_count() < a.steps {
            let step = trainer.step_count();
            let prompts: Vec<(String, String)> = epoch_order(pool.len(), a.groups_per_step, step, a.model.seed)
                .into_iter()
                .map(|i| (pool[i].instance_id.clone(), trainer.policy.tokenizer.render_chat(&pool[i].messages, true)))
                .collect();
            let t0 = std::time::Instant::now();
            let (groups, rows) = trainer.sample_groups(&prompts, &reward)?;
            let gen_s = t0.elapsed().as_secs_f64();
            data::write_rollouts(&a.out.join(format!("rollouts/step-{step:06}.parquet")), &rows)?;
            let m = trainer.step(&groups)?;
            if let Some(last) = trainer.metrics.last_mut() {
                last.generate_s = gen_s;
            }
            after_step(&mut trainer, &m, &bar, a.steps)?;
        }
    } else {
        let glob = a.rollouts.as_deref().expect("clap requires --rollouts without --online");
        let t0 = std::time::Instant::now();
        // Which groups to train on is decided from the projected id/reward columns alone.
        let stats = super::lazy::group_stats(glob, &a.seed_shards)?;
        let t = super::lazy::totals(&stats);
        eprintln!(
            "rollouts ⋈ seed: {} groups, {} rollouts ({} with a reward), {} rows of instances not in the seed, \
             {} groups mixing instances, {} groups already flat; groups per split {:?}",
            t.groups, t.rollouts, t.scored, t.unknown_rows, t.mixed_groups, t.zero_std_groups, t.per_split
        );
        let keep: std::collections::HashSet<&str> = stats
            .iter()
            .filter(|g| g.instances == 1 && (a.split.is_empty() || g.split.as_deref() == Some(a.split.as_str())))
            .map(|g| g.group_id.as_str())
            .collect();
        if keep.is_empty() {
            bail!(
                "no groups of split {:?} in {glob} (groups per split: {:?}; --split '' trains on all)",
                a.split,
                t.per_split
            );
        }
        let mut rows = data::read_rollouts(glob)?;
        rows.retain(|r| keep.contains(r.group_id.as_str()));
        let lookup: HashMap<String, (data::Files, data::Files)> =
            seed.iter().map(|(k, v)| (k.clone(), (v.context.clone(), v.oracle.clone()))).collect();
        let missing = rows.iter().filter(|r| r.reward.is_none()).count();
        let unscored = data::fill_rewards(&mut rows, &lookup);
        let prompts: HashMap<String, String> =
            seed.iter().map(|(k, v)| (k.clone(), trainer.policy.tokenizer.render_chat(&v.messages, true))).collect();
        let (groups, skipped) = groups_from_rollouts(&rows, &trainer.policy, &prompts)?;
        eprintln!(
            "{} rollouts in {} groups read in {:.2}s; {missing} scored here, {unscored} could not be scored ({skipped} rows left out)",
            rows.len(),
            groups.len(),
            t0.elapsed().as_secs_f64()
        );
        if groups.is_empty() {
            bail!("no groups to train on in {glob}");
        }
        while trainer.step_count() < a.steps {
            let step = trainer.step_count();
            let batch: Vec<_> = epoch_order(groups.len(), a.groups_per_step, step, a.model.seed)
                .into_iter()
                .map(|i| groups[i].clone())
                .collect();
            let m = trainer.step(&batch)?;
            after_step(&mut trainer, &m, &bar, a.steps)?;
        }
    }
    bar.finish_and_clear();
    trainer.save_checkpoint()?;
    trainer.write_metrics()?;
    let last = trainer.metrics.last().cloned().unwrap_or_default();
    println!(
        "trained {} steps; last step: reward mean {:.4}, format errors {:.1}%, zero-std groups {:.1}%, {:.0} tokens/s; checkpoints and metrics in {}",
        trainer.step_count(),
        last.reward_mean,
        last.format_error_rate * 100.0,
        last.frac_zero_std * 100.0,
        last.tokens_per_s,
        a.out.display()
    );
    Ok(())
}

/// The `per_step` indices of step `step` in a seeded shuffle of `n` items, reshuffled each epoch.
pub fn epoch_order(n: usize, per_step: usize, step: usize, seed: u64) -> Vec<usize> {
    let mut out = Vec::with_capacity(per_step);
    for k in 0..per_step {
        let pos = step * per_step + k;
        let (epoch, i) = (pos / n, pos % n);
        let mut order: Vec<usize> = (0..n).collect();
        let mut rng = Rng::new(seed ^ (epoch as u64).wrapping_mul(0x2545f4914f6cdd1d));
        for j in (1..n).rev() {
            let r = (rng.next_u64() % (j as u64 + 1)) as usize;
            order.swap(j, r);
        }
        out.push(order[i]);
    }
    out
}

fn after_step(
    trainer: &mut Trainer,
    m: &super::trainer::StepMetrics,
    bar: &indicatif::ProgressBar,
    steps: usize,
) -> Result<()> {
    bar.set_position(trainer.step_count() as u64);
    tracing::info!(
        "step {}: reward {:.4} ± {:.4}, format errors {:.1}%, zero-std groups {}/{}, kl {:.5}, entropy {:.3}, grad norm {:.3}, {:.0} tokens/s",
        m.step,
        m.reward_mean,
        m.reward_std,
        m.format_error_rate * 100.0,
        m.groups_zero_std,
        m.groups,
        m.kl,
        m.entropy,
        m.grad_norm,
        m.tokens_per_s
    );
    let n = trainer.step_count();
    if n.is_multiple_of(trainer.cfg.save_every) && n < steps {
        trainer.save_checkpoint()?;
        trainer.write_metrics()?;
    }
    Ok(())
}

pub fn generate(a: &GenerateArgs) -> Result<()> {
    crate::memory::keep_freed_memory();
    let policy = a.model.load()?;
    let mut inst = seed_split(&a.seed_shards, &a.split)?;
    if let Some(l) = a.limit {
        inst.truncate(l);
    }
    let seed: HashMap<String, SeedInstance> = inst.iter().map(|i| (i.instance_id.clone(), i.clone())).collect();
    let cfg = TrainConfig {
        group_size: a.group_size,
        sampling: a.sampling.sampling(),
        seed: a.model.seed,
        ..Default::default()
    };
    let tmp = tempfile::tempdir()?;
    let mut t = Trainer::new(policy, cfg, tmp.path())?;
    let bar = crate::progress::count_bar(inst.len() as u64, "prompts");
    let reward = reward_of(&seed);
    let mut rows: Vec<Rollout> = Vec::new();
    for i in &inst {
        let prompt = t.policy.tokenizer.render_chat(&i.messages, true);
        let (_, r) = t.sample_groups(&[(i.instance_id.clone(), prompt)], &reward)?;
        rows.extend(r);
        bar.inc(1);
    }
    bar.finish_and_clear();
    let path = a.out.join("part-00000.parquet");
    data::write_rollouts(&path, &rows)?;
    let scored: Vec<f64> = rows.iter().filter_map(|r| r.reward).collect();
    println!(
        "wrote {} completions of {} prompts to {} (mean reward {:.4}, format errors {})",
        rows.len(),
        inst.len(),
        path.display(),
        scored.iter().sum::<f64>() / scored.len().max(1) as f64,
        rows.iter().filter(|r| r.format_error.is_some()).count()
    );
    Ok(())
}

pub fn eval(a: &EvalArgs) -> Result<()> {
    crate::memory::keep_freed_memory();
    let mut inst = seed_split(&a.seed_shards, &a.split)?;
    if let Some(l) = a.limit {
        inst.truncate(l);
    }
    let report = match (&a.model, &a.rollouts) {
        (Some(model), None) => {
            let margs = ModelArgs { model: model.clone(), max_seq: a.max_seq, seed: a.seed };
            let policy = margs.load()?;
            let sampling = Sampling { temperature: a.temperature, top_p: a.top_p, max_new_tokens: a.max_new_tokens };
            let bar = crate::progress::count_bar(inst.len() as u64, "instances");
            let (report, rows) =
                eval::evaluate_policy(&policy, &inst, a.samples.max(1), &sampling, a.seed, &|done, _| {
                    bar.set_position(done as u64)
                })?;
            bar.finish_and_clear();
            if let Some(p) = &a.save_rollouts {
                data::write_rollouts(p, &rows)?;
            }
            report
        }
        (None, Some(glob)) => {
            let by: HashMap<String, &SeedInstance> = inst.iter().map(|i| (i.instance_id.clone(), i)).collect();
            let rows: Vec<Rollout> =
                data::read_rollouts(glob)?.into_iter().filter(|r| by.contains_key(&r.instance_id)).collect();
            if rows.is_empty() {
                bail!("no rollouts in {glob} answer instances of split {:?}", a.split);
            }
            eval::evaluate_rollouts(&rows, &by)
        }
        _ => bail!("give --model ({MODEL_SPECS}) or --rollouts"),
    };
    print!("{}", eval::render_table(&report));
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}
