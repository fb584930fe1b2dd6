//! The flags of `swelake train`, `generate` and `eval`, parsed into the trainer's plain option
//! structs.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use crate::train::grpo::LossAgg;

/// How token losses are aggregated (see the trainer's `LossAgg`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LossAggArg {
    /// Mean over all completion tokens of the step.
    TokenMean,
    /// Mean over sequences of each sequence's token mean.
    SeqMeanTokenMean,
    /// Mean over sequences of each sequence's token sum, divided by the longest allowed completion.
    SeqMeanTokenSumNorm,
}

impl From<LossAggArg> for LossAgg {
    fn from(a: LossAggArg) -> LossAgg {
        match a {
            LossAggArg::TokenMean => LossAgg::TokenMean,
            LossAggArg::SeqMeanTokenMean => LossAgg::SeqMeanTokenMean,
            LossAggArg::SeqMeanTokenSumNorm => LossAgg::SeqMeanTokenSumNorm,
        }
    }
}

#[derive(Args, Debug, Clone)]
pub(crate) struct SamplingArgs {
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
    pub(crate) fn into_options(self) -> crate::train::generate::Sampling {
        crate::train::generate::Sampling {
            temperature: self.temperature,
            top_p: self.top_p,
            max_new_tokens: self.max_new_tokens,
        }
    }
}

#[derive(Args, Debug, Clone)]
pub(crate) struct ModelArgs {
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
    pub(crate) fn into_options(self) -> crate::train::run::ModelOptions {
        crate::train::run::ModelOptions { model: self.model, max_seq: self.max_seq, seed: self.seed }
    }
}

#[derive(Args, Debug)]
#[command(after_help = "\
Offline (rollouts from any engine, see schemas/rollouts.toml):
  swelake train --rollouts 'rollouts/*.parquet' --seed-shards 'lake/shards/seed/*.parquet' --model smollm2 --out runs/r1
Online (sample with the current policy, score, train, repeat):
  swelake train --online --seed-shards 'lake/shards/seed/*.parquet' --model smollm2 --group-size 8 --out runs/r2
Online, rewarded by running each completion's patch against its instance's tests:
  swelake train --online --reward hybrid --lake lake --repo-url 'file:///srv/git/{repo}.git' --model smollm2 --out runs/r3
Resume an interrupted run: the same command with --resume.

Rows without a reward are scored with the SWE-RL reward (context/oracle from the seed shards);
without --seed-shards every rollout must carry its prompt and reward, and splits are not checked;
groups whose rewards are all equal carry no signal and are dropped (counted as groups_zero_std).
--reward (online): similarity (SWE-RL's), tests (-1 malformed, 0 unresolved, 1 resolved) or hybrid
(-1 malformed, 1 resolved, 0 the patch does not apply, else (similarity + share of FAIL_TO_PASS
passed) / 4); the test modes grade each group's completions in the sandbox while the next group
samples, on the verified instances of --lake (its seed shards are the default --seed-shards).
Writes DIR/checkpoints/step-N (weights, tokenizer, optimizer state), DIR/metrics.parquet (one row
per step: reward, format errors, resolved_rate and graded with a test reward, ...),
DIR/rollouts/step-N.parquet (online) and DIR/metrics.png.")]
pub(crate) struct TrainArgs {
    /// Rollout Parquet files (glob). Not with --online.
    #[arg(long, required_unless_present = "online")]
    rollouts: Option<String>,
    /// Seed shards (glob): prompts, context and oracle by instance_id. Needed online; offline
    /// only when rollouts lack a prompt or reward (without them splits are not checked).
    #[arg(long)]
    seed_shards: Option<String>,
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
    #[arg(long, value_enum, default_value_t = LossAggArg::TokenMean)]
    loss_agg: LossAggArg,
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
    /// The reward of --online sampling: similarity, tests or hybrid (see below).
    #[arg(long, default_value = "similarity", value_parser = super::reward::parse_mode)]
    reward: swelake_reward::modes::Mode,
    #[command(flatten)]
    grade: super::args::GradeArgs,
}

impl TrainArgs {
    pub(crate) fn into_options(self) -> crate::train::run::TrainOptions {
        crate::train::run::TrainOptions {
            rollouts: self.rollouts,
            seed_shards: self.seed_shards,
            model: self.model.into_options(),
            out: self.out,
            steps: self.steps,
            groups_per_step: self.groups_per_step,
            micro_batch: self.micro_batch,
            lr: self.lr,
            warmup_steps: self.warmup_steps,
            min_lr_ratio: self.min_lr_ratio,
            weight_decay: self.weight_decay,
            max_grad_norm: self.max_grad_norm,
            eps_low: self.eps_low,
            eps_high: self.eps_high,
            beta: self.beta,
            loss_agg: self.loss_agg.into(),
            no_std_scaling: self.no_std_scaling,
            save_every: self.save_every,
            resume: self.resume,
            online: self.online,
            group_size: self.group_size,
            split: self.split,
            sampling: self.sampling.into_options(),
            reward: self.reward,
        }
    }
}

#[derive(Args, Debug)]
#[command(after_help = "\
Example:
  swelake generate --seed-shards 'lake/shards/seed/*.parquet' --model smollm2 --group-size 8 --out rollouts/
Writes OUT/part-00000.parquet (schemas/rollouts.toml) with rewards already scored, ready for
`swelake train --rollouts`. Another engine (vLLM, ...) can write the same table instead.")]
pub(crate) struct GenerateArgs {
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

impl GenerateArgs {
    pub(crate) fn into_options(self) -> crate::train::run::GenerateOptions {
        crate::train::run::GenerateOptions {
            seed_shards: self.seed_shards,
            model: self.model.into_options(),
            group_size: self.group_size,
            out: self.out,
            split: self.split,
            limit: self.limit,
            sampling: self.sampling.into_options(),
        }
    }
}

#[derive(Args, Debug)]
#[command(after_help = "\
Examples:
  swelake eval --seed-shards 'lake/shards/seed/*.parquet' --split test --model runs/r1/checkpoints/step-000100
  swelake eval --seed-shards 'lake/shards/seed/*.parquet' --split test --rollouts 'vllm-out/*.parquet' --json report.json
  swelake eval --split test --model runs/r1/checkpoints/step-000100 --lake lake --repo-url 'file:///srv/git/{repo}.git'
Reports per repository the share of well-formed answers, the mean reward (malformed = -1) and the
exact-match rate (reward 1.0), as a table and optionally JSON. With --lake and --repo-url each
answer's patch also runs against its instance's FAIL_TO_PASS and PASS_TO_PASS tests in the
sandbox, and the resolved rate stands beside (instances the lake did not verify count as
unresolved).")]
pub(crate) struct EvalArgs {
    /// Seed shards (glob) [default with --lake: LAKE/shards/seed/part-*.parquet].
    #[arg(long, required_unless_present = "lake")]
    seed_shards: Option<String>,
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
    #[command(flatten)]
    grade: super::args::GradeArgs,
}

impl EvalArgs {
    pub(crate) fn into_options(self) -> crate::train::run::EvalOptions {
        crate::train::run::EvalOptions {
            seed_shards: self.seed_shards.or_else(|| self.grade.seed_shards()).unwrap_or_default(),
            split: self.split,
            model: self.model,
            rollouts: self.rollouts,
            samples: self.samples,
            limit: self.limit,
            max_seq: self.max_seq,
            seed: self.seed,
            json: self.json,
            save_rollouts: self.save_rollouts,
            temperature: self.temperature,
            top_p: self.top_p,
            max_new_tokens: self.max_new_tokens,
        }
    }
}

impl TrainArgs {
    pub(crate) async fn run(self, ctx: &super::Ctx) -> anyhow::Result<std::process::ExitCode> {
        let mut keep = Vec::new();
        let grade = self.grade.clone();
        let mut opts = self.into_options();
        if opts.seed_shards.is_none() {
            opts.seed_shards = grade.seed_shards();
        }
        if opts.online && opts.seed_shards.is_none() {
            anyhow::bail!("online training samples seed prompts: give --seed-shards (or --lake)");
        }
        opts.rollouts = super::local_glob(opts.rollouts.take(), &ctx.given, &mut keep).await?;
        opts.seed_shards = super::local_glob(opts.seed_shards.take(), &ctx.given, &mut keep).await?;
        let grader = if opts.reward.runs_tests() { grade.open(ctx).await? } else { None };
        let outcomes = |items: &[(String, String)]| grader.as_ref().expect("test modes have a grader").outcomes(items);
        let g = grader.as_ref().map(|_| &outcomes as &crate::train::run::Grade<'_>);
        tokio::task::block_in_place(|| crate::train::run::train(&opts, g))?;
        Ok(std::process::ExitCode::SUCCESS)
    }
}

impl GenerateArgs {
    pub(crate) async fn run(self, ctx: &super::Ctx) -> anyhow::Result<std::process::ExitCode> {
        let mut keep = Vec::new();
        let mut opts = self.into_options();
        opts.seed_shards = super::local_glob(Some(opts.seed_shards), &ctx.given, &mut keep).await?.unwrap_or_default();
        tokio::task::block_in_place(|| crate::train::run::generate(&opts))?;
        Ok(std::process::ExitCode::SUCCESS)
    }
}

impl EvalArgs {
    pub(crate) async fn run(self, ctx: &super::Ctx) -> anyhow::Result<std::process::ExitCode> {
        let mut keep = Vec::new();
        let grade = self.grade.clone();
        let mut opts = self.into_options();
        opts.seed_shards = super::local_glob(Some(opts.seed_shards), &ctx.given, &mut keep).await?.unwrap_or_default();
        opts.rollouts = super::local_glob(opts.rollouts.take(), &ctx.given, &mut keep).await?;
        let grader = grade.open(ctx).await?;
        let outcomes = |items: &[(String, String)]| grader.as_ref().expect("given with a grader").outcomes(items);
        let g = grader.as_ref().map(|_| &outcomes as &crate::train::run::Grade<'_>);
        tokio::task::block_in_place(|| crate::train::run::eval(&opts, g))?;
        Ok(std::process::ExitCode::SUCCESS)
    }
}
