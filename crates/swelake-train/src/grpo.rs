//! The GRPO objective: group-normalised advantages and the clipped policy-gradient loss.
//!
//! For completion token t of sequence i, with r = exp(logp − logp_behaviour) and advantage A_i:
//!
//! ```text
//! L_it = −min(r·A_i, clip(r, 1−eps_low, 1+eps_high)·A_i) + beta·k3,   k3 = e^(ref−logp) − (ref−logp) − 1
//! ```
//!
//! and the loss aggregates L over completion tokens (the mask m; prompt and padding tokens never
//! contribute):
//! - `token-mean`: Σ L·m / Σ m over the whole step (DAPO's choice: long answers weigh more);
//! - `seq-mean-token-mean`: the mean over sequences of each sequence's token mean (GRPO paper);
//! - `seq-mean-token-sum-norm`: the mean over sequences of Σ_t L·m / `norm_len` (Dr. GRPO: a
//!   constant length, so no length bias).
//!
//! The denominators are those of the whole optimiser step ([`StepNorm`]), so losses of
//! micro-batches summed under gradient accumulation equal the loss of the full batch.

use anyhow::{bail, Result};
use candle_core::{Tensor, D};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LossAgg {
    TokenMean,
    SeqMeanTokenMean,
    SeqMeanTokenSumNorm,
}

impl std::fmt::Display for LossAgg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LossAgg::TokenMean => "token-mean",
            LossAgg::SeqMeanTokenMean => "seq-mean-token-mean",
            LossAgg::SeqMeanTokenSumNorm => "seq-mean-token-sum-norm",
        })
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Objective {
    pub eps_low: f64,
    pub eps_high: f64,
    /// Coefficient of the k3 KL estimate to the reference policy (0 = no reference needed).
    pub beta: f64,
    pub agg: LossAgg,
    /// The constant length of `seq-mean-token-sum-norm` (usually the maximum completion length).
    pub norm_len: usize,
}

impl Default for Objective {
    fn default() -> Self {
        // eps_high > eps_low is DAPO's clip-higher, which keeps exploration alive.
        Objective { eps_low: 0.2, eps_high: 0.28, beta: 0.0, agg: LossAgg::TokenMean, norm_len: 512 }
    }
}

/// Denominators over the whole optimiser step.
#[derive(Debug, Clone, Copy)]
pub struct StepNorm {
    /// Completion tokens in the step.
    pub tokens: f64,
    /// Sequences in the step.
    pub seqs: f64,
}

impl StepNorm {
    pub fn of(mask: &Tensor) -> Result<StepNorm> {
        Ok(StepNorm {
            tokens: mask.sum_all()?.to_dtype(candle_core::DType::F64)?.to_scalar()?,
            seqs: mask.dim(0)? as f64,
        })
    }
}

/// Statistics of one loss evaluation (sums, so micro-batches add up).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LossStats {
    pub tokens: f64,
    /// Tokens where the lower clip bound is active (A < 0, r < 1 − eps_low).
    pub clipped_low: f64,
    /// Tokens where the upper clip bound is active (A > 0, r > 1 + eps_high).
    pub clipped_high: f64,
    /// Σ k3 over tokens (0 without a reference).
    pub kl_sum: f64,
    pub ratio_sum: f64,
}

impl LossStats {
    pub fn add(&mut self, o: &LossStats) {
        self.tokens += o.tokens;
        self.clipped_low += o.clipped_low;
        self.clipped_high += o.clipped_high;
        self.kl_sum += o.kl_sum;
        self.ratio_sum += o.ratio_sum;
    }
}

fn scalar(t: &Tensor) -> Result<f64> {
    Ok(t.to_dtype(candle_core::DType::F64)?.to_scalar::<f64>()?)
}

/// The loss of a micro-batch. `logp`, `old_logp`, `ref_logp` and `mask` are [B, L] (mask 1 on
/// completion tokens), `adv` is \[B\]. Only `logp` carries gradient.
pub fn loss(
    obj: &Objective,
    logp: &Tensor,
    old_logp: &Tensor,
    ref_logp: Option<&Tensor>,
    adv: &Tensor,
    mask: &Tensor,
    norm: StepNorm,
) -> Result<(Tensor, LossStats)> {
    if obj.beta != 0.0 && ref_logp.is_none() {
        bail!("beta = {} needs reference log-probabilities", obj.beta);
    }
    let old_logp = old_logp.detach();
    let mask = mask.detach();
    let adv = adv.detach().unsqueeze(1)?;
    let ratio = (logp - &old_logp)?.exp()?;
    let surr = ratio.broadcast_mul(&adv)?;
    let clipped = ratio.clamp(1.0 - obj.eps_low, 1.0 + obj.eps_high)?.broadcast_mul(&adv)?;
    let mut per_token = surr.minimum(&clipped)?.neg()?;
    let mut kl_sum = 0.0;
    if let Some(r) = ref_logp {
        let d = (r.detach() - logp)?;
        let k3 = ((d.exp()? - &d)? - 1.0)?;
        kl_sum = scalar(&(k3.detach() * &mask)?.sum_all()?)?;
        if obj.beta != 0.0 {
            per_token = (per_token + (k3 * obj.beta)?)?;
        }
    }
    let masked = (per_token * &mask)?;
    let total = match obj.agg {
        LossAgg::TokenMean => (masked.sum_all()? / norm.tokens.max(1.0))?,
        LossAgg::SeqMeanTokenMean => {
            let len = mask.sum(D::Minus1)?.clamp(1.0, f64::INFINITY)?;
            (masked.sum(D::Minus1)?.div(&len)?.sum_all()? / norm.seqs.max(1.0))?
        }
        LossAgg::SeqMeanTokenSumNorm => (masked.sum_all()? / (norm.seqs.max(1.0) * obj.norm_len.max(1) as f64))?,
    };
    // Statistics from detached values.
    let r = ratio.detach();
    let a = adv.broadcast_as(r.shape())?;
    let zeros = a.zeros_like()?;
    let low = (r.lt(1.0 - obj.eps_low)?.to_dtype(mask.dtype())? * a.lt(&zeros)?.to_dtype(mask.dtype())?)?;
    let high = (r.gt(1.0 + obj.eps_high)?.to_dtype(mask.dtype())? * a.gt(&zeros)?.to_dtype(mask.dtype())?)?;
    let stats = LossStats {
        tokens: scalar(&mask.sum_all()?)?,
        clipped_low: scalar(&(low * &mask)?.sum_all()?)?,
        clipped_high: scalar(&(high * &mask)?.sum_all()?)?,
        kl_sum,
        ratio_sum: scalar(&(r * &mask)?.sum_all()?)?,
    };
    Ok((total, stats))
}

/// Advantages of one group's rewards: r − mean, divided by the (sample) standard deviation
/// when `scale`. `None` when every reward is equal: such a group carries no signal.
pub fn group_advantages(rewards: &[f64], scale: bool) -> Option<Vec<f64>> {
    let n = rewards.len();
    if n < 2 {
        return None;
    }
    let mean = rewards.iter().sum::<f64>() / n as f64;
    let var = rewards.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    let std = var.sqrt();
    if std < 1e-12 {
        return None;
    }
    Some(rewards.iter().map(|r| if scale { (r - mean) / (std + 1e-6) } else { r - mean }).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn t(rows: &[&[f64]]) -> Tensor {
        let flat: Vec<f64> = rows.iter().flat_map(|r| r.iter().copied()).collect();
        Tensor::from_vec(flat, (rows.len(), rows[0].len()), &Device::Cpu).unwrap()
    }

    // Two sequences of three positions; the second has one padding position.
    // ratios: seq 0: e^0.1, e^-0.5, e^0.4 (A = +1); seq 1: e^-0.3, e^0.2, pad (A = −2).
    fn setup() -> (Var, Tensor, Tensor, Tensor, Tensor) {
        let old = t(&[&[-1.0, -2.0, -0.5], &[-1.5, -0.7, -3.0]]);
        let new = t(&[&[-0.9, -2.5, -0.1], &[-1.8, -0.5, -9.0]]);
        let reference = t(&[&[-1.2, -2.0, -0.3], &[-1.5, -0.6, -1.0]]);
        let adv = Tensor::new(&[1.0f64, -2.0], &Device::Cpu).unwrap();
        let mask = t(&[&[1.0, 1.0, 1.0], &[1.0, 1.0, 0.0]]);
        (Var::from_tensor(&new).unwrap(), old, reference, adv, mask)
    }

    /// The per-token losses written out by hand (eps_low 0.2, eps_high 0.28, beta 0.1).
    fn hand_tokens() -> [[f64; 3]; 2] {
        let e = f64::exp;
        let k3 = |refl: f64, lp: f64| e(refl - lp) - (refl - lp) - 1.0;
        [
            [
                // r = e^0.1 = 1.105 within [0.8, 1.28]: −r·A.
                -e(0.1) + 0.1 * k3(-1.2, -0.9),
                // r = e^-0.5 = 0.607 < 0.8 but A > 0: min(r·A, 0.8·A) = r·A, unclipped.
                -e(-0.5) + 0.1 * k3(-2.0, -2.5),
                // r = e^0.4 = 1.49 > 1.28 with A > 0: the clip is active, −1.28·A.
                -1.28 + 0.1 * k3(-0.3, -0.1),
            ],
            [
                // r = e^-0.3 = 0.741 < 0.8 with A < 0: clipped, min(−2r, −1.6) = −1.6.
                1.6 + 0.1 * k3(-1.5, -1.8),
                // r = e^0.2 = 1.22 with A < 0: min(−2.44, −2.44) — inside the band.
                2.0 * e(0.2) + 0.1 * k3(-0.6, -0.5),
                0.0,
            ],
        ]
    }

    fn run(agg: LossAgg, beta: f64) -> (f64, LossStats, Tensor) {
        let (new, old, reference, adv, mask) = setup();
        let obj = Objective { eps_low: 0.2, eps_high: 0.28, beta, agg, norm_len: 4 };
        let norm = StepNorm::of(&mask).unwrap();
        let (l, stats) = loss(&obj, new.as_tensor(), &old, Some(&reference), &adv, &mask, norm).unwrap();
        let g = l.backward().unwrap().get(new.as_tensor()).unwrap().clone();
        (l.to_scalar::<f64>().unwrap(), stats, g)
    }

    #[test]
    fn aggregation_modes_match_hand_computed_values() {
        let h = hand_tokens();
        let s0: f64 = h[0].iter().sum();
        let s1: f64 = h[1].iter().sum();
        let cases = [
            (LossAgg::TokenMean, (s0 + s1) / 5.0),
            (LossAgg::SeqMeanTokenMean, (s0 / 3.0 + s1 / 2.0) / 2.0),
            (LossAgg::SeqMeanTokenSumNorm, (s0 + s1) / (2.0 * 4.0)),
        ];
        for (agg, want) in cases {
            let (got, stats, _) = run(agg, 0.1);
            assert!((got - want).abs() < 1e-12, "{agg}: {got} vs {want}");
            assert_eq!((stats.tokens, stats.clipped_low, stats.clipped_high), (5.0, 1.0, 1.0), "{agg}");
        }
    }

    #[test]
    fn clipped_tokens_get_no_policy_gradient_and_kl_pulls_to_the_reference() {
        // Without KL: d/dlogp of −r·A is −r·A where the clip is inactive, 0 where it is active.
        let (_, stats, g) = run(LossAgg::TokenMean, 0.0);
        let g: Vec<Vec<f64>> = g.to_vec2().unwrap();
        let e = f64::exp;
        let want = [[-e(0.1) / 5.0, -e(-0.5) / 5.0, 0.0], [0.0, 2.0 * e(0.2) / 5.0, 0.0]];
        for i in 0..2 {
            for j in 0..3 {
                assert!((g[i][j] - want[i][j]).abs() < 1e-12, "[{i}][{j}] {} vs {}", g[i][j], want[i][j]);
            }
        }
        // k3 is still reported without beta.
        let h_kl = |refl: f64, lp: f64| e(refl - lp) - (refl - lp) - 1.0;
        let kl = h_kl(-1.2, -0.9) + h_kl(-2.0, -2.5) + h_kl(-0.3, -0.1) + h_kl(-1.5, -1.8) + h_kl(-0.6, -0.5);
        assert!((stats.kl_sum - kl).abs() < 1e-12);
        // With KL on a clipped token: gradient beta·(1 − e^(ref−logp)) / tokens.
        let (_, _, g) = run(LossAgg::TokenMean, 0.1);
        let g: Vec<Vec<f64>> = g.to_vec2().unwrap();
        let want = 0.1 * (1.0 - e(-0.3 + 0.1)) / 5.0;
        assert!((g[0][2] - want).abs() < 1e-12, "{} vs {want}", g[0][2]);
        // Padding never gets gradient.
        assert_eq!(g[1][2], 0.0);
    }

    #[test]
    fn micro_batches_add_up_to_the_full_batch() {
        let (new, old, reference, adv, mask) = setup();
        for agg in [LossAgg::TokenMean, LossAgg::SeqMeanTokenMean, LossAgg::SeqMeanTokenSumNorm] {
            let obj = Objective { eps_low: 0.2, eps_high: 0.28, beta: 0.05, agg, norm_len: 4 };
            let norm = StepNorm::of(&mask).unwrap();
            let full = loss(&obj, new.as_tensor(), &old, Some(&reference), &adv, &mask, norm).unwrap().0;
            let mut parts = 0.0;
            for i in 0..2 {
                let n = |x: &Tensor| x.narrow(0, i, 1).unwrap();
                let (l, _) =
                    loss(&obj, &n(new.as_tensor()), &n(&old), Some(&n(&reference)), &n(&adv), &n(&mask), norm).unwrap();
                parts += l.to_scalar::<f64>().unwrap();
            }
            assert!((full.to_scalar::<f64>().unwrap() - parts).abs() < 1e-12, "{agg}");
        }
    }

    #[test]
    fn advantages_are_group_normalised_and_flat_groups_dropped() {
        let a = group_advantages(&[1.0, 0.0, 0.0, 1.0], true).unwrap();
        // mean 0.5, sample std sqrt(1/3).
        let s = (1.0f64 / 3.0).sqrt() + 1e-6;
        assert_eq!(a, vec![0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s]);
        assert_eq!(group_advantages(&[1.0, 0.0, 0.5], false).unwrap(), vec![0.5, -0.5, 0.0]);
        assert_eq!(group_advantages(&[-1.0, -1.0, -1.0], true), None);
        assert_eq!(group_advantages(&[0.3], true), None);
    }
}
