//! Moving heads in front of positions ([B, T, H·hd] ↔ [B, H, T, hd]), with RoPE applied on
//! the way in: one op each way, each the other's backward.

use anyhow::Result;
use candle_core::{CpuStorage, CustomOp3, Layout, Shape, Tensor};

use super::{by_dtype, each_row, fusable, input, Real};

/// RoPE tables (`cos`/`sin` [max_seq, hd/2]) and the position of the first token.
pub struct Rotary<'a> {
    pub cos: &'a Tensor,
    pub sin: &'a Tensor,
    pub start: usize,
}

/// `x` [B, T, heads·hd] as [B, heads, T, hd]; with `rope`, each head's adjacent feature pairs
/// rotated by the angles of positions start..start+T.
pub fn split_heads(x: &Tensor, heads: usize, rope: Option<Rotary>) -> Result<Tensor> {
    let (b, t, width) = x.dims3()?;
    let hd = width / heads.max(1);
    if heads == 0 || hd * heads != width || !hd.is_multiple_of(2) {
        anyhow::bail!("cannot split rows of {width} into {heads} heads");
    }
    if let Some(r) = &rope {
        if r.start + t > r.cos.dim(0)? {
            anyhow::bail!("RoPE: positions up to {} but tables for {}", r.start + t, r.cos.dim(0)?);
        }
    }
    let dims = HeadDims { b, t, h: heads, hd };
    if !fusable(x) {
        let x = x.reshape((b, t, heads, hd))?.transpose(1, 2)?;
        let Some(r) = rope else { return Ok(x.contiguous()?) };
        let cos = r.cos.narrow(0, r.start, t)?.reshape((1, 1, t, hd / 2))?;
        let sin = r.sin.narrow(0, r.start, t)?.reshape((1, 1, t, hd / 2))?;
        let pairs = x.reshape((b, heads, t, hd / 2, 2))?;
        let x0 = pairs.narrow(4, 0, 1)?.squeeze(4)?;
        let x1 = pairs.narrow(4, 1, 1)?.squeeze(4)?;
        let r0 = (x0.broadcast_mul(&cos)? - x1.broadcast_mul(&sin)?)?;
        let r1 = (x0.broadcast_mul(&sin)? + x1.broadcast_mul(&cos)?)?;
        return Ok(Tensor::stack(&[r0, r1], 4)?.reshape((b, heads, t, hd))?);
    }
    let op = Heads { dims, start: rope.as_ref().map_or(0, |r| r.start), rotate: rope.is_some(), split: true };
    // Without RoPE the tables are not read; an empty tensor of x's dtype stands in.
    let (cos, sin) = match &rope {
        Some(r) => (r.cos.contiguous()?, r.sin.contiguous()?),
        None => (none(x)?, none(x)?),
    };
    Ok(x.contiguous()?.apply_op3(&cos, &sin, op)?)
}

/// `x` holding [B, heads, T, hd] (any shape of that many elements) as [B, T, heads·hd].
pub fn merge_heads(x: &Tensor, b: usize, heads: usize, t: usize) -> Result<Tensor> {
    let hd = x.elem_count() / (b * heads * t).max(1);
    if hd * b * heads * t != x.elem_count() {
        anyhow::bail!("cannot merge {:?} as [{b}, {heads}, {t}, ..]", x.dims());
    }
    if !fusable(x) {
        return Ok(x.reshape((b, heads, t, hd))?.transpose(1, 2)?.reshape((b, t, heads * hd))?);
    }
    let op = Heads { dims: HeadDims { b, t, h: heads, hd }, start: 0, rotate: false, split: false };
    Ok(x.contiguous()?.apply_op3(&none(x)?, &none(x)?, op)?)
}

fn none(like: &Tensor) -> Result<Tensor> {
    Ok(Tensor::zeros(0, like.dtype(), like.device())?)
}

#[derive(Clone, Copy)]
struct HeadDims {
    b: usize,
    t: usize,
    h: usize,
    hd: usize,
}

/// Split: [B, T, H·hd] → [B, H, T, hd], rotating by +angle. Merge: the reverse, rotating by
/// −angle. Each is the other's adjoint (a rotation's transpose is the rotation by minus the
/// angle), so the backward of one is the other.
#[derive(Clone, Copy)]
struct Heads {
    dims: HeadDims,
    start: usize,
    rotate: bool,
    split: bool,
}

impl CustomOp3 for Heads {
    fn name(&self) -> &'static str {
        if self.split {
            "split-heads"
        } else {
            "merge-heads"
        }
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
        let HeadDims { b, t, h, hd } = self.dims;
        let half = hd / 2;
        if l1.shape().elem_count() != b * t * h * hd {
            candle_core::bail!("{}: {:?} is not [{b}, {t}, {h}, {hd}]", self.name(), l1.shape());
        }
        by_dtype!(s1, self.name(), T => {
            let name = self.name();
            let (x, cos, sin) = (input::<T>(s1, l1, name)?, input::<T>(s2, l2, name)?, input::<T>(s3, l3, name)?);
            if self.rotate && (cos.len() < (self.start + t) * half || sin.len() != cos.len()) {
                candle_core::bail!("{name}: tables too short for {} positions", self.start + t);
            }
            let mut out = vec![T::ZERO; x.len()];
            // Output rows are [b, h, t] when splitting and [b, t, h] when merging, hd each.
            each_row(&mut out, hd, |row, o| {
                let (bi, hi, ti) =
                    if self.split { (row / (h * t), (row / t) % h, row % t) } else { (row / (t * h), row % h, (row / h) % t) };
                let src = if self.split { ((bi * t + ti) * h + hi) * hd } else { ((bi * h + hi) * t + ti) * hd };
                let src = &x[src..src + hd];
                if !self.rotate {
                    o.copy_from_slice(src);
                    return;
                }
                let p = (self.start + ti) * half;
                let (c, s) = (&cos[p..p + half], &sin[p..p + half]);
                for i in 0..half {
                    let (x0, x1) = (src[2 * i], src[2 * i + 1]);
                    if self.split {
                        o[2 * i] = x0 * c[i] - x1 * s[i];
                        o[2 * i + 1] = x0 * s[i] + x1 * c[i];
                    } else {
                        o[2 * i] = x0 * c[i] + x1 * s[i];
                        o[2 * i + 1] = x1 * c[i] - x0 * s[i];
                    }
                }
            });
            let shape = if self.split { Shape::from((b, h, t, hd)) } else { Shape::from((b, t, h * hd)) };
            Ok((T::storage(out), shape))
        })
    }

    fn bwd(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let back = Heads { split: !self.split, ..*self };
        // Merging accepts any shape of the right size (heads stacked as rows, say).
        let dx = grad.contiguous()?.apply_op3_no_bwd(cos, sin, &back)?.reshape(x.shape())?;
        Ok((Some(dx), None, None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{check, max_diff, var, CASES};
    use candle_core::{DType, Device};

    fn rope_reference(x: &Tensor, heads: usize, cos: &Tensor, sin: &Tensor, start: usize) -> Tensor {
        // Per element, straight from the definition.
        let (b, t, w) = x.dims3().unwrap();
        let (h, hd) = (heads, w / heads);
        let xs: Vec<f64> = x.to_dtype(DType::F64).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let c: Vec<Vec<f64>> = cos.to_dtype(DType::F64).unwrap().to_vec2().unwrap();
        let s: Vec<Vec<f64>> = sin.to_dtype(DType::F64).unwrap().to_vec2().unwrap();
        let mut out = vec![0f64; xs.len()];
        for bi in 0..b {
            for ti in 0..t {
                for hi in 0..h {
                    for i in 0..hd / 2 {
                        let at = ((bi * t + ti) * h + hi) * hd + 2 * i;
                        let (x0, x1) = (xs[at], xs[at + 1]);
                        let (c, s) = (c[start + ti][i], s[start + ti][i]);
                        let o = ((bi * h + hi) * t + ti) * hd + 2 * i;
                        out[o] = x0 * c - x1 * s;
                        out[o + 1] = x0 * s + x1 * c;
                    }
                }
            }
        }
        Tensor::from_vec(out, (b, h, t, hd), &Device::Cpu).unwrap().to_dtype(x.dtype()).unwrap()
    }

    fn tables(dtype: DType) -> (Tensor, Tensor) {
        let ang = Tensor::randn(0f64, 3.0, (12, 4), &Device::Cpu).unwrap();
        (ang.cos().unwrap().to_dtype(dtype).unwrap(), ang.sin().unwrap().to_dtype(dtype).unwrap())
    }

    #[test]
    fn split_heads_with_rope_matches_the_definition_and_its_adjoint_is_the_gradient() {
        for (dtype, tol) in CASES {
            let (cos, sin) = tables(dtype);
            let x = var(&[2, 5, 24], 1.0, dtype);
            for start in [0, 7] {
                let rot = || Some(Rotary { cos: &cos, sin: &sin, start });
                let want = rope_reference(x.as_tensor(), 3, &cos, &sin, start);
                let got = split_heads(x.as_tensor(), 3, rot()).unwrap();
                assert!(max_diff(&got, &want) < tol * 4.0, "{dtype:?} values");
                // The composed fallback (other devices) agrees too, values and gradients.
                check(
                    "split_heads",
                    &[&x],
                    &|t| split_heads(&t[0], 3, rot()).unwrap(),
                    &|t| {
                        let (b, tt, _) = t[0].dims3().unwrap();
                        let x = t[0].reshape((b, tt, 3, 8)).unwrap().transpose(1, 2).unwrap();
                        let c = cos.narrow(0, start, tt).unwrap().reshape((1, 1, tt, 4)).unwrap();
                        let s = sin.narrow(0, start, tt).unwrap().reshape((1, 1, tt, 4)).unwrap();
                        let pairs = x.reshape((b, 3, tt, 4, 2)).unwrap();
                        let x0 = pairs.narrow(4, 0, 1).unwrap().squeeze(4).unwrap();
                        let x1 = pairs.narrow(4, 1, 1).unwrap().squeeze(4).unwrap();
                        let r0 = (x0.broadcast_mul(&c).unwrap() - x1.broadcast_mul(&s).unwrap()).unwrap();
                        let r1 = (x0.broadcast_mul(&s).unwrap() + x1.broadcast_mul(&c).unwrap()).unwrap();
                        Tensor::stack(&[r0, r1], 4).unwrap().reshape((b, 3, tt, 8)).unwrap()
                    },
                    tol,
                );
            }
        }
        let (cos, sin) = tables(DType::F32);
        let x = Tensor::zeros((1, 6, 8), DType::F32, &Device::Cpu).unwrap();
        assert!(split_heads(&x, 1, Some(Rotary { cos: &cos, sin: &sin, start: 7 })).is_err(), "past the tables");
        assert!(split_heads(&x, 3, None).is_err(), "8 features in 3 heads");
    }

    #[test]
    fn split_and_merge_heads_are_the_transposes() {
        for (dtype, tol) in CASES {
            // Enough elements for the pool.
            for (b, t, h, hd) in [(2, 5, 3, 4), (2, 300, 4, 32)] {
                let x = var(&[b, t, h * hd], 1.0, dtype);
                check(
                    "split_heads",
                    &[&x],
                    &|ts| split_heads(&ts[0], h, None).unwrap(),
                    &|ts| ts[0].reshape((b, t, h, hd)).unwrap().transpose(1, 2).unwrap().contiguous().unwrap(),
                    tol,
                );
                let y = var(&[b, h, t, hd], 1.0, dtype);
                check(
                    "merge_heads",
                    &[&y],
                    &|ts| merge_heads(&ts[0], b, h, t).unwrap(),
                    &|ts| ts[0].transpose(1, 2).unwrap().reshape((b, t, h * hd)).unwrap(),
                    tol,
                );
                let back = merge_heads(&split_heads(x.as_tensor(), h, None).unwrap(), b, h, t).unwrap();
                assert_eq!(max_diff(&back, x.as_tensor()), 0.0);
            }
        }
    }
}
