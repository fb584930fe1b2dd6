//! SwiGLU, silu(gate) · up, with its backward.

use anyhow::Result;
use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::{by_dtype, each_row, fusable, input, simd_fn, Real, PARALLEL_FROM};

/// `silu(gate) · up` for two tensors of one shape.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    if !fusable(gate) || gate.shape() != up.shape() {
        return Ok((gate.silu()? * up)?);
    }
    Ok(gate.contiguous()?.apply_op2(&up.contiguous()?, SwiGlu)?)
}

/// σ(g) from e^(−|g|), which never overflows.
#[inline(always)]
fn sigmoid<T: Real>(g: T) -> T {
    let neg_abs = if g > T::ZERO { -g } else { g };
    let e = neg_abs.exp_nonpos();
    let s = T::ONE / (T::ONE + e);
    if g > T::ZERO {
        s
    } else {
        e * s
    }
}

struct SwiGlu;

simd_fn! {
    fn swiglu_chunk<T: Real>(o: &mut [T], g: &[T], u: &[T]) {
        for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
            *o = g * sigmoid(g) * u;
        }
    }
}

simd_fn! {
    fn swiglu_grad_chunk<T: Real>(dg: &mut [T], du: &mut [T], g: &[T], u: &[T], d: &[T]) {
        for ((((dg, du), &g), &u), &d) in dg.iter_mut().zip(du).zip(g).zip(u).zip(d) {
            let s = sigmoid(g);
            *dg = d * u * s * (T::ONE + g * (T::ONE - s));
            *du = d * g * s;
        }
    }
}

impl CustomOp2 for SwiGlu {
    fn name(&self) -> &'static str {
        "swiglu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        by_dtype!(s1, self.name(), T => {
            let (g, u) = (input::<T>(s1, l1, self.name())?, input::<T>(s2, l2, self.name())?);
            let mut out = vec![T::ZERO; g.len()];
            each_row(&mut out, CHUNK, |i, o| swiglu_chunk(o, &g[i * CHUNK..], &u[i * CHUNK..]));
            Ok((T::storage(out), l1.shape().clone()))
        })
    }

    fn bwd(
        &self,
        gate: &Tensor,
        up: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let n = gate.elem_count();
        let packed = gate.apply_op3_no_bwd(up, &grad.contiguous()?, &SwiGluGrad)?;
        let dg = packed.narrow(0, 0, n)?.reshape(gate.shape())?;
        let du = packed.narrow(0, n, n)?.reshape(gate.shape())?;
        Ok((Some(dg), Some(du)))
    }
}

/// Elements per task of the elementwise kernels.
const CHUNK: usize = 1 << 14;

/// `[d gate, d up]`: d gate = grad·up·σ(g)·(1 + g·(1 − σ(g))), d up = grad·g·σ(g).
struct SwiGluGrad;

impl CustomOp3 for SwiGluGrad {
    fn name(&self) -> &'static str {
        "swiglu-grad"
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
        by_dtype!(s1, self.name(), T => {
            let name = self.name();
            let (g, u, d) = (input::<T>(s1, l1, name)?, input::<T>(s2, l2, name)?, input::<T>(s3, l3, name)?);
            let n = g.len();
            let mut out = vec![T::ZERO; 2 * n];
            let (dg, du) = out.split_at_mut(n);
            let f = |(i, (dg, du)): (usize, (&mut [T], &mut [T]))| {
                let at = i * CHUNK;
                swiglu_grad_chunk(dg, du, &g[at..], &u[at..], &d[at..])
            };
            if n < PARALLEL_FROM {
                dg.chunks_mut(CHUNK).zip(du.chunks_mut(CHUNK)).enumerate().for_each(f);
            } else {
                dg.par_chunks_mut(CHUNK).zip(du.par_chunks_mut(CHUNK)).enumerate().for_each(f);
            }
            Ok((T::storage(out), Shape::from(2 * n)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{check, var, CASES};

    #[test]
    fn swiglu_matches_silu_times_up() {
        for (dtype, tol) in CASES {
            for n in [7, 70_001] {
                // Wide enough that sigmoid saturates on both sides.
                let g = var(&[n], 12.0, dtype);
                let u = var(&[n], 1.0, dtype);
                check(
                    "swiglu",
                    &[&g, &u],
                    &|t| swiglu(&t[0], &t[1]).unwrap(),
                    &|t| (t[0].silu().unwrap() * &t[1]).unwrap(),
                    tol,
                );
            }
        }
    }
}
