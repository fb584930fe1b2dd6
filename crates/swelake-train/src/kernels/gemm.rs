//! Matrix products straight over `gemm`: C = op(A)·op(B) with op the identity or a transpose,
//! read in place (no transposed copies in the graph), with the backward as products. The one
//! place with `unsafe` pointer arithmetic: gemm's strided operands and the parallel batches
//! writing disjoint parts of one output.

use anyhow::{Context, Result};
use candle_core::{CpuStorage, CustomOp2, Layout, Shape, Tensor};
use rayon::prelude::*;

use super::{by_dtype, fusable, input, Real};

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
pub(crate) struct SendPtr<T>(pub(crate) *mut T);
// SAFETY: only used to write disjoint parts of one buffer that outlives the parallel section.
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// A method, so that closures capture the wrapper (Send) rather than its raw pointer.
    ///
    /// # Safety
    /// `offset` must be within the allocation.
    pub(crate) unsafe fn at(self, offset: usize) -> *mut T {
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
        let one = |i: usize, par: ::gemm::Parallelism| {
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
            (0..batch).into_par_iter().for_each(|i| one(i, ::gemm::Parallelism::None));
        } else {
            let par = if threads > 1 { ::gemm::Parallelism::Rayon(threads) } else { ::gemm::Parallelism::None };
            (0..batch).for_each(|i| one(i, par));
        }
        // SAFETY: every one of the batch·m·n elements was written by gemm (k > 0).
        unsafe { dst.set_len(len) };
        Ok(dst)
    }
}

/// A matrix operand for gemm: element (i, j) at `ptr + i·rs + j·cs`.
#[derive(Clone, Copy)]
pub(crate) struct Mat<T> {
    ptr: *const T,
    rs: isize,
    cs: isize,
}

impl<T> Mat<T> {
    /// Row-major with `ld` elements per row.
    pub(crate) fn rows(ptr: *const T, ld: usize) -> Mat<T> {
        Mat { ptr, rs: ld as isize, cs: 1 }
    }

    /// The transpose of a row-major matrix with `ld` elements per row.
    pub(crate) fn cols(ptr: *const T, ld: usize) -> Mat<T> {
        Mat { ptr, rs: 1, cs: ld as isize }
    }
}

/// `dst = a·b` (or `dst += a·b` with `acc`) for a [m, k], b [k, n] and a row-major dst [m, n].
///
/// # Safety
/// `a` and `b` must address m×k and k×n readable elements and `dst` m×n writable ones (and
/// readable ones with `acc`); dst must not overlap the operands.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_into<T: Real>(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut T,
    acc: bool,
    a: Mat<T>,
    b: Mat<T>,
    par: ::gemm::Parallelism,
) {
    // With acc, dst = 1·dst + 1·a·b; otherwise gemm only writes dst.
    let alpha = if acc { T::ONE } else { T::ZERO };
    unsafe {
        ::gemm::gemm(
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
    use crate::kernels::testing::{check, var, CASES};
    use candle_core::{DType, Device};

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
}
