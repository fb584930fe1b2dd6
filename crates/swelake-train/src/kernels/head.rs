//! The output head's per-token statistics: the log-probability of the sampled token (with its
//! backward) and the entropy of the distribution.
//!
//! Composed from tensor primitives (max, subtract, exp, sum, log, subtract, gather — and again
//! for the entropy), each is a dozen passes over a [tokens, 49k] tensor with a fresh 100 MB
//! allocation per pass, in the forward and again in the backward: most of the step's non-matmul
//! time (perf, `swelake bench train`). Here each vocabulary row is read a few times while it is
//! in cache, and the backward writes the gradient directly.

use anyhow::Result;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Layout, Shape, Tensor, D};
use rayon::prelude::*;

use super::{contiguous, fusable, row_max, simd_fn, Real, PARALLEL_FROM};

/// Log-probabilities of `targets` [..] (u32) under `logits` [.., V], shaped like `targets`.
pub fn target_logprobs(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    if !fusable(logits) {
        let lp = crate::model::log_softmax(logits)?;
        return Ok(lp.gather(&targets.unsqueeze(D::Minus1)?, D::Minus1)?.squeeze(D::Minus1)?);
    }
    let shape = targets.shape().clone();
    let (rows, v) = rows_of(logits)?;
    let logits = logits.contiguous()?.reshape((rows, v))?;
    let targets = targets.to_dtype(DType::U32)?.contiguous()?.reshape(rows)?;
    Ok(logits.apply_op2(&targets, TargetLogprob)?.reshape(shape)?)
}

/// Entropy (nats) of the distribution of each row of `logits` [.., V], shaped [..]; no gradient.
pub fn entropy(logits: &Tensor) -> Result<Tensor> {
    let logits = logits.detach();
    if !fusable(&logits) {
        let lp = crate::model::log_softmax(&logits)?;
        return Ok((lp.exp()? * &lp)?.sum(D::Minus1)?.neg()?);
    }
    let mut dims = logits.dims().to_vec();
    dims.pop();
    let (rows, v) = rows_of(&logits)?;
    Ok(logits.contiguous()?.reshape((rows, v))?.apply_op1_no_bwd(&Entropy)?.reshape(dims)?)
}

fn rows_of(t: &Tensor) -> Result<(usize, usize)> {
    let v = t.dim(D::Minus1)?;
    Ok((t.elem_count() / v.max(1), v))
}

/// Row maximum and `ln Σ exp(x)` (the log-sum-exp).
#[inline(always)]
fn max_and_lse<T: Real>(row: &[T]) -> (T, f64) {
    let m = row_max(row, T::NEG_INFINITY);
    let (s, _) = T::sum_exp(row, m);
    (m, m.to_f64() + s.ln())
}

fn targets<'a>(s: &'a CpuStorage, l: &Layout, op: &str) -> candle_core::Result<&'a [u32]> {
    match s {
        CpuStorage::U32(t) => contiguous(t, l),
        _ => candle_core::bail!("{op}: targets must be u32"),
    }
}

/// Log-probability of each row's target: logits [N, V] (f32/f64), targets [N] (u32) → [N].
struct TargetLogprob;

simd_fn! {
    fn logprob_row<T: Real>(row: &[T], t: u32) -> T {
        let (_, lse) = max_and_lse(row);
        T::of(row[t as usize].to_f64() - lse)
    }
}

fn logprob_rows<T: Real>(x: &[T], t: &[u32], v: usize) -> candle_core::Result<Vec<T>> {
    if t.iter().any(|&t| t as usize >= v) {
        candle_core::bail!("target token id out of the vocabulary ({v})");
    }
    let f = |(row, &t): (&[T], &u32)| logprob_row(row, t);
    Ok(if x.len() < PARALLEL_FROM {
        x.chunks(v).zip(t).map(f).collect()
    } else {
        x.par_chunks(v).zip(t.par_iter()).map(f).collect()
    })
}

impl CustomOp2 for TargetLogprob {
    fn name(&self) -> &'static str {
        "target-logprob"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (n, v) = l1.shape().dims2()?;
        let t = targets(s2, l2, self.name())?;
        let out = match s1 {
            CpuStorage::F32(x) => CpuStorage::F32(logprob_rows(contiguous(x, l1)?, t, v)?),
            CpuStorage::F64(x) => CpuStorage::F64(logprob_rows(contiguous(x, l1)?, t, v)?),
            _ => candle_core::bail!("target-logprob: logits must be f32 or f64"),
        };
        Ok((out, Shape::from(n)))
    }

    fn bwd(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let g = logits.apply_op3_no_bwd(targets, &grad_res.contiguous()?, &TargetLogprobGrad)?;
        Ok((Some(g), None))
    }
}

/// d(logprob)/d(logits) times the incoming gradient: `g · (onehot(target) − softmax(row))`.
struct TargetLogprobGrad;

simd_fn! {
    fn logprob_grad_row<T: Real>(o: &mut [T], row: &[T], t: u32, g: T) {
        let (_, lse) = max_and_lse(row);
        let g = g.to_f64();
        T::scaled_exp(row, T::of(lse), -g, o);
        o[t as usize] = T::of(o[t as usize].to_f64() + g);
    }
}

fn logprob_grad_rows<T: Real>(x: &[T], t: &[u32], g: &[T], v: usize) -> Vec<T> {
    let mut out = vec![T::of(0.0); x.len()];
    let f = logprob_grad_row;
    if x.len() < PARALLEL_FROM {
        out.chunks_mut(v).zip(x.chunks(v)).zip(t.iter().zip(g)).for_each(|((o, row), (&t, &g))| f(o, row, t, g));
    } else {
        out.par_chunks_mut(v)
            .zip(x.par_chunks(v))
            .zip(t.par_iter().zip(g.par_iter()))
            .for_each(|((o, row), (&t, &g))| f(o, row, t, g));
    }
    out
}

impl CustomOp3 for TargetLogprobGrad {
    fn name(&self) -> &'static str {
        "target-logprob-grad"
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
        let (_, v) = l1.shape().dims2()?;
        let t = targets(s2, l2, self.name())?;
        let out = match (s1, s3) {
            (CpuStorage::F32(x), CpuStorage::F32(g)) => {
                CpuStorage::F32(logprob_grad_rows(contiguous(x, l1)?, t, contiguous(g, l3)?, v))
            }
            (CpuStorage::F64(x), CpuStorage::F64(g)) => {
                CpuStorage::F64(logprob_grad_rows(contiguous(x, l1)?, t, contiguous(g, l3)?, v))
            }
            _ => candle_core::bail!("target-logprob-grad: logits and gradient must be both f32 or both f64"),
        };
        Ok((out, l1.shape().clone()))
    }
}

/// Entropy of each row: `lse − Σ softmax·x`, from one max pass and one exp pass.
struct Entropy;

simd_fn! {
    fn entropy_row<T: Real>(row: &[T]) -> T {
        let m = row_max(row, T::NEG_INFINITY);
        let (s, sx) = T::sum_exp(row, m);
        // H = lse − Σ p·x, with lse = m + ln Σe and Σ p·x = m + Σ e·(x − m) / Σ e.
        T::of(s.ln() - sx / s)
    }
}

fn entropy_rows<T: Real>(x: &[T], v: usize) -> Vec<T> {
    let f = entropy_row;
    if x.len() < PARALLEL_FROM {
        x.chunks(v).map(f).collect()
    } else {
        x.par_chunks(v).map(f).collect()
    }
}

impl CustomOp1 for Entropy {
    fn name(&self) -> &'static str {
        "entropy"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (n, v) = l.shape().dims2()?;
        let out = match s {
            CpuStorage::F32(x) => CpuStorage::F32(entropy_rows(contiguous(x, l)?, v)),
            CpuStorage::F64(x) => CpuStorage::F64(entropy_rows(contiguous(x, l)?, v)),
            _ => candle_core::bail!("entropy: logits must be f32 or f64"),
        };
        Ok((out, Shape::from(n)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn composed_logprobs(logits: &Tensor, targets: &Tensor) -> Tensor {
        let lp = crate::model::log_softmax(logits).unwrap();
        lp.gather(&targets.unsqueeze(D::Minus1).unwrap(), D::Minus1).unwrap().squeeze(D::Minus1).unwrap()
    }

    fn data(dtype: DType) -> (Var, Tensor) {
        let dev = Device::Cpu;
        // Spread wide enough that the max shift and underflow matter.
        let x = (Tensor::randn(0f64, 6.0, (2, 3, 37), &dev).unwrap()).to_dtype(dtype).unwrap();
        let t = Tensor::new(&[[0u32, 36, 5], [17, 17, 2]], &dev).unwrap();
        (Var::from_tensor(&x).unwrap(), t)
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
    }

    #[test]
    fn fused_values_and_gradients_equal_the_composed_ones() {
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 2e-6)] {
            let (x, t) = data(dtype);
            // A fixed weighting so that every token's gradient differs.
            let w = Tensor::arange(1f64, 7.0, &Device::Cpu).unwrap().reshape((2, 3)).unwrap().to_dtype(dtype).unwrap();
            let fused = target_logprobs(x.as_tensor(), &t).unwrap();
            let composed = composed_logprobs(x.as_tensor(), &t);
            assert!(max_diff(&fused, &composed) < tol, "{dtype:?} values");
            let gf = (fused * &w).unwrap().sum_all().unwrap().backward().unwrap();
            let gc = (composed * &w).unwrap().sum_all().unwrap().backward().unwrap();
            let (gf, gc) = (gf.get(x.as_tensor()).unwrap(), gc.get(x.as_tensor()).unwrap());
            assert!(max_diff(gf, gc) < tol * 10.0, "{dtype:?} gradients: {}", max_diff(gf, gc));
            let lp = crate::model::log_softmax(x.as_tensor()).unwrap();
            let want = (lp.exp().unwrap() * &lp).unwrap().sum(D::Minus1).unwrap().neg().unwrap();
            assert!(max_diff(&entropy(x.as_tensor()).unwrap(), &want) < tol * 10.0, "{dtype:?} entropy");
        }
    }

    #[test]
    fn out_of_vocabulary_target_is_an_error() {
        let x = Tensor::zeros((2, 4), DType::F32, &Device::Cpu).unwrap();
        let t = Tensor::new(&[1u32, 4], &Device::Cpu).unwrap();
        assert!(target_logprobs(&x, &t).is_err());
    }
}
