//! The three runs of a policy: `train` (GRPO, online or on rollout tables), `generate`
//! (rollouts from seed prompts) and `eval` (held-out instances), each from a plain options
//! struct that the command line fills.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use super::data::{self, Rollout, SeedInstance};
use super::eval;
use super::generate::{Rng, Sampling};
use super::grpo::{LossAgg, Objective};
use super::optim::OptimConfig;
use super::reward::Rewarder;
use super::trainer::{TrainConfig, Trainer};
use super::{device, Policy, MODEL_SPECS};
use swelake_reward::modes::Mode;

#[derive(Debug, Clone)]
pub struct ModelOptions {
    /// The policy: a checkpoint directory, a .gguf file, `smollm2`, `tiny` or `tiny-bpe`.
    pub model: String,
    /// Context length of the model (prompt + completion), for models that do not fix it.
    pub max_seq: usize,
    /// Seed of sampling and of the tiny models' initial weights.
    pub seed: u64,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions { model: String::new(), max_seq: 8192, seed: 0 }
    }
}

impl ModelOptions {
    /// Loads the policy and says which one on stderr.
    pub fn load(&self) -> Result<Policy> {
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

#[derive(Debug, Clone)]
pub struct TrainOptions {
    /// Rollout Parquet files (glob). Not with --online.
    pub rollouts: Option<String>,
    /// Seed shards (glob): prompts, context and oracle by instance_id. Optional offline when
    /// every rollout carries its prompt and reward (splits are then not checked).
    pub seed_shards: Option<String>,
    pub model: ModelOptions,
    /// Output directory.
    pub out: PathBuf,
    /// Optimiser steps.
    pub steps: usize,
    /// Groups (prompts) per step.
    pub groups_per_step: usize,
    /// Sequences per forward/backward pass (gradients accumulate over the step).
    pub micro_batch: usize,
    pub lr: f64,
    pub warmup_steps: usize,
    /// Final learning rate of the cosine schedule, as a fraction of --lr.
    pub min_lr_ratio: f64,
    pub weight_decay: f64,
    /// Global gradient-norm clipping bound (0 = off).
    pub max_grad_norm: f64,
    /// Lower clip of the ratio: 1 - eps_low.
    pub eps_low: f64,
    /// Upper clip of the ratio: 1 + eps_high (clip-higher when above eps_low).
    pub eps_high: f64,
    /// Coefficient of the k3 KL penalty to the initial policy (0 = none, no reference kept).
    pub beta: f64,
    /// How token losses are aggregated.
    pub loss_agg: LossAgg,
    /// Do not divide advantages by the group's standard deviation (Dr. GRPO).
    pub no_std_scaling: bool,
    /// Checkpoint every N steps (and at the end).
    pub save_every: usize,
    /// Continue from the newest checkpoint in --out.
    pub resume: bool,
    /// Sample completions with the current policy each step instead of reading --rollouts.
    pub online: bool,
    /// Completions per prompt (--online).
    pub group_size: usize,
    /// Seed split to train on: groups of other splits' instances are left out, so a test set
    /// cannot leak into training (all when empty). Groups mixing instances are always left out.
    pub split: String,
    pub sampling: Sampling,
    /// The reward of --online sampling: the test modes need the grader `train` is given.
    pub reward: Mode,
}

impl Default for TrainOptions {
    fn default() -> Self {
        TrainOptions {
            rollouts: None,
            seed_shards: None,
            model: ModelOptions::default(),
            out: PathBuf::new(),
            steps: 100,
            groups_per_step: 4,
            micro_batch: 4,
            lr: 1e-6,
            warmup_steps: 0,
            min_lr_ratio: 0.1,
            weight_decay: 0.01,
            max_grad_norm: 1.0,
            eps_low: 0.2,
            eps_high: 0.28,
            beta: 0.0,
            loss_agg: LossAgg::TokenMean,
            no_std_scaling: false,
            save_every: 50,
            resume: false,
            online: false,
            group_size: 8,
            split: "train".to_string(),
            sampling: Sampling { max_new_tokens: 512, ..Default::default() },
            reward: Mode::Similarity,
        }
    }
}

#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// Seed shards (glob).
    pub seed_shards: String,
    pub model: ModelOptions,
    /// Completions per prompt (one GRPO group).
    pub group_size: usize,
    /// Output directory.
    pub out: PathBuf,
    /// Seed split to sample (all when empty).
    pub split: String,
    /// At most this many instances.
    pub limit: Option<usize>,
    pub sampling: Sampling,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            seed_shards: String::new(),
            model: ModelOptions::default(),
            group_size: 8,
            out: PathBuf::new(),
            split: "train".to_string(),
            limit: None,
            sampling: Sampling { max_new_tokens: 512, ..Default::default() },
        }
    }
}

#[derive(Debug, Clone)]
pub struct EvalOptions {
    /// Seed shards (glob).
    pub seed_shards: String,
    /// Split to evaluate.
    pub split: String,
    /// The policy to sample (see `swelake train --help`); or give --rollouts.
    pub model: Option<String>,
    /// Score completions another engine produced (rollout Parquet glob) instead of sampling.
    pub rollouts: Option<String>,
    /// Answers per instance.
    pub samples: usize,
    /// At most this many instances.
    pub limit: Option<usize>,
    pub max_seq: usize,
    pub seed: u64,
    /// Write the report as JSON here.
    pub json: Option<PathBuf>,
    /// Also write the sampled answers as a rollout table here.
    pub save_rollouts: Option<PathBuf>,
    /// Sampling temperature (0 = greedy).
    pub temperature: f64,
    pub top_p: f64,
    pub max_new_tokens: usize,
}

impl Default for EvalOptions {
    fn default() -> Self {
        EvalOptions {
            seed_shards: String::new(),
            split: "test".to_string(),
            model: None,
            rollouts: None,
            samples: 1,
            limit: None,
            max_seq: 8192,
            seed: 0,
            json: None,
            save_rollouts: None,
            temperature: 0.0,
            top_p: 1.0,
            max_new_tokens: 512,
        }
    }
}

fn seed_split(glob: &str, split: &str) -> Result<Vec<SeedInstance>> {
    let inst = data::read_seed(glob, (!split.is_empty()).then_some(split))?;
    if inst.is_empty() {
        bail!("no instances of split {split:?} in {glob}");
    }
    Ok(inst)
}

/// Runs patches against their instances' tests (the caller's grader: `swelake` brings the
/// lake's).
pub type Grade<'a> = swelake_reward::rollouts::GradeFn<'a>;

/// Trains with `a`; `grade` is needed when `a.reward` runs tests.
pub fn train(a: &TrainOptions, grade: Option<&Grade<'_>>) -> Result<()> {
    if a.online && a.reward.runs_tests() && grade.is_none() {
        bail!(
            "--reward {} runs the instances' tests: it needs a lake with verified instances (--lake, --repo-url)",
            a.reward
        );
    }
    swelake_core::memory::keep_freed_memory();
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
        sampling: a.sampling.clone(),
    };
    let seed: HashMap<String, SeedInstance> = match &a.seed_shards {
        Some(glob) => data::read_seed(glob, None)?.into_iter().map(|i| (i.instance_id.clone(), i)).collect(),
        None if a.online => bail!("online training samples seed prompts: give the seed shards"),
        None => HashMap::new(),
    };
    let mut trainer = Trainer::new(policy, cfg, &a.out)?;
    if a.resume && trainer.resume()? {
        eprintln!("resumed at step {}", trainer.step_count());
    }
    let bar = swelake_core::progress::count_bar(a.steps as u64, "steps");
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
        let rewarder = Rewarder { mode: a.reward, seed: &seed, grade };
        let reward = |items: &[(String, String)]| rewarder.score(items);
        let mode = a.reward.as_str();
        while trainer.step_count() < a.steps {
            let step = trainer.step_count();
            let prompts: Vec<(String, String)> = epoch_order(pool.len(), a.groups_per_step, step, a.model.seed)
                .into_iter()
                .map(|i| (pool[i].instance_id.clone(), trainer.policy.tokenizer.render_chat(&pool[i].messages, true)))
                .collect();
            let t0 = std::time::Instant::now();
            let (groups, rows) = trainer.sample_groups(&prompts, &reward, mode)?;
            let gen_s = t0.elapsed().as_secs_f64();
            data::write_rollouts(&a.out.join(format!("rollouts/step-{step:06}.parquet")), &rows)?;
            let m = trainer.step(&groups)?;
            if let Some(last) = trainer.metrics.last_mut() {
                last.generate_s = gen_s;
            }
            after_step(&mut trainer, &m, &bar, a.steps)?;
        }
    } else {
        let glob = a.rollouts.as_deref().context("offline training reads rollout tables: give their glob")?;
        let groups = crate::prepare::offline_groups(glob, a.seed_shards.as_deref(), &seed, &a.split, &trainer.policy)?;
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
        "trained {} steps; last step: reward mean {:.4}{}, format errors {:.1}%, zero-std groups {:.1}%, {:.0} tokens/s; checkpoints and metrics in {}",
        trainer.step_count(),
        last.reward_mean,
        resolved_note(&last),
        last.format_error_rate * 100.0,
        last.frac_zero_std * 100.0,
        last.tokens_per_s,
        a.out.display()
    );
    Ok(())
}

/// ", resolved 2/16" when the step's rewards ran tests.
fn resolved_note(m: &super::trainer::StepMetrics) -> String {
    if m.graded == 0 {
        return String::new();
    }
    format!(", resolved {}/{}", (m.resolved_rate * m.graded as f64).round() as i64, m.graded)
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
        "step {}: reward {:.4} ± {:.4}{}, format errors {:.1}%, zero-std groups {}/{}, kl {:.5}, entropy {:.3}, grad norm {:.3}, {:.0} tokens/s",
        m.step,
        m.reward_mean,
        m.reward_std,
        resolved_note(m),
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

pub fn generate(a: &GenerateOptions) -> Result<()> {
    swelake_core::memory::keep_freed_memory();
    let policy = a.model.load()?;
    let mut inst = seed_split(&a.seed_shards, &a.split)?;
    if let Some(l) = a.limit {
        inst.truncate(l);
    }
    let seed: HashMap<String, SeedInstance> = inst.iter().map(|i| (i.instance_id.clone(), i.clone())).collect();
    let cfg = TrainConfig {
        group_size: a.group_size,
        sampling: a.sampling.clone(),
        seed: a.model.seed,
        ..Default::default()
    };
    let tmp = tempfile::tempdir()?;
    let mut t = Trainer::new(policy, cfg, tmp.path())?;
    let bar = swelake_core::progress::count_bar(inst.len() as u64, "prompts");
    let rewarder = Rewarder { mode: Mode::Similarity, seed: &seed, grade: None };
    let reward = |items: &[(String, String)]| rewarder.score(items);
    let mut rows: Vec<Rollout> = Vec::new();
    for i in &inst {
        let prompt = t.policy.tokenizer.render_chat(&i.messages, true);
        let (_, r) = t.sample_groups(&[(i.instance_id.clone(), prompt)], &reward, "similarity")?;
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

/// Evaluates with `a`; with `grade`, each answer's patch also runs against its instance's
/// tests and the report has the resolved rate.
pub fn eval(a: &EvalOptions, grade: Option<&Grade<'_>>) -> Result<()> {
    swelake_core::memory::keep_freed_memory();
    let mut inst = seed_split(&a.seed_shards, &a.split)?;
    if let Some(l) = a.limit {
        inst.truncate(l);
    }
    let report = match (&a.model, &a.rollouts) {
        (Some(model), None) => {
            let margs = ModelOptions { model: model.clone(), max_seq: a.max_seq, seed: a.seed };
            let policy = margs.load()?;
            let sampling = Sampling { temperature: a.temperature, top_p: a.top_p, max_new_tokens: a.max_new_tokens };
            let bar = swelake_core::progress::count_bar(inst.len() as u64, "instances");
            let (report, rows) =
                eval::evaluate_policy(&policy, &inst, a.samples.max(1), &sampling, a.seed, grade, &|done, _| {
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
            eval::evaluate_rollouts(&rows, &by, grade)
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
