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
            sq += fused::sum_sq(g)?;
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
            let h = Hyper { b1, b2, c1, c2, lr, eps: self.cfg.eps, wd: self.cfg.weight_decay, scale };
            if fused::update(var.as_tensor(), g, &self.m[i], &self.v[i], h)? {
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

/// The constants of one AdamW update.
#[derive(Clone, Copy)]
struct Hyper {
    b1: f64,
    b2: f64,
    /// Bias corrections `1 − β^t`.
    c1: f64,
    c2: f64,
    lr: f64,
    eps: f64,
    wd: f64,
    /// Gradient clipping factor.
    scale: f64,
}

/// AdamW on CPU in place, in one pass over weights, gradient and moments, where the composed
/// tensor expressions make ~14 passes and as many fresh weight-sized allocations (for
/// SmolLM2, 540 MB each, page-faulted in every step).
mod fused {
    use super::super::fused::simd_fn;
    use super::super::layers::Real;
    use super::Hyper;
    use anyhow::Result;
    use candle_core::{CpuStorage, CustomOp1, DType, InplaceOp1, InplaceOp2, Layout, Shape, Tensor};
    use rayon::prelude::*;

    const CHUNK: usize = 1 << 14;
    /// Below this many elements one thread does it all: handing work to the pool costs more
    /// than the work (the tiny model's tensors).
    const PARALLEL_FROM: usize = 1 << 16;

    fn contiguous<'a, T>(s: &'a [T], l: &Layout) -> candle_core::Result<&'a [T]> {
        match l.contiguous_offsets() {
            Some((a, b)) => Ok(&s[a..b]),
            None => candle_core::bail!("fused AdamW needs contiguous tensors"),
        }
    }

    fn contiguous_mut<'a, T>(s: &'a mut [T], l: &Layout) -> candle_core::Result<&'a mut [T]> {
        match l.contiguous_offsets() {
            Some((a, b)) => Ok(&mut s[a..b]),
            None => candle_core::bail!("fused AdamW needs contiguous tensors"),
        }
    }

    /// Σ x², for the global gradient norm.
    pub fn sum_sq(t: &Tensor) -> Result<f64> {
        if t.device().is_cpu() && matches!(t.dtype(), DType::F32 | DType::F64) {
            let s = t.contiguous()?.flatten_all()?.apply_op1_no_bwd(&SumSq)?;
            return Ok(s.to_dtype(DType::F64)?.reshape(())?.to_scalar::<f64>()?);
        }
        Ok(t.sqr()?.sum_all()?.to_dtype(DType::F64)?.to_scalar::<f64>()?)
    }

    struct SumSq;

    impl CustomOp1 for SumSq {
        fn name(&self) -> &'static str {
            "sum-sq"
        }

        fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
            let total: f64 = match s {
                CpuStorage::F32(x) => {
                    let part = |c: &[f32]| c.iter().map(|&v| v * v).sum::<f32>() as f64;
                    let x = contiguous(x, l)?;
                    if x.len() < PARALLEL_FROM {
                        x.chunks(CHUNK).map(part).sum()
                    } else {
                        x.par_chunks(CHUNK).map(part).sum()
                    }
                }
                CpuStorage::F64(x) => {
                    let part = |c: &[f64]| c.iter().map(|&v| v * v).sum::<f64>();
                    let x = contiguous(x, l)?;
                    if x.len() < PARALLEL_FROM {
                        x.chunks(CHUNK).map(part).sum()
                    } else {
                        x.par_chunks(CHUNK).map(part).sum()
                    }
                }
                _ => candle_core::bail!("sum-sq: f32 or f64 only"),
            };
            Ok((CpuStorage::F64(vec![total]), Shape::from(1)))
        }
    }

    /// Updates `w`, `m` and `v` in place; false (nothing done) where the fused path does not
    /// apply, and the caller uses the tensor expressions.
    pub fn update(w: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor, h: Hyper) -> Result<bool> {
        let ok = |t: &Tensor| t.device().is_cpu() && t.dtype() == w.dtype() && t.is_contiguous();
        if !(matches!(w.dtype(), DType::F32 | DType::F64) && ok(w) && ok(m) && ok(v)) || g.dtype() != w.dtype() {
            return Ok(false);
        }
        let g = g.contiguous()?;
        // candle lends one storage mutably per in-place op; nesting three of them (on m, then
        // v, then w) makes all three writable at once, so the update is a single pass.
        m.inplace_op1(&OnM { w, g: &g, v, h })?;
        Ok(true)
    }

    /// A slice of a storage that an enclosing in-place op holds locked for writing.
    struct Locked<T> {
        ptr: *mut T,
        len: usize,
    }
    // SAFETY: the pointee is locked by the enclosing op for the whole nested call, and each
    // element is written by one thread only (the chunks below are disjoint).
    unsafe impl<T> Send for Locked<T> {}
    unsafe impl<T> Sync for Locked<T> {}

    fn lock_mut<T>(s: &mut [T], l: &Layout) -> candle_core::Result<Locked<T>> {
        let s = contiguous_mut(s, l)?;
        Ok(Locked { ptr: s.as_mut_ptr(), len: s.len() })
    }

    struct OnM<'a> {
        w: &'a Tensor,
        g: &'a Tensor,
        v: &'a Tensor,
        h: Hyper,
    }

    impl InplaceOp1 for OnM<'_> {
        fn name(&self) -> &'static str {
            "adamw"
        }

        fn cpu_fwd(&self, s: &mut CpuStorage, l: &Layout) -> candle_core::Result<()> {
            let m = match s {
                CpuStorage::F32(m) => Moments::F32(lock_mut(m, l)?),
                CpuStorage::F64(m) => Moments::F64(lock_mut(m, l)?),
                _ => candle_core::bail!("adamw: f32 or f64 only"),
            };
            self.v.inplace_op1(&OnV { w: self.w, g: self.g, m, h: self.h })
        }
    }

    enum Moments {
        F32(Locked<f32>),
        F64(Locked<f64>),
    }

    struct OnV<'a> {
        w: &'a Tensor,
        g: &'a Tensor,
        m: Moments,
        h: Hyper,
    }

    impl InplaceOp1 for OnV<'_> {
        fn name(&self) -> &'static str {
            "adamw"
        }

        fn cpu_fwd(&self, s: &mut CpuStorage, l: &Layout) -> candle_core::Result<()> {
            match (&self.m, s) {
                (Moments::F32(m), CpuStorage::F32(v)) => {
                    self.w.inplace_op2(self.g, &OnW { m, v: lock_mut(v, l)?, h: self.h })
                }
                (Moments::F64(m), CpuStorage::F64(v)) => {
                    self.w.inplace_op2(self.g, &OnW { m, v: lock_mut(v, l)?, h: self.h })
                }
                _ => candle_core::bail!("adamw: moments of different dtypes"),
            }
        }
    }

    struct OnW<'a, T> {
        m: &'a Locked<T>,
        v: Locked<T>,
        h: Hyper,
    }

    impl<T: Real> InplaceOp2 for OnW<'_, T> {
        fn name(&self) -> &'static str {
            "adamw"
        }

        fn cpu_fwd(&self, s1: &mut CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> candle_core::Result<()> {
            let w = match T::data_mut(s1) {
                Some(w) => contiguous_mut(w, l1)?,
                None => candle_core::bail!("adamw: weights and moments of different dtypes"),
            };
            let g = match T::data(s2) {
                Some(g) => contiguous(g, l2)?,
                None => candle_core::bail!("adamw: weights and gradient of different dtypes"),
            };
            if g.len() != w.len() || self.m.len != w.len() || self.v.len != w.len() {
                candle_core::bail!("adamw: gradient or moments of another size than the weights");
            }
            // SAFETY: m and v are distinct tensors from w (and from each other), locked for
            // writing by the enclosing ops for the duration of this call.
            let (m, v) = unsafe {
                (
                    std::slice::from_raw_parts_mut(self.m.ptr, self.m.len),
                    std::slice::from_raw_parts_mut(self.v.ptr, self.v.len),
                )
            };
            let h = self.h;
            if w.len() < PARALLEL_FROM {
                adamw_chunk(w, g, m, v, h);
            } else {
                w.par_chunks_mut(CHUNK)
                    .zip(g.par_chunks(CHUNK))
                    .zip(m.par_chunks_mut(CHUNK).zip(v.par_chunks_mut(CHUNK)))
                    .for_each(|((w, g), (m, v))| adamw_chunk(w, g, m, v, h));
            }
            Ok(())
        }
    }

    simd_fn! {
        /// The composed expressions, element by element: m ← β1·m + (1 − β1)·s·g,
        /// v ← β2·v + (1 − β2)·(s·g)², w ← w·(1 − lr·wd) − lr · (m/c1) / (√(v/c2) + eps).
        fn adamw_chunk<T: Real>(w: &mut [T], g: &[T], m: &mut [T], v: &mut [T], h: Hyper) {
            let (b1, b2, scale) = (T::of(h.b1), T::of(h.b2), T::of(h.scale));
            let (decay, lr, c1, c2, eps) = (T::of(1.0 - h.lr * h.wd), T::of(h.lr), T::of(h.c1), T::of(h.c2), T::of(h.eps));
            for (((w, &g), m), v) in w.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
                let g = scale * g;
                *m = b1 * *m + (T::ONE - b1) * g;
                *v = b2 * *v + (T::ONE - b2) * (g * g);
                let update = (*m / c1) / ((*v / c2).sqrt() + eps);
                *w = *w * decay - update * lr;
            }
        }
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
