//! AdamW on CPU in place, in one pass over weights, gradient and moments, where the composed
//! tensor expressions make ~14 passes and as many fresh weight-sized allocations (for
//! SmolLM2, 540 MB each, page-faulted in every step).

use anyhow::Result;
use candle_core::{CpuStorage, CustomOp1, DType, InplaceOp1, InplaceOp2, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::{contiguous, contiguous_mut, simd_fn, Real, CHUNK, PARALLEL_FROM};

/// The constants of one AdamW update.
#[derive(Clone, Copy)]
pub struct Hyper {
    pub b1: f64,
    pub b2: f64,
    /// Bias corrections `1 − β^t`.
    pub c1: f64,
    pub c2: f64,
    pub lr: f64,
    pub eps: f64,
    pub wd: f64,
    /// Gradient clipping factor.
    pub scale: f64,
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
