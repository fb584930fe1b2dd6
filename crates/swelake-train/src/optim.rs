//! AdamW with global-norm gradient clipping and a warm-up + cosine learning-rate schedule.
//! Written here rather than taken from candle-nn because a resumable run must save and restore
//! the moment estimates, which candle-nn's optimiser keeps private.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result};
use candle_core::{Tensor, Var};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct OptimConfig {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// Global gradient-norm bound (0 = no clipping).
    pub max_grad_norm: f64,
    pub warmup_steps: usize,
    pub total_steps: usize,
    /// Final learning rate as a fraction of `lr`.
    pub min_lr_ratio: f64,
}

impl Default for OptimConfig {
    fn default() -> Self {
        OptimConfig {
            lr: 1e-6,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            max_grad_norm: 1.0,
            warmup_steps: 0,
            total_steps: 100,
            min_lr_ratio: 0.0,
        }
    }
}

impl OptimConfig {
    /// The learning rate of optimiser step `step` (0-based): linear warm-up to `lr`, then a
    /// cosine decay to `lr·min_lr_ratio` at `total_steps`.
    pub fn lr_at(&self, step: usize) -> f64 {
        if step < self.warmup_steps {
            return self.lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let span = self.total_steps.saturating_sub(self.warmup_steps).max(1);
        let progress = ((step - self.warmup_steps) as f64 / span as f64).min(1.0);
        let min = self.lr * self.min_lr_ratio;
        min + (self.lr - min) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
    }
}

pub struct AdamW {
    pub cfg: OptimConfig,
    vars: Vec<(String, Var)>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    /// Optimiser steps taken.
    pub step: usize,
}

/// What one optimiser step did.
#[derive(Debug, Clone, Copy)]
pub struct StepInfo {
    pub lr: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
}

/// Zeros like `t`, on the CPU written out rather than calloc'd. A calloc'd buffer maps the
/// kernel's shared zero page, so the first in-place update takes a copy-on-write fault and a
/// TLB flush on every CPU for each 4 KiB page: ~5 s for SmolLM2's two moments in the first step.
fn written_zeros(t: &Tensor) -> candle_core::Result<Tensor> {
    fn filled<T: Clone + Default>(n: usize) -> Vec<T> {
        let mut v = Vec::with_capacity(n);
        v.resize(n, T::default());
        v
    }
    match (t.device().is_cpu(), t.dtype()) {
        (true, candle_core::DType::F32) => Tensor::from_vec(filled::<f32>(t.elem_count()), t.shape(), t.device()),
        (true, candle_core::DType::F64) => Tensor::from_vec(filled::<f64>(t.elem_count()), t.shape(), t.device()),
        _ => t.zeros_like(),
    }
}

impl AdamW {
    pub fn new(vars: Vec<(String, Var)>, cfg: OptimConfig) -> Result<AdamW> {
        // Two separate allocations: the CPU update writes each moment in place.
        let zeros = || vars.iter().map(|(_, v)| written_zeros(v.as_tensor())).collect::<candle_core::Result<Vec<_>>>();
        let (m, v) = (zeros()?, zeros()?);
        Ok(AdamW { cfg, vars, m, v, step: 0 })
    }

    /// Applies accumulated gradients (by parameter name; a missing entry counts as zero).
    pub fn step(&mut self, grads: &HashMap<String, Tensor>) -> Result<StepInfo> {
        let mut sq = 0.0f64;
        for g in grads.values() {
            sq += crate::kernels::adamw::sum_sq(g)?;
        }
        let grad_norm = sq.sqrt();
        let scale = if self.cfg.max_grad_norm > 0.0 && grad_norm > self.cfg.max_grad_norm {
            self.cfg.max_grad_norm / (grad_norm + 1e-6)
        } else {
            1.0
        };
        let lr = self.cfg.lr_at(self.step);
        self.step += 1;
        let t = self.step as i32;
        let (b1, b2) = (self.cfg.beta1, self.cfg.beta2);
        let (c1, c2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
        for (i, (name, var)) in self.vars.iter().enumerate() {
            let Some(g) = grads.get(name) else { continue };
            let h = crate::kernels::adamw::Hyper {
                b1,
                b2,
                c1,
                c2,
                lr,
                eps: self.cfg.eps,
                wd: self.cfg.weight_decay,
                scale,
            };
            if crate::kernels::adamw::update(var.as_tensor(), g, &self.m[i], &self.v[i], h)? {
                continue;
            }
            let g = (g * scale)?;
            self.m[i] = ((&self.m[i] * b1)? + (&g * (1.0 - b1))?)?;
            self.v[i] = ((&self.v[i] * b2)? + (g.sqr()? * (1.0 - b2))?)?;
            let mhat = (&self.m[i] / c1)?;
            let vhat = (&self.v[i] / c2)?;
            let update = (mhat / (vhat.sqrt()? + self.cfg.eps)?)?;
            let decayed = (var.as_tensor() * (1.0 - lr * self.cfg.weight_decay))?;
            var.set(&(decayed - (update * lr)?)?)?;
        }
        Ok(StepInfo { lr, grad_norm })
    }

    /// Saves the moments and the step count as safetensors.
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut t = HashMap::new();
        for (i, (name, _)) in self.vars.iter().enumerate() {
            t.insert(format!("m.{name}"), self.m[i].clone());
            t.insert(format!("v.{name}"), self.v[i].clone());
        }
        let dev = self.m.first().map(|m| m.device().clone()).unwrap_or(candle_core::Device::Cpu);
        t.insert("step".into(), Tensor::new(&[self.step as u32], &dev)?);
        candle_core::safetensors::save(&t, path)?;
        Ok(())
    }

    pub fn load(&mut self, path: &Path) -> Result<()> {
        let dev = self.vars.first().map(|(_, v)| v.device().clone()).unwrap_or(candle_core::Device::Cpu);
        let mut t = candle_core::safetensors::load(path, &dev)?;
        for (i, (name, var)) in self.vars.iter().enumerate() {
            self.m[i] = t
                .remove(&format!("m.{name}"))
                .with_context(|| format!("optimizer state without m.{name}"))?
                .to_dtype(var.dtype())?;
            self.v[i] = t
                .remove(&format!("v.{name}"))
                .with_context(|| format!("optimizer state without v.{name}"))?
                .to_dtype(var.dtype())?;
        }
        self.step = t.remove("step").context("optimizer state without step")?.to_vec1::<u32>()?[0] as usize;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn schedule_warms_up_then_follows_a_cosine() {
        let c = OptimConfig { lr: 1.0, warmup_steps: 4, total_steps: 14, min_lr_ratio: 0.1, ..Default::default() };
        assert_eq!(c.lr_at(0), 0.25);
        assert_eq!(c.lr_at(3), 1.0);
        assert!((c.lr_at(4) - 1.0).abs() < 1e-12);
        assert!((c.lr_at(9) - 0.55).abs() < 1e-12); // half-way: (1 + 0.1) / 2
        assert!((c.lr_at(14) - 0.1).abs() < 1e-12);
        assert!((c.lr_at(100) - 0.1).abs() < 1e-12);
    }

    #[test]
    fn adamw_matches_the_closed_form_first_step_and_clips() {
        let w = Var::from_tensor(&Tensor::new(&[1.0f64, -2.0], &Device::Cpu).unwrap()).unwrap();
        let cfg =
            OptimConfig { lr: 0.1, weight_decay: 0.5, max_grad_norm: 1.0, total_steps: 1000, ..Default::default() };
        let mut opt = AdamW::new(vec![("w".into(), w.clone())], cfg).unwrap();
        // Norm 5 is clipped to 1: g = (0.6, 0.8). The first Adam update is g/|g| per coordinate
        // (bias-corrected m/sqrt(v)), i.e. ±1 up to eps.
        let g = HashMap::from([("w".to_string(), Tensor::new(&[3.0f64, 4.0], &Device::Cpu).unwrap())]);
        let info = opt.step(&g).unwrap();
        assert!((info.grad_norm - 5.0).abs() < 1e-12);
        let got: Vec<f64> = w.as_tensor().to_vec1().unwrap();
        let lr = 0.1;
        let want = [1.0 * (1.0 - lr * 0.5) - lr, -2.0 * (1.0 - lr * 0.5) - lr];
        for (a, b) in got.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{got:?} vs {want:?}");
        }
        // State round-trips.
        let dir = tempfile::tempdir().unwrap();
        opt.save(&dir.path().join("o.safetensors")).unwrap();
        let mut other = AdamW::new(vec![("w".into(), w.clone())], opt.cfg.clone()).unwrap();
        other.load(&dir.path().join("o.safetensors")).unwrap();
        assert_eq!(other.step, 1);
        assert_eq!(other.m[0].to_vec1::<f64>().unwrap(), opt.m[0].to_vec1::<f64>().unwrap());
    }

    /// Several steps of the in-place CPU update against AdamW written out per element, in
    /// both float types, with a transposed (non-contiguous) gradient and clipping on.
    #[test]
    fn in_place_update_follows_adamw_per_element_over_steps() {
        for dtype in [candle_core::DType::F64, candle_core::DType::F32] {
            let w0: Vec<f64> = (0..6).map(|i| (i as f64 - 2.5) * 0.3).collect();
            let w = Var::from_tensor(
                &Tensor::new(w0.as_slice(), &Device::Cpu).unwrap().reshape((2, 3)).unwrap().to_dtype(dtype).unwrap(),
            )
            .unwrap();
            let cfg = OptimConfig {
                lr: 0.05,
                weight_decay: 0.1,
                max_grad_norm: 2.0,
                total_steps: 1000,
                ..Default::default()
            };
            let mut opt = AdamW::new(vec![("w".into(), w.clone())], cfg.clone()).unwrap();
            let (mut rw, mut m, mut v) = (w0.clone(), [0.0f64; 6], [0.0f64; 6]);
            for step in 1..=4 {
                // Gradient given as the transpose of a [3, 2] tensor.
                let gt: Vec<f64> = (0..6).map(|i| ((i * 7 + step * 3) % 5) as f64 - 2.0 + 0.25 * step as f64).collect();
                let g = Tensor::new(gt.as_slice(), &Device::Cpu).unwrap().reshape((3, 2)).unwrap().t().unwrap();
                assert!(!g.is_contiguous());
                let flat: Vec<f64> = g.flatten_all().unwrap().to_vec1().unwrap();
                let g = g.to_dtype(dtype).unwrap();
                opt.step(&HashMap::from([("w".to_string(), g)])).unwrap();
                let norm = flat.iter().map(|x| x * x).sum::<f64>().sqrt();
                let scale = if norm > cfg.max_grad_norm { cfg.max_grad_norm / (norm + 1e-6) } else { 1.0 };
                let lr = cfg.lr_at(step - 1);
                for k in 0..6 {
                    let g = flat[k] * scale;
                    m[k] = cfg.beta1 * m[k] + (1.0 - cfg.beta1) * g;
                    v[k] = cfg.beta2 * v[k] + (1.0 - cfg.beta2) * g * g;
                    let mhat = m[k] / (1.0 - cfg.beta1.powi(step as i32));
                    let vhat = v[k] / (1.0 - cfg.beta2.powi(step as i32));
                    rw[k] = rw[k] * (1.0 - lr * cfg.weight_decay) - lr * mhat / (vhat.sqrt() + cfg.eps);
                }
                let got: Vec<f64> =
                    w.as_tensor().to_dtype(candle_core::DType::F64).unwrap().flatten_all().unwrap().to_vec1().unwrap();
                let tol = if dtype == candle_core::DType::F64 { 1e-12 } else { 1e-5 };
                for k in 0..6 {
                    assert!((got[k] - rw[k]).abs() < tol, "{dtype:?} step {step} element {k}: {} vs {}", got[k], rw[k]);
                }
            }
            // The two moments are separate buffers (an update of one must not show in the other).
            let (m1, v1): (Vec<f64>, Vec<f64>) = (
                opt.m[0].to_dtype(candle_core::DType::F64).unwrap().flatten_all().unwrap().to_vec1().unwrap(),
                opt.v[0].to_dtype(candle_core::DType::F64).unwrap().flatten_all().unwrap().to_vec1().unwrap(),
            );
            let tol = if dtype == candle_core::DType::F64 { 1e-12 } else { 1e-5 };
            for k in 0..6 {
                assert!((m1[k] - m[k]).abs() < tol && (v1[k] - v[k]).abs() < tol, "{dtype:?} moments {k}");
            }
        }
    }
}
