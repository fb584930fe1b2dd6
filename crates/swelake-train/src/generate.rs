//! Sampling completions from the policy: temperature and nucleus (top-p) sampling with a KV
//! cache, G completions of one prompt decoded together as one batch, reproducible from a seed.

use anyhow::{bail, Result};
use candle_core::{DType, Tensor};

use super::model::{KvCache, Model};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Sampling {
    /// 0 = greedy.
    pub temperature: f64,
    pub top_p: f64,
    pub max_new_tokens: usize,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling { temperature: 1.0, top_p: 1.0, max_new_tokens: 256 }
    }
}

/// One sampled completion.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Completion tokens, ending with the end-of-turn token when the model produced it.
    pub ids: Vec<u32>,
    /// log π(token) of each completion token under the sampling policy's raw distribution
    /// (temperature 1, no top-p), which is what the trainer's ratio compares against.
    pub logprobs: Vec<f32>,
    /// Whether the model ended the turn (false: cut at max_new_tokens).
    pub finished: bool,
}

pub use swelake_core::rng::Rng;

/// Picks a token from `logits` (one row): greedy at temperature 0, else softmax(logits / T)
/// restricted to the smallest set of tokens whose probability reaches `top_p`.
pub fn pick(logits: &[f32], s: &Sampling, rng: &mut Rng) -> u32 {
    let argmax = || {
        let mut best = 0;
        for (i, &x) in logits.iter().enumerate() {
            if x > logits[best] {
                best = i;
            }
        }
        best as u32
    };
    if s.temperature <= 0.0 {
        return argmax();
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let mut probs: Vec<(f64, u32)> =
        logits.iter().enumerate().map(|(i, &x)| (((x as f64 - max) / s.temperature).exp(), i as u32)).collect();
    let total: f64 = probs.iter().map(|p| p.0).sum();
    let mut keep = probs.len();
    if s.top_p < 1.0 {
        probs.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut acc = 0.0;
        for (i, p) in probs.iter().enumerate() {
            acc += p.0 / total;
            if acc >= s.top_p {
                keep = i + 1;
                break;
            }
        }
    }
    let kept_total: f64 = probs[..keep].iter().map(|p| p.0).sum();
    let mut u = rng.uniform() * kept_total;
    for p in &probs[..keep] {
        if u < p.0 {
            return p.1;
        }
        u -= p.0;
    }
    probs[keep - 1].1
}

/// Samples `n` completions of `prompt` (token ids), stopping each at `eos`.
pub fn sample_group(
    model: &Model,
    prompt: &[u32],
    n: usize,
    eos: u32,
    s: &Sampling,
    rng: &mut Rng,
) -> Result<Vec<Sample>> {
    if prompt.is_empty() {
        bail!("empty prompt");
    }
    let room = model.cfg.max_seq.saturating_sub(prompt.len());
    if room == 0 {
        bail!("prompt of {} tokens leaves no room in the model's context of {}", prompt.len(), model.cfg.max_seq);
    }
    let max_new = s.max_new_tokens.min(room);
    let mut out: Vec<Sample> = (0..n).map(|_| Sample { ids: vec![], logprobs: vec![], finished: false }).collect();
    let mut cache = KvCache::default();
    // The prompt once, then its cache copied to every row: prefill costs one sequence, not n.
    let p = Tensor::new(prompt, &model.device)?.unsqueeze(0)?;
    let hidden = model.hidden(&p, 0, Some(&mut cache))?;
    cache.repeat_rows(n)?;
    let mut last = model.head(&hidden.narrow(1, prompt.len() - 1, 1)?.squeeze(1)?)?.repeat((n, 1))?;
    for step in 0..max_new {
        let lp = super::model::log_softmax(&last.to_dtype(DType::F32)?)?;
        let rows: Vec<Vec<f32>> = last.to_dtype(DType::F32)?.to_vec2()?;
        let lps: Vec<Vec<f32>> = lp.to_vec2()?;
        let mut next = Vec::with_capacity(n);
        for (i, sample) in out.iter_mut().enumerate() {
            if sample.finished {
                next.push(eos);
                continue;
            }
            let tok = pick(&rows[i], s, rng);
            sample.ids.push(tok);
            sample.logprobs.push(lps[i][tok as usize]);
            sample.finished = tok == eos;
            next.push(tok);
        }
        if out.iter().all(|x| x.finished) || step + 1 == max_new {
            break;
        }
        let input = Tensor::new(next.as_slice(), &model.device)?.unsqueeze(1)?;
        last = model.forward(&input, prompt.len() + step, Some(&mut cache))?.squeeze(1)?;
    }
    Ok(out)
}

/// Log-probabilities of `targets` [B, T] under `logits` [B, T, V], as [B, T].
pub fn gather_logprobs(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    crate::kernels::target_logprobs(logits, targets)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Config;
    use candle_core::Device;

    #[test]
    fn top_p_keeps_the_nucleus_and_temperature_zero_is_greedy() {
        let logits = [0.0f32, (4.0f32).ln(), (3.0f32).ln(), (2.0f32).ln()];
        // Probabilities 0.1, 0.4, 0.3, 0.2: top-p 0.6 keeps tokens 1 and 2 only.
        let s = Sampling { temperature: 1.0, top_p: 0.6, max_new_tokens: 1 };
        let mut rng = Rng::new(3);
        let mut counts = [0usize; 4];
        for _ in 0..4000 {
            counts[pick(&logits, &s, &mut rng) as usize] += 1;
        }
        assert_eq!((counts[0], counts[3]), (0, 0));
        // 4:3 within the nucleus.
        let share = counts[1] as f64 / 4000.0;
        assert!((share - 4.0 / 7.0).abs() < 0.03, "{counts:?}");
        let g = Sampling { temperature: 0.0, ..s };
        assert_eq!(pick(&logits, &g, &mut rng), 1);
    }

    #[test]
    fn sampled_logprobs_match_a_full_forward_and_seeds_reproduce() {
        let mut cfg = Config::tiny(40);
        cfg.max_seq = 64;
        let m = Model::random(cfg, 1, &Device::Cpu, DType::F32).unwrap();
        let s = Sampling { temperature: 1.0, top_p: 1.0, max_new_tokens: 12 };
        let prompt = [1u32, 2, 3, 4, 5];
        let a = sample_group(&m, &prompt, 3, 39, &s, &mut Rng::new(9)).unwrap();
        let b = sample_group(&m, &prompt, 3, 39, &s, &mut Rng::new(9)).unwrap();
        assert_eq!(a, b);
        assert_ne!(a[0].ids, a[1].ids, "rows sample independently");
        // The cached incremental log-probs equal those of one forward over prompt + completion.
        for smp in &a {
            let full: Vec<u32> = prompt.iter().chain(smp.ids.iter()).copied().collect();
            let t = Tensor::new(full.as_slice(), &Device::Cpu).unwrap().unsqueeze(0).unwrap();
            let logits = m.forward(&t.narrow(1, 0, full.len() - 1).unwrap(), 0, None).unwrap();
            let lp = gather_logprobs(&logits, &t.narrow(1, 1, full.len() - 1).unwrap()).unwrap();
            let lp: Vec<f32> = lp.squeeze(0).unwrap().to_vec1().unwrap();
            for (i, x) in smp.logprobs.iter().enumerate() {
                assert!((lp[prompt.len() - 1 + i] - x).abs() < 1e-4, "{i}: {} vs {x}", lp[prompt.len() - 1 + i]);
            }
        }
    }
}
