//! The GRPO training loop: groups of completions → advantages → clipped objective over
//! micro-batches with gradient accumulation → AdamW step; checkpoints with resume; metrics.
//!
//! Layout of `--out DIR`:
//! - `checkpoints/step-NNNNNN/` model.safetensors, model.config.json, tokenizer.json, chat.json,
//!   optimizer.safetensors, state.json; `checkpoints/latest` names the newest;
//! - `reference/` the frozen reference policy (when beta > 0), so a resumed run keeps it;
//! - `metrics.parquet` one row per step, `metrics.png` the main curves;
//! - `rollouts/step-NNNNNN.parquet` completions sampled by `--online` runs.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch};
use candle_core::{DType, Tensor};

use super::data::Rollout;
use super::generate::{gather_logprobs, sample_group, Rng, Sample, Sampling};
use super::grpo::{group_advantages, loss, LossStats, Objective, StepNorm};
use super::model::Model;
use super::optim::{AdamW, OptimConfig};
use super::Policy;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TrainConfig {
    pub objective: Objective,
    pub optim: OptimConfig,
    /// Groups (prompts) per optimiser step.
    pub groups_per_step: usize,
    /// Completions per prompt when sampling (`--online`, `generate`).
    pub group_size: usize,
    /// Sequences per forward/backward pass (gradient accumulation over the step's sequences).
    pub micro_batch: usize,
    /// Divide advantages by the group's standard deviation.
    pub scale_advantages: bool,
    pub seed: u64,
    pub steps: usize,
    /// Checkpoint every this many steps (and at the end).
    pub save_every: usize,
    pub sampling: Sampling,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            objective: Objective::default(),
            optim: OptimConfig::default(),
            groups_per_step: 4,
            group_size: 8,
            micro_batch: 4,
            scale_advantages: true,
            seed: 0,
            steps: 100,
            save_every: 50,
            sampling: Sampling::default(),
        }
    }
}

/// Scores a batch of (instance_id, completion) pairs, one result each, in order; called from
/// another thread while the next group samples.
pub type RewardFn<'a> = dyn Fn(&[(String, String)]) -> Vec<super::reward::Scored> + Sync + 'a;

/// A group as sampled, before its scores: id, prompt tokens, rows, samples.
type SampledGroup = (String, Vec<u32>, Vec<Rollout>, Vec<Sample>);

/// One completion of a group, tokenised.
#[derive(Debug, Clone)]
pub struct Seq {
    pub prompt: Vec<u32>,
    pub completion: Vec<u32>,
    /// Log-probabilities of the completion tokens under the policy that sampled them.
    pub behavior: Option<Vec<f32>>,
    pub reward: f64,
    pub format_error: bool,
    /// Whether its patch resolved the instance, when the reward ran the tests.
    pub resolved: Option<bool>,
}

#[derive(Debug, Clone)]
pub struct Group {
    pub id: String,
    pub seqs: Vec<Seq>,
}

/// What one step did (a row of metrics.parquet).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct StepMetrics {
    pub step: i64,
    pub groups: i64,
    pub groups_zero_std: i64,
    pub frac_zero_std: f64,
    pub sequences: i64,
    pub reward_mean: f64,
    pub reward_std: f64,
    pub format_error_rate: f64,
    pub loss: f64,
    pub kl: f64,
    pub clip_frac_low: f64,
    pub clip_frac_high: f64,
    pub ratio_mean: f64,
    pub entropy: f64,
    pub completion_len_mean: f64,
    pub completion_len_max: i64,
    pub tokens: i64,
    pub tokens_per_s: f64,
    pub lr: f64,
    pub grad_norm: f64,
    pub train_s: f64,
    pub generate_s: f64,
    /// Sequences whose patch ran against the tests (the test reward modes).
    pub graded: i64,
    /// Share of the graded sequences that resolved their instance (0 when none was graded).
    pub resolved_rate: f64,
}

/// Progress of a run, saved with each checkpoint.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
struct RunState {
    step: usize,
    rng: u64,
    config: Option<TrainConfig>,
}

pub struct Trainer {
    pub policy: Policy,
    reference: Option<Model>,
    opt: AdamW,
    pub cfg: TrainConfig,
    out: PathBuf,
    pub metrics: Vec<StepMetrics>,
    pub rng: Rng,
}

fn scalar(t: &Tensor) -> Result<f64> {
    Ok(t.to_dtype(DType::F64)?.to_scalar::<f64>()?)
}

impl Trainer {
    pub fn new(policy: Policy, cfg: TrainConfig, out: &Path) -> Result<Trainer> {
        if cfg.micro_batch == 0 || cfg.groups_per_step == 0 {
            bail!("micro_batch and groups_per_step must be at least 1");
        }
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        let reference = if cfg.objective.beta != 0.0 {
            let dir = out.join("reference");
            if dir.join("model.safetensors").exists() {
                Some(Model::load(&dir.join("model.safetensors"), &policy.model.device, policy.model.dtype)?)
            } else {
                policy.save(&dir)?;
                Some(policy.model.deep_clone()?)
            }
        } else {
            None
        };
        let named = policy.model.named_vars().into_iter().map(|(n, v)| (n, v.clone())).collect();
        let opt = AdamW::new(named, cfg.optim.clone())?;
        let rng = Rng::new(cfg.seed);
        Ok(Trainer { policy, reference, opt, cfg, out: out.to_path_buf(), metrics: Vec::new(), rng })
    }

    /// Steps taken so far.
    pub fn step_count(&self) -> usize {
        self.opt.step
    }

    /// Continues from the newest checkpoint in the output directory, if there is one.
    pub fn resume(&mut self) -> Result<bool> {
        let latest = self.out.join("checkpoints/latest");
        let Ok(name) = std::fs::read_to_string(&latest) else { return Ok(false) };
        let dir = self.out.join("checkpoints").join(name.trim());
        let loaded = Model::load(&dir.join("model.safetensors"), &self.policy.model.device, self.policy.model.dtype)
            .with_context(|| format!("resuming from {}", dir.display()))?;
        if loaded.cfg != self.policy.model.cfg {
            bail!("{}: checkpoint of a different model ({:?})", dir.display(), loaded.cfg);
        }
        for ((_, dst), (_, src)) in self.policy.model.named_vars().iter().zip(loaded.named_vars()) {
            dst.set(src.as_tensor())?;
        }
        self.opt.load(&dir.join("optimizer.safetensors"))?;
        let state: RunState = serde_json::from_str(&std::fs::read_to_string(dir.join("state.json"))?)?;
        self.rng = Rng::new(state.rng);
        self.metrics = read_metrics(&self.out.join("metrics.parquet"))?
            .into_iter()
            .filter(|m| (m.step as usize) < state.step)
            .collect();
        Ok(true)
    }

    pub fn save_checkpoint(&mut self) -> Result<PathBuf> {
        let name = format!("step-{:06}", self.opt.step);
        let dir = self.out.join("checkpoints").join(&name);
        let tmp = self.out.join("checkpoints").join(format!(".{name}.tmp"));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp)?;
        }
        self.policy.save(&tmp)?;
        self.opt.save(&tmp.join("optimizer.safetensors"))?;
        // The next rng state, so a resumed run samples what an uninterrupted one would.
        let state = RunState { step: self.opt.step, rng: self.rng.clone().next_u64(), config: Some(self.cfg.clone()) };
        self.rng = Rng::new(state.rng);
        std::fs::write(tmp.join("state.json"), serde_json::to_string_pretty(&state)?)?;
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::rename(&tmp, &dir)?;
        std::fs::write(self.out.join("checkpoints/latest"), &name)?;
        Ok(dir)
    }

    /// One optimiser step on `groups`.
    pub fn step(&mut self, groups: &[Group]) -> Result<StepMetrics> {
        let started = Instant::now();
        let max_seq = self.policy.model.cfg.max_seq;
        let all: Vec<&Seq> = groups.iter().flat_map(|g| g.seqs.iter()).collect();
        let rewards: Vec<f64> = all.iter().map(|s| s.reward).collect();
        let n = rewards.len().max(1) as f64;
        let reward_mean = rewards.iter().sum::<f64>() / n;
        let mut m = StepMetrics {
            step: self.opt.step as i64,
            groups: groups.len() as i64,
            sequences: all.len() as i64,
            reward_mean,
            reward_std: (rewards.iter().map(|r| (r - reward_mean).powi(2)).sum::<f64>() / n).sqrt(),
            format_error_rate: all.iter().filter(|s| s.format_error).count() as f64 / n,
            graded: all.iter().filter(|s| s.resolved.is_some()).count() as i64,
            resolved_rate: {
                let graded = all.iter().filter(|s| s.resolved.is_some()).count();
                let resolved = all.iter().filter(|s| s.resolved == Some(true)).count();
                if graded == 0 {
                    0.0
                } else {
                    resolved as f64 / graded as f64
                }
            },
            completion_len_mean: all.iter().map(|s| s.completion.len() as f64).sum::<f64>() / n,
            completion_len_max: all.iter().map(|s| s.completion.len() as i64).max().unwrap_or(0),
            ..Default::default()
        };
        // Advantages; flat groups carry no signal and are dropped.
        let mut train: Vec<(&Seq, f64)> = Vec::new();
        for g in groups {
            let r: Vec<f64> = g.seqs.iter().map(|s| s.reward).collect();
            match group_advantages(&r, self.cfg.scale_advantages) {
                Some(a) => {
                    for (s, a) in g.seqs.iter().zip(a) {
                        if s.prompt.len() + s.completion.len() > max_seq {
                            bail!(
                                "a sequence of {} tokens exceeds the model's context of {max_seq}",
                                s.prompt.len() + s.completion.len()
                            );
                        }
                        if !s.completion.is_empty() {
                            train.push((s, a));
                        }
                    }
                }
                None => m.groups_zero_std += 1,
            }
        }
        m.frac_zero_std = m.groups_zero_std as f64 / groups.len().max(1) as f64;
        let tokens: f64 = train.iter().map(|(s, _)| s.completion.len() as f64).sum();
        let norm = StepNorm { tokens, seqs: train.len() as f64 };
        let mut grads: HashMap<String, Tensor> = HashMap::new();
        let mut stats = LossStats::default();
        let (mut loss_sum, mut entropy_sum, mut processed) = (0.0, 0.0, 0usize);
        for chunk in train.chunks(self.cfg.micro_batch) {
            let mb = self.micro_batch(chunk)?;
            processed += mb.tokens;
            let logits = completion_logits(&self.policy.model, &mb)?;
            let logp = gather_logprobs(&logits, &mb.target)?;
            let current = logp.detach();
            let old = ((&mb.behavior * &mb.has_behavior)? + (current * (1.0 - &mb.has_behavior)?)?)?;
            let reference = match &self.reference {
                Some(r) => Some(gather_logprobs(&completion_logits(r, &mb)?.detach(), &mb.target)?),
                None => None,
            };
            let (l, st) = loss(&self.cfg.objective, &logp, &old, reference.as_ref(), &mb.adv, &mb.mask, norm)?;
            let ent = crate::kernels::entropy(&logits)?;
            entropy_sum += scalar(&(ent * &mb.mask)?.sum_all()?)?;
            loss_sum += scalar(&l)?;
            stats.add(&st);
            let g = l.backward()?;
            for (name, var) in self.policy.model.named_vars() {
                if let Some(t) = g.get(var.as_tensor()) {
                    let t = match grads.remove(&name) {
                        Some(prev) => (prev + t)?,
                        None => t.clone(),
                    };
                    grads.insert(name, t);
                }
            }
        }
        let info = if train.is_empty() {
            // Nothing to learn from: the schedule still advances, the weights do not move.
            self.opt.step += 1;
            super::optim::StepInfo { lr: self.opt.cfg.lr_at(self.opt.step - 1), grad_norm: 0.0 }
        } else {
            self.opt.step(&grads)?
        };
        let secs = started.elapsed().as_secs_f64();
        let t = stats.tokens.max(1.0);
        m.loss = loss_sum;
        m.kl = stats.kl_sum / t;
        m.clip_frac_low = stats.clipped_low / t;
        m.clip_frac_high = stats.clipped_high / t;
        m.ratio_mean = if stats.tokens > 0.0 { stats.ratio_sum / t } else { 1.0 };
        m.entropy = entropy_sum / t;
        m.tokens = processed as i64;
        m.tokens_per_s = processed as f64 / secs.max(1e-9);
        m.lr = info.lr;
        m.grad_norm = info.grad_norm;
        m.train_s = secs;
        self.metrics.push(m.clone());
        Ok(m)
    }

    /// The tensors of a micro-batch. Sequences are right-padded to the longest; the loss side
    /// ([B, C] tensors) covers only completion tokens, C being the longest completion, and
    /// `positions` says where each of them sits in the flattened [B·L] hidden states.
    fn micro_batch(&self, seqs: &[(&Seq, f64)]) -> Result<MicroBatch> {
        let dev = &self.policy.model.device;
        let len = seqs.iter().map(|(s, _)| s.prompt.len() + s.completion.len() - 1).max().unwrap_or(1);
        let width = seqs.iter().map(|(s, _)| s.completion.len()).max().unwrap_or(1).max(1);
        let b = seqs.len();
        let mut input = vec![0u32; b * len];
        let mut positions = vec![0u32; b * width];
        let mut target = vec![0u32; b * width];
        let (mut mask, mut behavior, mut has) = (vec![0f32; b * width], vec![0f32; b * width], vec![0f32; b * width]);
        let mut tokens = 0;
        for (i, (s, _)) in seqs.iter().enumerate() {
            let full: Vec<u32> = s.prompt.iter().chain(s.completion.iter()).copied().collect();
            tokens += full.len();
            input[i * len..i * len + full.len() - 1].copy_from_slice(&full[..full.len() - 1]);
            // Position j predicts token j+1: completion token k is predicted at p-1+k.
            let first = s.prompt.len() - 1;
            let usable = s.behavior.as_ref().filter(|bl| bl.len() == s.completion.len());
            for (k, &tok) in s.completion.iter().enumerate() {
                let at = i * width + k;
                positions[at] = (i * len + first + k) as u32;
                target[at] = tok;
                mask[at] = 1.0;
                if let Some(bl) = usable {
                    behavior[at] = bl[k];
                    has[at] = 1.0;
                }
            }
            // Padding slots point at the sequence's first completion position (masked out).
            for k in s.completion.len()..width {
                positions[i * width + k] = (i * len + first) as u32;
            }
        }
        let t = |v: Vec<f32>| Tensor::from_vec(v, (b, width), dev);
        Ok(MicroBatch {
            input: Tensor::from_vec(input, (b, len), dev)?,
            positions: Tensor::from_vec(positions, b * width, dev)?,
            target: Tensor::from_vec(target, (b, width), dev)?,
            mask: t(mask)?,
            behavior: t(behavior)?,
            has_behavior: t(has)?,
            adv: Tensor::from_vec(seqs.iter().map(|(_, a)| *a as f32).collect::<Vec<_>>(), b, dev)?,
            tokens,
        })
    }

    /// Samples a group per prompt with the current policy and scores it with `reward`
    /// (`None` = cannot be scored: left out). Returns the groups and their rollout rows.
    pub fn sample_groups(
        &mut self,
        prompts: &[(String, String)],
        reward: &RewardFn<'_>,
        mode: &str,
    ) -> Result<(Vec<Group>, Vec<Rollout>)> {
        let mut sampled: Vec<SampledGroup> = Vec::new();
        // Each group is scored on a thread of its own while the next one samples: a test
        // reward's sandboxes run beside the model instead of after it.
        let scores: Vec<Vec<super::reward::Scored>> = std::thread::scope(|scope| -> Result<_> {
            let mut handles = Vec::new();
            for (gi, (id, text)) in prompts.iter().enumerate() {
                let tok = &self.policy.tokenizer;
                let prompt = tok.encode(text)?;
                let samples = sample_group(
                    &self.policy.model,
                    &prompt,
                    self.cfg.group_size,
                    tok.eos_id(),
                    &self.cfg.sampling,
                    &mut self.rng,
                )?;
                let group_id = format!("{id}@step{}#{gi}", self.opt.step);
                let mut rows = Vec::new();
                for (k, s) in samples.iter().enumerate() {
                    rows.push(Rollout {
                        instance_id: id.clone(),
                        group_id: group_id.clone(),
                        sample_index: k as i64,
                        prompt: Some(text.clone()),
                        completion: tok.decode(&s.ids)?,
                        completion_ids: Some(s.ids.clone()),
                        behavior_logprobs: Some(s.logprobs.clone()),
                        ..Default::default()
                    });
                }
                let items: Vec<(String, String)> = rows.iter().map(|r| (id.clone(), r.completion.clone())).collect();
                handles.push(scope.spawn(move || reward(&items)));
                sampled.push((group_id, prompt, rows, samples));
            }
            handles.into_iter().map(|h| h.join().map_err(|_| anyhow::anyhow!("scoring a group panicked"))).collect()
        })?;
        let mut groups = Vec::new();
        let mut all_rows = Vec::new();
        for ((group_id, prompt, mut rows, samples), scored) in sampled.into_iter().zip(scores) {
            let mut seqs = Vec::new();
            for ((row, s), sc) in rows.iter_mut().zip(samples).zip(&scored) {
                row.set_score(mode, sc);
                if let Some(r) = sc.reward {
                    seqs.push(Seq {
                        prompt: prompt.clone(),
                        completion: s.ids,
                        behavior: Some(s.logprobs),
                        reward: r,
                        format_error: sc.malformed,
                        resolved: sc.tests.as_ref().filter(|t| t.graded()).map(|t| t.resolved),
                    });
                }
            }
            all_rows.extend(rows);
            groups.push(Group { id: group_id, seqs });
        }
        Ok((groups, all_rows))
    }

    /// Writes metrics.parquet and metrics.png.
    pub fn write_metrics(&self) -> Result<()> {
        write_metrics(&self.out.join("metrics.parquet"), &self.metrics)?;
        let series = |f: &dyn Fn(&StepMetrics) -> f64| -> Vec<(f64, f64)> {
            self.metrics.iter().map(|m| (m.step as f64, f(m))).collect()
        };
        swelake_core::charts::line_panels_png(
            &self.out.join("metrics.png"),
            "GRPO training",
            &[
                ("reward mean", series(&|m| m.reward_mean)),
                ("format-error rate", series(&|m| m.format_error_rate)),
                ("resolved rate", series(&|m| m.resolved_rate)),
                ("zero-std groups", series(&|m| m.frac_zero_std)),
                ("KL to reference", series(&|m| m.kl)),
                ("entropy", series(&|m| m.entropy)),
                ("grad norm", series(&|m| m.grad_norm)),
            ],
        )
    }
}

/// Logits [B, C, vocab] at the completion positions of a micro-batch.
fn completion_logits(model: &Model, mb: &MicroBatch) -> Result<Tensor> {
    let h = model.hidden(&mb.input, 0, None)?;
    let (b, l, d) = h.dims3()?;
    let c = mb.target.dim(1)?;
    let picked = h.reshape((b * l, d))?.index_select(&mb.positions, 0)?.reshape((b, c, d))?;
    model.head(&picked)
}

struct MicroBatch {
    input: Tensor,
    positions: Tensor,
    target: Tensor,
    mask: Tensor,
    behavior: Tensor,
    has_behavior: Tensor,
    adv: Tensor,
    tokens: usize,
}

/// Groups of rollout rows (by group_id, in order of first appearance), tokenised with
/// `policy`'s tokenizer. Prompts come from the rollout or, when absent, from `prompts`
/// (instance_id → rendered prompt). Rows without a reward are left out and counted.
pub fn groups_from_rollouts(
    rows: &[Rollout],
    policy: &Policy,
    prompts: &HashMap<String, String>,
) -> Result<(Vec<Group>, usize)> {
    let tok = &policy.tokenizer;
    let mut order: Vec<String> = Vec::new();
    let mut by: BTreeMap<String, Vec<&Rollout>> = BTreeMap::new();
    for r in rows {
        if !by.contains_key(&r.group_id) {
            order.push(r.group_id.clone());
        }
        by.entry(r.group_id.clone()).or_default().push(r);
    }
    let mut skipped = 0;
    let mut cache: HashMap<String, Vec<u32>> = HashMap::new();
    let mut groups = Vec::new();
    for gid in order {
        let mut members = by.remove(&gid).unwrap_or_default();
        members.sort_by_key(|r| r.sample_index);
        let mut seqs = Vec::new();
        for r in members {
            let Some(reward) = r.reward else {
                skipped += 1;
                continue;
            };
            let text = match (&r.prompt, prompts.get(&r.instance_id)) {
                (Some(p), _) => p.clone(),
                (None, Some(p)) => p.clone(),
                (None, None) => {
                    bail!("rollout of {} has no prompt and the seed shards do not have the instance", r.instance_id)
                }
            };
            let prompt = match cache.get(&text) {
                Some(p) => p.clone(),
                None => {
                    let p = tok.encode(&text)?;
                    cache.insert(text.clone(), p.clone());
                    p
                }
            };
            // Token ids as sampled when they fit this vocabulary; else the text, which another
            // engine produced, closed with the end-of-turn token.
            let completion = match &r.completion_ids {
                Some(ids) if ids.iter().all(|&i| (i as usize) < policy.model.cfg.vocab) => ids.clone(),
                _ => {
                    let mut ids = tok.encode(&r.completion)?;
                    ids.push(tok.eos_id());
                    ids
                }
            };
            let behavior = r.behavior_logprobs.clone().filter(|b| b.len() == completion.len());
            seqs.push(Seq { prompt, completion, behavior, reward, format_error: r.malformed(), resolved: r.resolved });
        }
        groups.push(Group { id: gid, seqs });
    }
    Ok((groups, skipped))
}

macro_rules! metric_columns {
    ($($name:ident: $kind:ident),* $(,)?) => {
        fn metrics_batch(ms: &[StepMetrics]) -> Result<RecordBatch> {
            Ok(RecordBatch::try_from_iter_with_nullable(vec![
                $((stringify!($name), metric_columns!(@col $kind, ms.iter().map(|m| m.$name)), false)),*
            ])?)
        }

        fn metrics_from_batch(b: &RecordBatch) -> Result<Vec<StepMetrics>> {
            use arrow::array::AsArray;
            let mut out = vec![StepMetrics::default(); b.num_rows()];
            $(
                // A column newer than the run being resumed reads as its default.
                if let Some(c) = b.column_by_name(stringify!($name)) {
                    for (i, m) in out.iter_mut().enumerate() {
                        m.$name = metric_columns!(@get $kind, c, i);
                    }
                }
            )*
            Ok(out)
        }
    };
    (@col i64, $it:expr) => { Arc::new(Int64Array::from_iter_values($it)) as ArrayRef };
    (@col f64, $it:expr) => { Arc::new(Float64Array::from_iter_values($it)) as ArrayRef };
    (@get i64, $c:expr, $i:expr) => { $c.as_primitive::<arrow::datatypes::Int64Type>().value($i) };
    (@get f64, $c:expr, $i:expr) => { $c.as_primitive::<arrow::datatypes::Float64Type>().value($i) };
}

metric_columns! {
    step: i64, groups: i64, groups_zero_std: i64, frac_zero_std: f64, sequences: i64, reward_mean: f64,
    reward_std: f64, format_error_rate: f64, loss: f64, kl: f64, clip_frac_low: f64, clip_frac_high: f64,
    ratio_mean: f64, entropy: f64, completion_len_mean: f64, completion_len_max: i64, tokens: i64,
    tokens_per_s: f64, lr: f64, grad_norm: f64, train_s: f64, generate_s: f64, graded: i64, resolved_rate: f64,
}

pub fn write_metrics(path: &Path, ms: &[StepMetrics]) -> Result<()> {
    let batch = metrics_batch(ms)?;
    let tmp = path.with_extension("parquet.tmp");
    let mut w = parquet::arrow::ArrowWriter::try_new(std::fs::File::create(&tmp)?, batch.schema(), None)?;
    w.write(&batch)?;
    w.close()?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

pub fn read_metrics(path: &Path) -> Result<Vec<StepMetrics>> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let file = std::fs::File::open(path)?;
    let mut out = Vec::new();
    for b in parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)?.build()? {
        out.extend(metrics_from_batch(&b?)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Config;
    use crate::tokenizer::ChatTokenizer;
    use candle_core::Device;

    fn trainer(micro_batch: usize, dir: &Path) -> Trainer {
        let mut cfg = Config::tiny(40);
        cfg.max_seq = 64;
        let policy = Policy {
            model: Model::random(cfg, 5, &Device::Cpu, DType::F32).unwrap(),
            tokenizer: ChatTokenizer::bytes().unwrap(),
        };
        let tc =
            TrainConfig { micro_batch, optim: OptimConfig { lr: 1e-2, ..Default::default() }, ..Default::default() };
        Trainer::new(policy, tc, dir).unwrap()
    }

    fn groups() -> Vec<Group> {
        let seq = |p: &[u32], c: &[u32], r: f64| Seq {
            prompt: p.to_vec(),
            completion: c.to_vec(),
            behavior: None,
            reward: r,
            format_error: false,
            resolved: None,
        };
        vec![
            Group { id: "a".into(), seqs: vec![seq(&[1, 2, 3], &[4, 5], 1.0), seq(&[1, 2, 3], &[6, 7, 8, 9], 0.0)] },
            Group {
                id: "b".into(),
                seqs: vec![seq(&[7, 7, 7, 7, 7, 7], &[1], 0.5), seq(&[7, 7, 7, 7, 7, 7], &[2, 3], -1.0)],
            },
            Group { id: "flat".into(), seqs: vec![seq(&[3], &[3, 3], 0.2), seq(&[3], &[4], 0.2)] },
        ]
    }

    #[test]
    fn completion_logits_match_a_full_forward() {
        let dir = tempfile::tempdir().unwrap();
        let t = trainer(8, dir.path());
        let g = groups();
        let seqs: Vec<(&Seq, f64)> = g.iter().flat_map(|g| g.seqs.iter()).map(|s| (s, 1.0)).collect();
        let mb = t.micro_batch(&seqs).unwrap();
        let lp: Vec<Vec<f32>> =
            gather_logprobs(&completion_logits(&t.policy.model, &mb).unwrap(), &mb.target).unwrap().to_vec2().unwrap();
        let mask: Vec<Vec<f32>> = mb.mask.to_vec2().unwrap();
        for (i, (s, _)) in seqs.iter().enumerate() {
            let full: Vec<u32> = s.prompt.iter().chain(s.completion.iter()).copied().collect();
            let x = Tensor::new(&full[..full.len() - 1], &Device::Cpu).unwrap().unsqueeze(0).unwrap();
            let y = Tensor::new(&full[1..], &Device::Cpu).unwrap().unsqueeze(0).unwrap();
            let want: Vec<f32> = gather_logprobs(&t.policy.model.forward(&x, 0, None).unwrap(), &y)
                .unwrap()
                .squeeze(0)
                .unwrap()
                .to_vec1()
                .unwrap();
            for k in 0..s.completion.len() {
                assert!((lp[i][k] - want[s.prompt.len() - 1 + k]).abs() < 1e-5, "seq {i} token {k}");
                assert_eq!(mask[i][k], 1.0);
            }
            assert!(mask[i][s.completion.len()..].iter().all(|&m| m == 0.0));
        }
    }

    #[test]
    fn accumulated_micro_batches_take_the_same_step_as_one_batch() {
        let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (mut one, mut many) = (trainer(8, d1.path()), trainer(1, d2.path()));
        // Adam's first step is ±lr wherever a gradient is non-zero, however tiny; a large eps
        // makes the update proportional to the gradient, so the weights compare the gradients.
        one.opt.cfg.eps = 1.0;
        many.opt.cfg.eps = 1.0;
        let m1 = one.step(&groups()).unwrap();
        let m2 = many.step(&groups()).unwrap();
        assert_eq!((m1.groups, m1.groups_zero_std, m1.sequences), (3, 1, 6));
        assert!((m1.loss - m2.loss).abs() < 1e-6, "{} vs {}", m1.loss, m2.loss);
        assert!((m1.grad_norm - m2.grad_norm).abs() < 1e-5 * m1.grad_norm.max(1.0));
        for ((_, a), (_, b)) in one.policy.model.named_vars().iter().zip(many.policy.model.named_vars()) {
            let d =
                (a.as_tensor() - b.as_tensor()).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            assert!(d < 1e-5, "{d}");
        }
        // On-policy: every ratio is exactly 1, nothing is clipped.
        assert_eq!((m1.ratio_mean, m1.clip_frac_low, m1.clip_frac_high), (1.0, 0.0, 0.0));
    }

    #[test]
    fn a_checkpoint_resumes_to_the_same_weights_as_an_uninterrupted_run() {
        let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut straight = trainer(2, d1.path());
        for _ in 0..3 {
            straight.step(&groups()).unwrap();
        }
        let mut first = trainer(2, d2.path());
        first.step(&groups()).unwrap();
        first.save_checkpoint().unwrap();
        first.write_metrics().unwrap();
        drop(first);
        let mut resumed = trainer(2, d2.path());
        assert!(resumed.resume().unwrap());
        assert_eq!((resumed.step_count(), resumed.metrics.len()), (1, 1));
        for _ in 0..2 {
            resumed.step(&groups()).unwrap();
        }
        for ((_, a), (_, b)) in straight.policy.model.named_vars().iter().zip(resumed.policy.model.named_vars()) {
            let d =
                (a.as_tensor() - b.as_tensor()).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            assert_eq!(d, 0.0);
        }
    }
}
