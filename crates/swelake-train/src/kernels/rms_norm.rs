//! RMSNorm, y = x · r · w with r = 1/√(mean(x²) + eps) over the last dimension, with its
//! backward. The weight gradient's sum over rows runs in fixed blocks in block order, so a
//! step gives the same bits whatever the thread count.

use anyhow::Result;
use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Shape, Tensor, D};
use rayon::prelude::*;

use super::{by_dtype, dot, each_row, fusable, input, simd_fn, Real, PARALLEL_FROM};

/// RMSNorm of `x` [.., D] with weight `w` [D].
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    if !fusable(x) {
        let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
        let inv = (ms + eps)?.sqrt()?.recip()?;
        return Ok(x.broadcast_mul(&inv)?.broadcast_mul(w)?);
    }
    let shape = x.shape().clone();
    let d = x.dim(D::Minus1)?;
    let x = x.contiguous()?.reshape((x.elem_count() / d.max(1), d))?;
    Ok(x.apply_op2(&w.contiguous()?, RmsNorm { eps })?.reshape(shape)?)
}

#[derive(Clone, Copy)]
struct RmsNorm {
    eps: f64,
}

#[inline(always)]
fn inv_rms<T: Real>(row: &[T], eps: f64) -> T {
    let ms = dot(row, row) / T::of(row.len() as f64);
    T::ONE / (ms + T::of(eps)).sqrt()
}

simd_fn! {
    fn rms_row<T: Real>(out: &mut [T], row: &[T], w: &[T], eps: f64) {
        let r = inv_rms(row, eps);
        for ((o, &v), &w) in out.iter_mut().zip(row).zip(w) {
            *o = v * r * w;
        }
    }
}

simd_fn! {
    /// dx for `rows` consecutive rows, and their share of dw.
    fn rms_grad_rows<T: Real>(dx: &mut [T], x: &[T], dy: &[T], w: &[T], eps: f64) -> Vec<T> {
        let d = w.len();
        let mut part = vec![T::ZERO; d];
        let mut a = vec![T::ZERO; d];
        for ((dxr, row), g) in dx.chunks_mut(d).zip(x.chunks(d)).zip(dy.chunks(d)) {
            let r = inv_rms(row, eps);
            for ((a, &g), &w) in a.iter_mut().zip(g).zip(w) {
                *a = g * w;
            }
            let c = r * r * dot(&a, row) / T::of(d as f64);
            for ((o, &a), &v) in dxr.iter_mut().zip(&a).zip(row) {
                *o = r * (a - v * c);
            }
            for ((p, &g), &v) in part.iter_mut().zip(g).zip(row) {
                *p += g * v * r;
            }
        }
        part
    }
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "rms-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (_, d) = l1.shape().dims2()?;
        by_dtype!(s1, self.name(), T => {
            let (x, w) = (input::<T>(s1, l1, self.name())?, input::<T>(s2, l2, self.name())?);
            if w.len() != d {
                candle_core::bail!("rms-norm: weight of {} for rows of {d}", w.len());
            }
            let mut y = vec![T::ZERO; x.len()];
            each_row(&mut y, d, |i, out| rms_row(out, &x[i * d..(i + 1) * d], w, self.eps));
            Ok((T::storage(y), l1.shape().clone()))
        })
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let (n, d) = x.dims2()?;
        let packed = x.apply_op3_no_bwd(w, &dy.contiguous()?, &RmsNormGrad { eps: self.eps })?;
        let dx = packed.narrow(0, 0, n * d)?.reshape((n, d))?;
        let dw = packed.narrow(0, n * d, d)?;
        Ok((Some(dx), Some(dw)))
    }
}

/// Rows per block of the weight gradient's partial sums (fixed: the sum's order stays fixed).
const NORM_BLOCK_ROWS: usize = 32;

/// `[dx (N·D), dw (D)]` from x, w and dy:
/// dx = r·(a − x·r²·mean(a·x)) with a = dy·w; dw = Σ_rows dy·x·r.
struct RmsNormGrad {
    eps: f64,
}

impl CustomOp3 for RmsNormGrad {
    fn name(&self) -> &'static str {
        "rms-norm-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (n, d) = l1.shape().dims2()?;
        by_dtype!(s1, self.name(), T => {
            let name = self.name();
            let (x, w, dy) = (input::<T>(s1, l1, name)?, input::<T>(s2, l2, name)?, input::<T>(s3, l3, name)?);
            let mut out = vec![T::ZERO; n * d + d];
            let (dx, dw) = out.split_at_mut(n * d);
            let block = |(b, dx): (usize, &mut [T])| {
                let rows = b * NORM_BLOCK_ROWS * d..b * NORM_BLOCK_ROWS * d + dx.len();
                rms_grad_rows(dx, &x[rows.clone()], &dy[rows], w, self.eps)
            };
            let parts: Vec<Vec<T>> = if dx.len() < PARALLEL_FROM {
                dx.chunks_mut(NORM_BLOCK_ROWS * d).enumerate().map(block).collect()
            } else {
                dx.par_chunks_mut(NORM_BLOCK_ROWS * d).enumerate().map(block).collect()
            };
            for part in parts {
                for (o, p) in dw.iter_mut().zip(part) {
                    *o += p;
                }
            }
            Ok((T::storage(out), Shape::from(n * d + d)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{check, var, CASES};

    #[test]
    fn rms_norm_matches_the_composed_expression() {
        // Enough rows for the pool and for several blocks of the weight gradient.
        for rows in [3, 200] {
            for (dtype, tol) in CASES {
                let x = var(&[rows, 2, 37], 1.5, dtype);
                let w = var(&[37], 1.0, dtype);
                check(
                    "rms_norm",
                    &[&x, &w],
                    &|t| rms_norm(&t[0], &t[1], 1e-5).unwrap(),
                    &|t| {
                        let ms = t[0].sqr().unwrap().mean_keepdim(D::Minus1).unwrap();
                        let inv = (ms + 1e-5).unwrap().sqrt().unwrap().recip().unwrap();
                        t[0].broadcast_mul(&inv).unwrap().broadcast_mul(&t[1]).unwrap()
                    },
                    tol,
                );
            }
        }
    }
}
