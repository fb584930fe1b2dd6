//! Fused CPU kernels, each with its own backward, for the transformer block: RMSNorm, RoPE
//! (with the move of heads in front of positions), the causal softmax of attention and SwiGLU.
//!
//! Composed from tensor primitives each of these is 5–10 operations forward and more backward,
//! every one a full pass over an activation with a fresh allocation, and candle's backward adds
//! a zero-filled buffer and an addition per edge of the graph. In a SmolLM2-shaped step that
//! was as much time as the matmuls (perf, `swelake bench train`). Here a row is read while it is
//! in cache and the gradient is written once. Other devices (CUDA) and other dtypes keep the
//! composed expressions, which the tests use as the reference for values and gradients.
//!
//! Reductions across rows (RMSNorm's weight gradient) are summed in fixed blocks and in block
//! order, so a step gives the same bits whatever the thread count or scheduling.

use std::ops::{Add, AddAssign, Div, Mul, MulAssign, Neg, Sub};

use anyhow::{Context, Result};
use candle_core::{CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Shape, Tensor, D};
use rayon::prelude::*;

use super::fused::{exp_f32, fusable, row_max, simd_fn, slices, LANES, PARALLEL_FROM};

/// The element types of the kernels.
pub(super) trait Real:
    Copy
    + Send
    + Sync
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + MulAssign
    + 'static
{
    const ZERO: Self;
    const ONE: Self;
    fn of(x: f64) -> Self;
    fn sqrt(self) -> Self;
    /// `e^x` for x <= 0.
    fn exp_nonpos(self) -> Self;
    fn data(s: &CpuStorage) -> Option<&[Self]>;
    fn data_mut(s: &mut CpuStorage) -> Option<&mut [Self]>;
    fn storage(v: Vec<Self>) -> CpuStorage;
}

macro_rules! impl_real {
    ($t:ident, $variant:ident, $exp_nonpos:expr) => {
        impl Real for $t {
            const ZERO: $t = 0.0;
            const ONE: $t = 1.0;
            #[inline(always)]
            fn of(x: f64) -> $t {
                x as $t
            }
            #[inline(always)]
            fn sqrt(self) -> $t {
                $t::sqrt(self)
            }
            #[inline(always)]
            fn exp_nonpos(self) -> $t {
                $exp_nonpos(self)
            }
            fn data(s: &CpuStorage) -> Option<&[$t]> {
                match s {
                    CpuStorage::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn data_mut(s: &mut CpuStorage) -> Option<&mut [$t]> {
                match s {
                    CpuStorage::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn storage(v: Vec<$t>) -> CpuStorage {
                CpuStorage::$variant(v)
            }
        }
    };
}

impl_real!(f32, F32, exp_f32);
impl_real!(f64, F64, f64::exp);

fn input<'a, T: Real>(s: &'a CpuStorage, l: &Layout, op: &str) -> candle_core::Result<&'a [T]> {
    match T::data(s) {
        Some(v) => slices(v, l),
        None => candle_core::bail!("{op}: all inputs must have the first input's dtype (f32 or f64)"),
    }
}

/// Runs `$body` with `$t` bound to the element type of `$s`.
macro_rules! by_dtype {
    ($s:expr, $op:expr, $t:ident => $body:expr) => {
        match $s {
            CpuStorage::F32(_) => {
                type $t = f32;
                $body
            }
            CpuStorage::F64(_) => {
                type $t = f64;
                $body
            }
            _ => candle_core::bail!("{}: f32 or f64 only", $op),
        }
    };
}

/// Calls `f(row index, row)` for every `width`-long row of `out`, on the pool when it is big.
fn each_row<T: Send, F: Fn(usize, &mut [T]) + Sync + Send>(out: &mut [T], width: usize, f: F) {
    if out.len() < PARALLEL_FROM {
        out.chunks_mut(width).enumerate().for_each(|(i, r)| f(i, r));
    } else {
        out.par_chunks_mut(width).enumerate().for_each(|(i, r)| f(i, r));
    }
}

/// Σ a·b with 16 partial sums, so that the loop vectorises.
#[inline(always)]
fn dot<T: Real>(a: &[T], b: &[T]) -> T {
    let mut acc = [T::ZERO; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = T::ZERO;
    for (&x, &y) in ra.iter().zip(rb) {
        s += x * y;
    }
    acc.iter().fold(s, |s, &v| s + v)
}

/// Σ a with 16 partial sums, so that the loop vectorises.
#[inline(always)]
fn sum<T: Real>(a: &[T]) -> T {
    let mut acc = [T::ZERO; LANES];
    let mut lanes = a.chunks_exact(LANES);
    for x in &mut lanes {
        for i in 0..LANES {
            acc[i] += x[i];
        }
    }
    let s = lanes.remainder().iter().fold(T::ZERO, |s, &x| s + x);
    acc.iter().fold(s, |s, &v| s + v)
}

// ---------------------------------------------------------------------------------------------
// RMSNorm: y = x · r · w with r = 1/√(mean(x²) + eps), over the last dimension.

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

// ---------------------------------------------------------------------------------------------
// Moving heads in front of positions ([B, T, H·hd] ↔ [B, H, T, hd]), with RoPE on the way in.

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

// ---------------------------------------------------------------------------------------------
// Causal softmax of attention scores.

/// `softmax(scale · scores)` over the last dimension with a causal mask, for `scores`
/// [.., R, S] whose rows are queries: row r is the query at position `start + r % t` (R may
/// hold several heads' t queries, stacked) and sees keys 0..=start + r % t of the S.
pub fn causal_softmax(scores: &Tensor, t: usize, start: usize, scale: f64) -> Result<Tensor> {
    let dims = scores.dims();
    let (r, s) = (dims[dims.len() - 2], dims[dims.len() - 1]);
    if t == 0 || !r.is_multiple_of(t) || start + t > s {
        anyhow::bail!("causal softmax: {r} rows of {s} keys do not fit {t} queries from position {start}");
    }
    if !fusable(scores) {
        let mask: Vec<f32> =
            (0..t).flat_map(|i| (0..s).map(move |j| if j <= start + i { 0.0 } else { -1e9 })).collect();
        let mask = Tensor::from_vec(mask, (t, s), scores.device())?.to_dtype(scores.dtype())?;
        let mut grouped = dims[..dims.len() - 2].to_vec();
        grouped.extend([r / t, t, s]);
        let x = (scores.reshape(grouped)? * scale)?.broadcast_add(&mask)?;
        let max = x.max_keepdim(D::Minus1)?.detach();
        let e = x.broadcast_sub(&max)?.exp()?;
        return Ok(e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?.reshape(dims)?);
    }
    Ok(scores.contiguous()?.apply_op1(CausalSoftmax { t, start, scale })?)
}

#[derive(Clone, Copy)]
struct CausalSoftmax {
    t: usize,
    start: usize,
    scale: f64,
}

impl CausalSoftmax {
    /// Keys visible to flat row `row` (rows per matrix are a multiple of t).
    fn visible(&self, row: usize) -> usize {
        self.start + row % self.t + 1
    }
}

simd_fn! {
    fn softmax_row<T: Real>(o: &mut [T], src: &[T], scale: T) {
        let m = row_max(src, src[0]) * scale;
        for (o, &v) in o.iter_mut().zip(src) {
            *o = (v * scale - m).exp_nonpos();
        }
        let inv = T::ONE / sum(o);
        for o in o.iter_mut() {
            *o *= inv;
        }
    }
}

simd_fn! {
    fn softmax_grad_row<T: Real>(o: &mut [T], p: &[T], dp: &[T], scale: T) {
        let c = dot(p, dp);
        for ((o, &p), &g) in o.iter_mut().zip(p).zip(dp) {
            *o = scale * p * (g - c);
        }
    }
}

impl CustomOp1 for CausalSoftmax {
    fn name(&self) -> &'static str {
        "causal-softmax"
    }

    fn cpu_fwd(&self, st: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let s = l.shape().dims()[l.shape().rank() - 1];
        by_dtype!(st, self.name(), T => {
            let x = input::<T>(st, l, self.name())?;
            let scale = T::of(self.scale);
            let mut out = vec![T::ZERO; x.len()];
            each_row(&mut out, s, |row, o| {
                let n = self.visible(row);
                softmax_row(&mut o[..n], &x[row * s..row * s + n], scale)
            });
            Ok((T::storage(out), l.shape().clone()))
        })
    }

    fn bwd(&self, _x: &Tensor, p: &Tensor, dp: &Tensor) -> candle_core::Result<Option<Tensor>> {
        Ok(Some(p.apply_op2_no_bwd(&dp.contiguous()?, &CausalSoftmaxGrad(*self))?))
    }
}

/// ds = scale · p · (dp − Σ p·dp) over the visible keys; 0 for masked ones.
struct CausalSoftmaxGrad(CausalSoftmax);

impl CustomOp2 for CausalSoftmaxGrad {
    fn name(&self) -> &'static str {
        "causal-softmax-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let s = l1.shape().dims()[l1.shape().rank() - 1];
        by_dtype!(s1, self.name(), T => {
            let (p, dp) = (input::<T>(s1, l1, self.name())?, input::<T>(s2, l2, self.name())?);
            let scale = T::of(self.0.scale);
            let mut out = vec![T::ZERO; p.len()];
            each_row(&mut out, s, |row, o| {
                let n = self.0.visible(row);
                softmax_grad_row(&mut o[..n], &p[row * s..row * s + n], &dp[row * s..row * s + n], scale)
            });
            Ok((T::storage(out), l1.shape().clone()))
        })
    }
}

// ---------------------------------------------------------------------------------------------
// SwiGLU: silu(gate) · up.

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

// ---------------------------------------------------------------------------------------------
// Matrix products: C = op(A)·op(B), op = identity or transpose, with the backward as products.

/// `x · wᵀ` for x [.., in] and w [out, in] → [.., out]: one 2-D product over all leading
/// positions, with w read transposed in place (no transposed copy, no reshape in the graph).
pub fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let dims = x.dims();
    let inner = *dims.last().context("linear of a scalar")?;
    let (out, w_in) = w.dims2()?;
    if w_in != inner {
        anyhow::bail!("linear: rows of {inner} against a weight [{out}, {w_in}]");
    }
    let rows = x.elem_count() / inner.max(1);
    let mut shape = dims[..dims.len() - 1].to_vec();
    shape.push(out);
    if !fusable(x) {
        return Ok(x.reshape((rows, inner))?.matmul(&w.t()?)?.reshape(shape)?);
    }
    let op = Gemm { batch: 1, m: rows, n: out, k: inner, ta: false, tb: true, out: Shape::from(shape) };
    Ok(x.contiguous()?.apply_op2(&w.contiguous()?, op)?)
}

/// Batched `op(a) · op(b)` for a [.., m, k] (or [.., k, m] with `ta`) and b [.., k, n] (or
/// [.., n, k] with `tb`) with the same leading dimensions.
pub fn matmul(a: &Tensor, b: &Tensor, ta: bool, tb: bool) -> Result<Tensor> {
    let (da, db) = (a.dims(), b.dims());
    if da.len() < 2 || da.len() != db.len() || da[..da.len() - 2] != db[..db.len() - 2] {
        anyhow::bail!("matmul of {da:?} and {db:?}");
    }
    let r = da.len();
    let (m, k) = if ta { (da[r - 1], da[r - 2]) } else { (da[r - 2], da[r - 1]) };
    let (kb, n) = if tb { (db[r - 1], db[r - 2]) } else { (db[r - 2], db[r - 1]) };
    if k != kb {
        anyhow::bail!("matmul of {da:?} and {db:?} (transposed: {ta}, {tb}): inner sizes {k} and {kb}");
    }
    if !fusable(a) {
        let a = if ta { a.t()? } else { a.clone() };
        let b = if tb { b.t()? } else { b.clone() };
        return Ok(a.matmul(&b)?);
    }
    let mut shape = da[..r - 2].to_vec();
    shape.extend([m, n]);
    let op = Gemm { batch: da[..r - 2].iter().product(), m, n, k, ta, tb, out: Shape::from(shape) };
    Ok(a.contiguous()?.apply_op2(&b.contiguous()?, op)?)
}

/// `batch` products `[m, k] · [k, n]` of contiguous operands stored as [k, m] (`ta`) and
/// [n, k] (`tb`) where transposed; the result has shape `out` (batch·m·n elements).
#[derive(Clone)]
struct Gemm {
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    ta: bool,
    tb: bool,
    out: Shape,
}

/// A pointer that crosses to the pool's threads; each writes its own batch of the output.
#[derive(Clone, Copy)]
struct SendPtr<T>(*mut T);
// SAFETY: only used to write disjoint parts of one buffer that outlives the parallel section.
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// A method, so that closures capture the wrapper (Send) rather than its raw pointer.
    ///
    /// # Safety
    /// `offset` must be within the allocation.
    unsafe fn at(self, offset: usize) -> *mut T {
        unsafe { self.0.add(offset) }
    }
}

impl Gemm {
    fn run<T: Real>(&self, a: &[T], b: &[T]) -> candle_core::Result<Vec<T>> {
        let Gemm { batch, m, n, k, ta, tb, .. } = *self;
        if a.len() != batch * m * k || b.len() != batch * k * n {
            candle_core::bail!(
                "gemm: operands of {} and {} elements for {batch} × [{m}, {k}]·[{k}, {n}]",
                a.len(),
                b.len()
            );
        }
        let len = batch * m * n;
        if k == 0 {
            return Ok(vec![T::ZERO; len]);
        }
        // Element (i, j) of op(A) is at i·rs + j·cs.
        let (a_rs, a_cs) = if ta { (1, m as isize) } else { (k as isize, 1) };
        let (b_rs, b_cs) = if tb { (1, k as isize) } else { (n as isize, 1) };
        let threads = rayon::current_num_threads();
        let mut dst: Vec<T> = Vec::with_capacity(len);
        let out = SendPtr(dst.as_mut_ptr());
        let one = |i: usize, par: gemm::Parallelism| {
            // SAFETY: operand slices hold batch·m·k and batch·k·n elements (checked above), the
            // output has capacity for batch·m·n; with read_dst false gemm only writes dst.
            unsafe {
                gemm::gemm(
                    m,
                    n,
                    k,
                    out.at(i * m * n),
                    1,
                    n as isize,
                    false,
                    a.as_ptr().add(i * m * k),
                    a_cs,
                    a_rs,
                    b.as_ptr().add(i * k * n),
                    b_cs,
                    b_rs,
                    T::ZERO,
                    T::ONE,
                    false,
                    false,
                    false,
                    par,
                )
            }
        };
        if batch >= 2 * threads && threads > 1 {
            // Many small products (attention heads): one per task.
            (0..batch).into_par_iter().for_each(|i| one(i, gemm::Parallelism::None));
        } else {
            let par = if threads > 1 { gemm::Parallelism::Rayon(threads) } else { gemm::Parallelism::None };
            (0..batch).for_each(|i| one(i, par));
        }
        // SAFETY: every one of the batch·m·n elements was written by gemm (k > 0).
        unsafe { dst.set_len(len) };
        Ok(dst)
    }
}

impl CustomOp2 for Gemm {
    fn name(&self) -> &'static str {
        "gemm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        by_dtype!(s1, self.name(), T => {
            let (a, b) = (input::<T>(s1, l1, self.name())?, input::<T>(s2, l2, self.name())?);
            Ok((T::storage(self.run(a, b)?), self.out.clone()))
        })
    }

    /// With C = op(A)·op(B): d op(A) = dC·op(B)ᵀ and d op(B) = op(A)ᵀ·dC, each written as one
    /// product of the stored operands in the layout A and B are stored in.
    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        _c: &Tensor,
        dc: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        let Gemm { batch, m, n, k, ta, tb, .. } = *self;
        let dc = dc.contiguous()?;
        let da = if ta {
            // A stored [k, m]: dA = op(B)·dCᵀ.
            b.apply_op2_no_bwd(&dc, &Gemm { batch, m: k, n: m, k: n, ta: tb, tb: true, out: a.shape().clone() })?
        } else {
            dc.apply_op2_no_bwd(b, &Gemm { batch, m, n: k, k: n, ta: false, tb: !tb, out: a.shape().clone() })?
        };
        let db = if tb {
            // B stored [n, k]: dB = dCᵀ·op(A).
            dc.apply_op2_no_bwd(a, &Gemm { batch, m: n, n: k, k: m, ta: true, tb: ta, out: b.shape().clone() })?
        } else {
            a.apply_op2_no_bwd(&dc, &Gemm { batch, m: k, n, k: m, ta: !ta, tb: false, out: b.shape().clone() })?
        };
        Ok((Some(da), Some(db)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Var};

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        let d = (a.to_dtype(DType::F64).unwrap() - b.to_dtype(DType::F64).unwrap()).unwrap();
        d.abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f64>().unwrap()
    }

    fn var(shape: &[usize], std: f64, dtype: DType) -> Var {
        Var::from_tensor(&Tensor::randn(0f64, std, shape, &Device::Cpu).unwrap().to_dtype(dtype).unwrap()).unwrap()
    }

    /// Checks values and the gradients of every input against `reference`, under a fixed
    /// weighting of the outputs (so that each output element's gradient differs).
    fn check(
        name: &str,
        inputs: &[&Var],
        fused: &dyn Fn(&[Tensor]) -> Tensor,
        reference: &dyn Fn(&[Tensor]) -> Tensor,
        tol: f64,
    ) {
        let ts: Vec<Tensor> = inputs.iter().map(|v| v.as_tensor().clone()).collect();
        let (a, b) = (fused(&ts), reference(&ts));
        assert_eq!(a.dims(), b.dims(), "{name}: shapes");
        let scale = 1.0
            + b.abs()
                .unwrap()
                .flatten_all()
                .unwrap()
                .max(0)
                .unwrap()
                .to_dtype(DType::F64)
                .unwrap()
                .to_scalar::<f64>()
                .unwrap();
        assert!(max_diff(&a, &b) < tol * scale, "{name}: values differ by {}", max_diff(&a, &b));
        let w = Tensor::arange(0f64, a.elem_count() as f64, &Device::Cpu)
            .unwrap()
            .affine(0.37, 0.1)
            .unwrap()
            .sin()
            .unwrap()
            .reshape(a.shape())
            .unwrap()
            .to_dtype(a.dtype())
            .unwrap();
        let ga = (a * &w).unwrap().sum_all().unwrap().backward().unwrap();
        let gb = (b * &w).unwrap().sum_all().unwrap().backward().unwrap();
        for (i, v) in inputs.iter().enumerate() {
            let (x, y) = (ga.get(v.as_tensor()).unwrap(), gb.get(v.as_tensor()).unwrap());
            let scale = 1.0
                + y.abs()
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .max(0)
                    .unwrap()
                    .to_dtype(DType::F64)
                    .unwrap()
                    .to_scalar::<f64>()
                    .unwrap();
            assert!(max_diff(x, y) < tol * scale, "{name}: gradient of input {i} differs by {}", max_diff(x, y));
        }
    }

    const CASES: [(DType, f64); 2] = [(DType::F64, 1e-12), (DType::F32, 3e-6)];

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

    #[test]
    fn causal_softmax_matches_the_masked_composition() {
        for (dtype, tol) in CASES {
            // Two heads' 4 queries stacked (R = 8), 6 keys, queries at positions 2..6 — and
            // enough rows for the pool.
            for (lead, t, s, start) in [(vec![2, 3], 4, 6, 2), (vec![3, 40], 8, 8, 0)] {
                let r = 2 * t;
                let mut shape = lead.clone();
                shape.extend([r, s]);
                let x = var(&shape, 3.0, dtype);
                let scale = 0.35;
                check(
                    "causal_softmax",
                    &[&x],
                    &|ts| causal_softmax(&ts[0], t, start, scale).unwrap(),
                    &|ts| {
                        let mask: Vec<f64> = (0..r)
                            .flat_map(|i| (0..s).map(move |j| if j <= start + i % t { 0.0 } else { -1e9 }))
                            .collect();
                        let mask = Tensor::from_vec(mask, (r, s), &Device::Cpu).unwrap().to_dtype(dtype).unwrap();
                        let z = (&ts[0] * scale).unwrap().broadcast_add(&mask).unwrap();
                        let max = z.max_keepdim(D::Minus1).unwrap().detach();
                        let e = z.broadcast_sub(&max).unwrap().exp().unwrap();
                        e.broadcast_div(&e.sum_keepdim(D::Minus1).unwrap()).unwrap()
                    },
                    tol,
                );
            }
        }
        let x = Tensor::zeros((1, 6, 4), DType::F32, &Device::Cpu).unwrap();
        assert!(causal_softmax(&x, 4, 0, 1.0).is_err(), "rows not a multiple of the queries");
    }

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

    #[test]
    fn products_and_their_gradients_match_candle_matmul() {
        for (dtype, tol) in CASES {
            // Batched, every transposition; one batch big enough to run per-task.
            for (lead, m, k, n) in [(vec![2, 3], 5, 7, 4), (vec![9], 3, 2, 6)] {
                for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                    let stored = |r: usize, c: usize, t: bool| {
                        let mut s = lead.clone();
                        s.extend(if t { [c, r] } else { [r, c] });
                        s
                    };
                    let a = var(&stored(m, k, ta), 1.0, dtype);
                    let b = var(&stored(k, n, tb), 1.0, dtype);
                    check(
                        "matmul",
                        &[&a, &b],
                        &|t| matmul(&t[0], &t[1], ta, tb).unwrap(),
                        &|t| {
                            let x = if ta { t[0].t().unwrap() } else { t[0].clone() };
                            let y = if tb { t[1].t().unwrap() } else { t[1].clone() };
                            x.matmul(&y).unwrap()
                        },
                        tol * 10.0,
                    );
                }
            }
        }
        let empty = matmul(
            &Tensor::zeros((2, 4, 0), DType::F32, &Device::Cpu).unwrap(),
            &Tensor::zeros((2, 0, 3), DType::F32, &Device::Cpu).unwrap(),
            false,
            false,
        )
        .unwrap();
        assert_eq!(empty.dims(), [2, 4, 3]);
        assert_eq!(empty.abs().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap(), 0.0);
        let (a, b) = (var(&[2, 3, 4], 1.0, DType::F32), var(&[2, 5, 4], 1.0, DType::F32));
        assert!(matmul(a.as_tensor(), b.as_tensor(), false, false).is_err(), "inner sizes differ");
    }

    #[test]
    fn linear_matches_a_product_with_the_transposed_weight() {
        for (dtype, tol) in CASES {
            for rows in [3, 300] {
                let x = var(&[2, rows, 24], 1.0, dtype);
                let w = var(&[10, 24], 1.0, dtype);
                check(
                    "linear",
                    &[&x, &w],
                    &|t| linear(&t[0], &t[1]).unwrap(),
                    &|t| t[0].broadcast_matmul(&t[1].t().unwrap()).unwrap(),
                    tol * 10.0,
                );
            }
        }
        let (x, w) = (var(&[2, 24], 1.0, DType::F32), var(&[10, 23], 1.0, DType::F32));
        assert!(linear(x.as_tensor(), w.as_tensor()).is_err());
    }

    /// Every vector path gives the same bits (no FMA contraction, fixed reduction order).
    #[test]
    fn kernels_give_identical_bits_on_every_vector_extension() {
        let x = var(&[70, 3, 40], 3.0, DType::F32);
        let w = var(&[40], 1.0, DType::F32);
        let t = Tensor::new((0..210u32).map(|i| i * 7 % 40).collect::<Vec<_>>(), &Device::Cpu)
            .unwrap()
            .reshape((70, 3))
            .unwrap();
        let run = || -> Vec<Vec<f32>> {
            let x = x.as_tensor();
            let outs = [
                rms_norm(x, w.as_tensor(), 1e-5).unwrap(),
                causal_softmax(x, 3, 37, 0.3).unwrap(),
                swiglu(x, &x.sin().unwrap()).unwrap(),
                super::super::fused::target_logprobs(x, &t).unwrap(),
                super::super::fused::entropy(x).unwrap(),
            ];
            let loss = outs.iter().fold(Tensor::zeros((), DType::F32, &Device::Cpu).unwrap(), |acc, o| {
                let wgt = o.ones_like().unwrap().cumsum(D::Minus1).unwrap().sin().unwrap();
                (acc + (o * wgt).unwrap().sum_all().unwrap()).unwrap()
            });
            let g = loss.backward().unwrap();
            outs.iter()
                .chain([g.get(x).unwrap(), g.get(w.as_tensor()).unwrap()])
                .map(|o| o.flatten_all().unwrap().to_vec1().unwrap())
                .collect()
        };
        let widest = run();
        for level in [1, 0] {
            super::super::fused::cap_simd_level(level);
            let got = run();
            super::super::fused::cap_simd_level(u8::MAX);
            for (i, (a, b)) in widest.iter().zip(&got).enumerate() {
                let same = a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "output {i} differs at vector level {level}");
            }
        }
    }
}
