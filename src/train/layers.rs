//! Fused CPU kernels, each with its own backward, for the transformer block: RMSNorm, RoPE
//! (with the move of heads in front of positions), causal attention (scores, masked softmax and
//! the product with the values as one op, skipping the masked blocks) and SwiGLU.
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
use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Shape, Tensor, D};
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
// Causal attention: softmax(scale · q·kᵀ, causal mask) · v as one op.

/// Causal attention `softmax(scale · q·kᵀ) · v` for q [.., R, hd] and k, v [.., S, hd] with the
/// same leading dimensions. Row r of q is the query at position `start + r % t` — R may hold
/// several heads' t queries, stacked, that share this key/value head — and sees keys
/// 0..=start + r % t.
///
/// One op rather than product, softmax, product: the [R, S] scores and probabilities never
/// become graph nodes (candle's backward gives each a zero-filled buffer and an addition), and
/// queries go in blocks that are multiplied only against the keys they can see, which skips
/// nearly half of the products.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, t: usize, start: usize, scale: f64) -> Result<Tensor> {
    attention_in_blocks(q, k, v, t, start, scale, ATTENTION_BLOCK)
}

/// Query rows per block: small enough that a block multiplies few masked keys (at most 31 per
/// row), large enough for gemm's kernels. 32 was ~4% faster than 64 on the SmolLM2-shaped step
/// (`swelake bench train`, 256 tokens).
const ATTENTION_BLOCK: usize = 32;

fn attention_in_blocks(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    t: usize,
    start: usize,
    scale: f64,
    block: usize,
) -> Result<Tensor> {
    let (dq, dk) = (q.dims(), k.dims());
    let rank = dq.len();
    if rank < 2
        || dk.len() != rank
        || v.dims() != dk
        || dq[..rank - 2] != dk[..rank - 2]
        || dq[rank - 1] != dk[rank - 1]
    {
        anyhow::bail!("attention: queries {dq:?}, keys {dk:?} and values {:?} do not match", v.dims());
    }
    let (r, s, hd) = (dq[rank - 2], dk[rank - 2], dq[rank - 1]);
    if t == 0 || !r.is_multiple_of(t) || start + t > s {
        anyhow::bail!("attention: {r} query rows against {s} keys do not fit {t} queries from position {start}");
    }
    if !fusable(q) || hd == 0 {
        let p = causal_softmax(&matmul(q, k, false, true)?, t, start, scale)?;
        return matmul(&p, v, false, false);
    }
    let op = Attention::new(AttentionDims { batch: dq[..rank - 2].iter().product(), r, s, hd, t, start }, scale, block);
    Ok(q.contiguous()?.apply_op3(&k.contiguous()?, &v.contiguous()?, op)?)
}

/// The composed masked softmax of other devices: `softmax(scale · scores)` over the last
/// dimension, row r of the [.., R, S] scores seeing keys 0..=start + r % t.
fn causal_softmax(scores: &Tensor, t: usize, start: usize, scale: f64) -> Result<Tensor> {
    let dims = scores.dims();
    let (r, s) = (dims[dims.len() - 2], dims[dims.len() - 1]);
    let mask: Vec<f32> = (0..t).flat_map(|i| (0..s).map(move |j| if j <= start + i { 0.0 } else { -1e9 })).collect();
    let mask = Tensor::from_vec(mask, (t, s), scores.device())?.to_dtype(scores.dtype())?;
    let mut grouped = dims[..dims.len() - 2].to_vec();
    grouped.extend([r / t, t, s]);
    let x = (scores.reshape(grouped)? * scale)?.broadcast_add(&mask)?;
    let max = x.max_keepdim(D::Minus1)?.detach();
    let e = x.broadcast_sub(&max)?.exp()?;
    Ok(e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?.reshape(dims)?)
}

#[derive(Clone, Copy)]
struct AttentionDims {
    batch: usize,
    r: usize,
    s: usize,
    hd: usize,
    t: usize,
    start: usize,
}

/// Query rows `row..row + rows` of one head, which see at most the first `keys` keys; their
/// probabilities are stored [rows, keys] at `at` within the batch's share.
#[derive(Clone, Copy)]
struct QueryBlock {
    row: usize,
    rows: usize,
    keys: usize,
    at: usize,
}

struct Attention {
    dims: AttentionDims,
    scale: f64,
    blocks: Vec<QueryBlock>,
    /// Stored probabilities per batch.
    per_batch: usize,
    /// The forward's probabilities, which the backward needs (kept as long as the graph is).
    probs: std::sync::Mutex<Option<CpuStorage>>,
}

impl Attention {
    fn new(dims: AttentionDims, scale: f64, block: usize) -> Attention {
        let AttentionDims { r, t, start, .. } = dims;
        let mut blocks = Vec::new();
        let mut at = 0;
        for head in (0..r).step_by(t) {
            for i in (0..t).step_by(block.max(1)) {
                let rows = block.max(1).min(t - i);
                let keys = start + i + rows;
                blocks.push(QueryBlock { row: head + i, rows, keys, at });
                at += rows * keys;
            }
        }
        Attention { dims, scale, blocks, per_batch: at, probs: std::sync::Mutex::new(None) }
    }

    /// Keys visible to row `i` of block `b`.
    fn visible(&self, b: &QueryBlock, i: usize) -> usize {
        self.dims.start + b.row % self.dims.t + i + 1
    }

    fn check<T>(&self, q: &[T], k: &[T], v: &[T]) -> candle_core::Result<()> {
        let AttentionDims { batch, r, s, hd, .. } = self.dims;
        if q.len() != batch * r * hd || k.len() != batch * s * hd || v.len() != k.len() {
            candle_core::bail!(
                "attention: {} / {} / {} elements for {batch} × [{r} | {s}, {hd}]",
                q.len(),
                k.len(),
                v.len()
            );
        }
        Ok(())
    }

    /// Output [batch, r, hd] and the probabilities of every block.
    fn forward<T: Real>(&self, q: &[T], k: &[T], v: &[T]) -> candle_core::Result<(Vec<T>, Vec<T>)> {
        self.check(q, k, v)?;
        let AttentionDims { batch, r, s, hd, .. } = self.dims;
        let scale = T::of(self.scale);
        let mut out: Vec<T> = Vec::with_capacity(batch * r * hd);
        let mut probs: Vec<T> = Vec::with_capacity(batch * self.per_batch);
        let (o_ptr, p_ptr) = (SendPtr(out.as_mut_ptr()), SendPtr(probs.as_mut_ptr()));
        let task = |(bi, b): (usize, &QueryBlock)| {
            let (q, k, v) = (&q[(bi * r + b.row) * hd..], &k[bi * s * hd..], &v[bi * s * hd..]);
            let none = gemm::Parallelism::None;
            // SAFETY: block b of batch bi alone writes its probabilities [rows, keys] and its
            // output rows, both within capacity; q holds rows·hd and k, v keys·hd elements from
            // these offsets (lengths checked, keys <= start + t <= s). The probabilities are
            // read only after gemm wrote all of them.
            unsafe {
                let p = p_ptr.at(bi * self.per_batch + b.at);
                gemm_into(b.rows, b.keys, hd, p, false, Mat::rows(q.as_ptr(), hd), Mat::cols(k.as_ptr(), hd), none);
                let p = std::slice::from_raw_parts_mut(p, b.rows * b.keys);
                for (i, row) in p.chunks_exact_mut(b.keys).enumerate() {
                    softmax_in_place(row, self.visible(b, i), scale);
                }
                let o = o_ptr.at((bi * r + b.row) * hd);
                gemm_into(b.rows, hd, b.keys, o, false, Mat::rows(p.as_ptr(), b.keys), Mat::rows(v.as_ptr(), hd), none);
            }
        };
        let tasks: Vec<(usize, &QueryBlock)> =
            (0..batch).flat_map(|bi| self.blocks.iter().map(move |b| (bi, b))).collect();
        if batch * r * s < PARALLEL_FROM {
            tasks.into_iter().for_each(task);
        } else {
            tasks.into_par_iter().for_each(task);
        }
        // SAFETY: the blocks cover every output row and every stored probability (hd > 0 and
        // keys > 0; with hd = 0 there is nothing to write).
        unsafe {
            out.set_len(batch * r * hd);
            probs.set_len(batch * self.per_batch);
        }
        Ok((out, probs))
    }

    /// Gradients of q, k and v for the output gradient `dout` [batch, r, hd].
    #[allow(clippy::type_complexity)]
    fn backward<T: Real>(
        &self,
        q: &[T],
        k: &[T],
        v: &[T],
        dout: &[T],
        probs: &[T],
    ) -> candle_core::Result<(Vec<T>, Vec<T>, Vec<T>)> {
        self.check(q, k, v)?;
        let AttentionDims { batch, r, s, hd, .. } = self.dims;
        if dout.len() != q.len() || probs.len() != batch * self.per_batch {
            candle_core::bail!("attention backward: {} output gradients, {} probabilities", dout.len(), probs.len());
        }
        let scale = T::of(self.scale);
        let mut dq: Vec<T> = Vec::with_capacity(q.len());
        let dq_ptr = SendPtr(dq.as_mut_ptr());
        let (mut dk, mut dv) = (vec![T::ZERO; k.len()], vec![T::ZERO; v.len()]);
        let scratch_len = self.blocks.iter().map(|b| b.rows * b.keys).max().unwrap_or(0);
        let task = |(bi, (dk, dv)): (usize, (&mut [T], &mut [T]))| {
            let (k, v) = (&k[bi * s * hd..], &v[bi * s * hd..]);
            let mut ds = vec![T::ZERO; scratch_len];
            let none = gemm::Parallelism::None;
            for b in &self.blocks {
                let rows = (bi * r + b.row) * hd;
                let (q, dout) = (&q[rows..rows + b.rows * hd], &dout[rows..rows + b.rows * hd]);
                let p = &probs[bi * self.per_batch + b.at..][..b.rows * b.keys];
                let ds = &mut ds[..b.rows * b.keys];
                // SAFETY: every operand holds the rows × columns its strides address (the
                // keys of a block are <= s); dq rows are this block's own, within capacity.
                unsafe {
                    // dp = dout·vᵀ, then ds = scale · p ⊙ (dp − Σ p·dp) in place.
                    let (dpv, qv) = (Mat::rows(dout.as_ptr(), hd), Mat::rows(q.as_ptr(), hd));
                    gemm_into(b.rows, b.keys, hd, ds.as_mut_ptr(), false, dpv, Mat::cols(v.as_ptr(), hd), none);
                    // dv += pᵀ·dout
                    gemm_into(b.keys, hd, b.rows, dv.as_mut_ptr(), true, Mat::cols(p.as_ptr(), b.keys), dpv, none);
                    for (i, (g, p)) in ds.chunks_exact_mut(b.keys).zip(p.chunks_exact(b.keys)).enumerate() {
                        softmax_grad_in_place(g, p, self.visible(b, i), scale);
                    }
                    // dq = ds·k, dk += dsᵀ·q
                    let dsm = Mat::rows(ds.as_ptr(), b.keys);
                    gemm_into(b.rows, hd, b.keys, dq_ptr.at(rows), false, dsm, Mat::rows(k.as_ptr(), hd), none);
                    gemm_into(b.keys, hd, b.rows, dk.as_mut_ptr(), true, Mat::cols(ds.as_ptr(), b.keys), qv, none);
                }
            }
        };
        let per = (s * hd).max(1);
        let parts = dk.chunks_mut(per).zip(dv.chunks_mut(per)).enumerate();
        if batch * r * s < PARALLEL_FROM {
            parts.for_each(task);
        } else {
            parts.collect::<Vec<_>>().into_par_iter().for_each(task);
        }
        // SAFETY: the blocks cover every row of dq.
        unsafe { dq.set_len(q.len()) };
        Ok((dq, dk, dv))
    }
}

simd_fn! {
    /// Softmax of `scale · row[..n]` in place; the masked rest becomes 0.
    fn softmax_in_place<T: Real>(row: &mut [T], n: usize, scale: T) {
        let (seen, masked) = row.split_at_mut(n);
        let m = row_max(seen, seen[0]) * scale;
        for x in seen.iter_mut() {
            *x = (*x * scale - m).exp_nonpos();
        }
        let inv = T::ONE / sum(seen);
        for x in seen.iter_mut() {
            *x *= inv;
        }
        masked.fill(T::ZERO);
    }
}

simd_fn! {
    /// `dp` becomes the scores' gradient scale · p · (dp − Σ p·dp) over the n visible keys, 0
    /// past them.
    fn softmax_grad_in_place<T: Real>(dp: &mut [T], p: &[T], n: usize, scale: T) {
        let (seen, masked) = dp.split_at_mut(n);
        let p = &p[..n];
        let c = dot(p, seen);
        for (g, &p) in seen.iter_mut().zip(p) {
            *g = scale * p * (*g - c);
        }
        masked.fill(T::ZERO);
    }
}

fn cpu_data<'a, T: Real>(s: &'a candle_core::Storage, l: &Layout, op: &str) -> candle_core::Result<&'a [T]> {
    match s {
        candle_core::Storage::Cpu(c) => input(c, l, op),
        _ => candle_core::bail!("{op}: CPU tensors only"),
    }
}

impl CustomOp3 for Attention {
    fn name(&self) -> &'static str {
        "causal-attention"
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
        let name = self.name();
        by_dtype!(s1, name, T => {
            let (q, k, v) = (input::<T>(s1, l1, name)?, input::<T>(s2, l2, name)?, input::<T>(s3, l3, name)?);
            let (out, probs) = self.forward(q, k, v)?;
            *self.probs.lock().map_err(|_| candle_core::Error::Msg("attention: poisoned lock".into()))? =
                Some(T::storage(probs));
            Ok((T::storage(out), l1.shape().clone()))
        })
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        _out: &Tensor,
        dout: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let name = self.name();
        let dout = dout.contiguous()?;
        let probs = self.probs.lock().map_err(|_| candle_core::Error::Msg("attention: poisoned lock".into()))?;
        let probs =
            probs.as_ref().ok_or_else(|| candle_core::Error::Msg("attention: no forward to go back through".into()))?;
        let ((sq, lq), (sk, lk), (sv, lv), (sd, ld)) =
            (q.storage_and_layout(), k.storage_and_layout(), v.storage_and_layout(), dout.storage_and_layout());
        by_dtype!(probs, name, T => {
            let (dq, dk, dv) = self.backward(
                cpu_data::<T>(&sq, lq, name)?,
                cpu_data::<T>(&sk, lk, name)?,
                cpu_data::<T>(&sv, lv, name)?,
                cpu_data::<T>(&sd, ld, name)?,
                T::data(probs).unwrap_or_default(),
            )?;
            let tensor = |d: Vec<T>, like: &Tensor| {
                Tensor::from_storage(candle_core::Storage::Cpu(T::storage(d)), like.shape().clone(), candle_core::op::BackpropOp::none(), false)
            };
            Ok((Some(tensor(dq, q)), Some(tensor(dk, k)), Some(tensor(dv, v))))
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
        let threads = rayon::current_num_threads();
        let mut dst: Vec<T> = Vec::with_capacity(len);
        let out = SendPtr(dst.as_mut_ptr());
        let one = |i: usize, par: gemm::Parallelism| {
            let a = a[i * m * k..].as_ptr();
            let a = if ta { Mat::cols(a, m) } else { Mat::rows(a, k) };
            let b = b[i * k * n..].as_ptr();
            let b = if tb { Mat::cols(b, k) } else { Mat::rows(b, n) };
            // SAFETY: operand slices hold batch·m·k and batch·k·n elements (checked above), the
            // output has capacity for batch·m·n.
            unsafe { gemm_into(m, n, k, out.at(i * m * n), false, a, b, par) }
        };
        if batch >= 2 * threads && threads > 1 {
            // Many small products: one per task.
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

/// A matrix operand for gemm: element (i, j) at `ptr + i·rs + j·cs`.
#[derive(Clone, Copy)]
struct Mat<T> {
    ptr: *const T,
    rs: isize,
    cs: isize,
}

impl<T> Mat<T> {
    /// Row-major with `ld` elements per row.
    fn rows(ptr: *const T, ld: usize) -> Mat<T> {
        Mat { ptr, rs: ld as isize, cs: 1 }
    }

    /// The transpose of a row-major matrix with `ld` elements per row.
    fn cols(ptr: *const T, ld: usize) -> Mat<T> {
        Mat { ptr, rs: 1, cs: ld as isize }
    }
}

/// `dst = a·b` (or `dst += a·b` with `acc`) for a [m, k], b [k, n] and a row-major dst [m, n].
///
/// # Safety
/// `a` and `b` must address m×k and k×n readable elements and `dst` m×n writable ones (and
/// readable ones with `acc`); dst must not overlap the operands.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_into<T: Real>(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut T,
    acc: bool,
    a: Mat<T>,
    b: Mat<T>,
    par: gemm::Parallelism,
) {
    // With acc, dst = 1·dst + 1·a·b; otherwise gemm only writes dst.
    let alpha = if acc { T::ONE } else { T::ZERO };
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            n as isize,
            acc,
            a.ptr,
            a.cs,
            a.rs,
            b.ptr,
            b.cs,
            b.rs,
            alpha,
            T::ONE,
            false,
            false,
            false,
            par,
        )
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
    fn attention_matches_product_masked_softmax_product() {
        for (dtype, tol) in CASES {
            // Two heads' t queries stacked against one key/value head, queries from `start`,
            // blocks that split a head unevenly; the last case is big enough for the pool.
            for (lead, t, s, start, block) in
                [(vec![2, 3], 4, 6, 2, 3), (vec![1], 5, 5, 0, 64), (vec![3, 4], 64, 70, 6, 24)]
            {
                let (r, hd) = (2 * t, 8);
                let shape = |rows: usize| [lead.clone(), vec![rows, hd]].concat();
                let (q, k, v) = (var(&shape(r), 1.0, dtype), var(&shape(s), 1.0, dtype), var(&shape(s), 1.0, dtype));
                let scale = 0.35;
                let reference = |ts: &[Tensor]| {
                    let mask: Vec<f64> = (0..r)
                        .flat_map(|i| (0..s).map(move |j| if j <= start + i % t { 0.0 } else { f64::NEG_INFINITY }))
                        .collect();
                    let mask = Tensor::from_vec(mask, (r, s), &Device::Cpu).unwrap().to_dtype(dtype).unwrap();
                    let kt = ts[1].t().unwrap().contiguous().unwrap();
                    let z = (ts[0].matmul(&kt).unwrap() * scale).unwrap().broadcast_add(&mask).unwrap();
                    let max = z.max_keepdim(D::Minus1).unwrap().detach();
                    let e = z.broadcast_sub(&max).unwrap().exp().unwrap();
                    let p = e.broadcast_div(&e.sum_keepdim(D::Minus1).unwrap()).unwrap();
                    p.matmul(&ts[2]).unwrap()
                };
                let fused =
                    |ts: &[Tensor]| attention_in_blocks(&ts[0], &ts[1], &ts[2], t, start, scale, block).unwrap();
                check("attention", &[&q, &k, &v], &fused, &reference, tol * 10.0);
                let composed = |ts: &[Tensor]| {
                    super::super::fused::composed(|| attention(&ts[0], &ts[1], &ts[2], t, start, scale).unwrap())
                };
                check("composed attention", &[&q, &k, &v], &composed, &reference, tol * 10.0);
            }
        }
        let x = |d: &[usize]| Tensor::zeros(d, DType::F32, &Device::Cpu).unwrap();
        assert!(attention(&x(&[1, 6, 4]), &x(&[1, 6, 4]), &x(&[1, 6, 4]), 4, 0, 1.0).is_err(), "6 rows, 4 queries");
        assert!(attention(&x(&[1, 4, 4]), &x(&[1, 5, 4]), &x(&[1, 5, 4]), 4, 2, 1.0).is_err(), "6 positions, 5 keys");
        assert!(
            attention(&x(&[1, 4, 4]), &x(&[1, 5, 4]), &x(&[1, 6, 4]), 4, 0, 1.0).is_err(),
            "keys and values differ"
        );
        assert!(attention(&x(&[1, 4, 4]), &x(&[2, 5, 4]), &x(&[2, 5, 4]), 4, 0, 1.0).is_err(), "batches differ");
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
                {
                    // 210 queries seeing 1..=210 keys.
                    let a = x.reshape((1, 210, 40)).unwrap();
                    attention(&a, &a.cos().unwrap(), &a.sin().unwrap(), 210, 0, 0.3).unwrap()
                },
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
