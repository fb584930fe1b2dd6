//! Causal attention, softmax(scale · q·kᵀ, causal mask) · v, as one op with its backward.

use anyhow::Result;
use candle_core::{CpuStorage, CustomOp3, Layout, Shape, Tensor, D};
use rayon::prelude::*;

use super::gemm::{gemm_into, Mat, SendPtr};
use super::{by_dtype, dot, fusable, input, matmul, row_max, simd_fn, sum, Real, PARALLEL_FROM};

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
            let none = ::gemm::Parallelism::None;
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
            let none = ::gemm::Parallelism::None;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{check, var, CASES};
    use candle_core::{DType, Device};

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
                    crate::kernels::composed(|| attention(&ts[0], &ts[1], &ts[2], t, start, scale).unwrap())
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
}
