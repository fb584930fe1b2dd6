//! Fused CPU kernels for the output head's per-token statistics.
//!
//! The training step needs, per completion token, the log-probability of the sampled token
//! and the entropy of the distribution. Composed from tensor primitives (max, subtract, exp,
//! sum, log, subtract, gather — and again for the entropy), each is a dozen passes over a
//! [tokens, 49k] tensor with a fresh 100 MB allocation per pass, in the forward and again in
//! the backward: most of the step's non-matmul time (perf, `swelake bench train`). Here each
//! vocabulary row is read a few times while it is in cache, and the backward writes the
//! gradient directly. Other devices (CUDA) keep the composed path, which these kernels are
//! tested against.

use anyhow::Result;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Layout, Shape, Tensor, D};
use rayon::prelude::*;

/// Log-probabilities of `targets` [..] (u32) under `logits` [.., V], shaped like `targets`.
pub fn target_logprobs(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    if !fusable(logits) {
        let lp = super::model::log_softmax(logits)?;
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
        let lp = super::model::log_softmax(&logits)?;
        return Ok((lp.exp()? * &lp)?.sum(D::Minus1)?.neg()?);
    }
    let mut dims = logits.dims().to_vec();
    dims.pop();
    let (rows, v) = rows_of(&logits)?;
    Ok(logits.contiguous()?.reshape((rows, v))?.apply_op1_no_bwd(&Entropy)?.reshape(dims)?)
}

/// Below this many elements one thread does it all: handing work to the pool costs more than
/// the work (the tiny model's logits).
pub(super) const PARALLEL_FROM: usize = 1 << 16;

pub(super) fn fusable(t: &Tensor) -> bool {
    t.device().is_cpu() && matches!(t.dtype(), DType::F32 | DType::F64) && t.rank() >= 1 && !COMPOSED.get()
}

thread_local! {
    /// Set by tests to run the composed expressions (the path of other devices) on the CPU.
    static COMPOSED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with the composed tensor expressions instead of the fused kernels, on this thread.
#[cfg(test)]
pub(super) fn composed<R>(f: impl FnOnce() -> R) -> R {
    COMPOSED.set(true);
    let r = f();
    COMPOSED.set(false);
    r
}

fn rows_of(t: &Tensor) -> Result<(usize, usize)> {
    let v = t.dim(D::Minus1)?;
    Ok((t.elem_count() / v.max(1), v))
}

/// The element types the kernels run on. The f32 loops keep 16 partial sums so that they
/// vectorise, and carry them into f64 every 1024 elements.
trait Float: Copy + Send + Sync + PartialOrd + std::ops::Sub<Output = Self> + 'static {
    fn to_f64(self) -> f64;
    fn from_f64(x: f64) -> Self;
    fn neg_infinity() -> Self;
    /// `(Σ exp(x − shift), Σ exp(x − shift)·(x − shift))` over the row (shift >= max).
    fn sum_exp(row: &[Self], shift: Self) -> (f64, f64);
    /// `out = scale · exp(x − shift)` (shift >= max).
    fn scaled_exp(row: &[Self], shift: Self, scale: f64, out: &mut [Self]);
}

impl Float for f64 {
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline(always)]
    fn from_f64(x: f64) -> Self {
        x
    }
    #[inline(always)]
    fn neg_infinity() -> Self {
        f64::NEG_INFINITY
    }
    #[inline(always)]
    fn sum_exp(row: &[f64], shift: f64) -> (f64, f64) {
        row.iter().fold((0.0, 0.0), |(s, sx), &x| {
            let e = (x - shift).exp();
            (s + e, sx + e * (x - shift))
        })
    }
    #[inline(always)]
    fn scaled_exp(row: &[f64], shift: f64, scale: f64, out: &mut [f64]) {
        for (o, &x) in out.iter_mut().zip(row) {
            *o = scale * (x - shift).exp();
        }
    }
}

pub(super) const LANES: usize = 16;

impl Float for f32 {
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn from_f64(x: f64) -> Self {
        x as f32
    }
    #[inline(always)]
    fn neg_infinity() -> Self {
        f32::NEG_INFINITY
    }
    #[inline(always)]
    fn sum_exp(row: &[f32], shift: f32) -> (f64, f64) {
        let (mut s, mut sx) = (0f64, 0f64);
        for block in row.chunks(1024) {
            let (mut acc, mut accx) = ([0f32; LANES], [0f32; LANES]);
            let mut lanes = block.chunks_exact(LANES);
            for c in &mut lanes {
                for i in 0..LANES {
                    let d = c[i] - shift;
                    let e = exp_f32(d);
                    acc[i] += e;
                    accx[i] += e * d;
                }
            }
            for &x in lanes.remainder() {
                let d = x - shift;
                let e = exp_f32(d);
                acc[0] += e;
                accx[0] += e * d;
            }
            s += acc.iter().map(|&v| v as f64).sum::<f64>();
            sx += accx.iter().map(|&v| v as f64).sum::<f64>();
        }
        (s, sx)
    }
    #[inline(always)]
    fn scaled_exp(row: &[f32], shift: f32, scale: f64, out: &mut [f32]) {
        let scale = scale as f32;
        for (o, &x) in out.iter_mut().zip(row) {
            *o = scale * exp_f32(x - shift);
        }
    }
}

/// `e^x` for x <= 0 (arguments here are logits minus their row maximum), to ~2 ulp, without
/// branches or calls so that loops over a row vectorise: x = n·ln2 + r with |r| <= ln2/2, a
/// degree-6 polynomial for e^r, and 2^n put into the exponent bits. Underflows to ~0 below
/// -87 (where e^x is below f32's normal range, irrelevant next to the row's 1).
#[inline(always)]
pub(super) fn exp_f32(x: f32) -> f32 {
    // Round to nearest by adding 1.5·2²³ (|n| < 2²² here): `f32::round` is a libm call on the
    // baseline x86-64 target, which stops the loops around this from vectorising. The integer
    // n is then the low bits of the sum.
    const MAGIC: f32 = 12_582_912.0;
    let x = x.max(-87.0);
    let shifted = x * std::f32::consts::LOG2_E + MAGIC;
    let n = shifted - MAGIC;
    // ln2 split in two so that n·ln2 is exact enough (Cody-Waite).
    let r = x - n * 0.693_359_4 + n * 2.121_944_4e-4;
    let p = 1.0
        + r * (1.0 + r * (0.5 + r * (0.166_666_67 + r * (0.041_666_668 + r * (0.008_333_452 + r * 0.001_388_949_4)))));
    // Wrapping arithmetic: an overflow check (debug builds) would be a branch in the loop.
    let biased = shifted.to_bits().wrapping_sub(MAGIC.to_bits()).wrapping_add(127);
    p * f32::from_bits(biased << 23)
}

/// The row's maximum, from 16 running maxima so that the loop vectorises.
#[inline(always)]
pub(super) fn row_max<T: Copy + PartialOrd>(row: &[T], lowest: T) -> T {
    let max = |a: T, b: T| if b > a { b } else { a };
    let mut acc = [lowest; LANES];
    let mut lanes = row.chunks_exact(LANES);
    for c in &mut lanes {
        for i in 0..LANES {
            acc[i] = max(acc[i], c[i]);
        }
    }
    let m = lanes.remainder().iter().fold(lowest, |a, &b| max(a, b));
    acc.iter().fold(m, |a, &b| max(a, b))
}

/// Which vector extensions the kernels may use: 2 AVX-512, 1 AVX2/FMA, 0 the baseline.
#[cfg(target_arch = "x86_64")]
pub(super) fn simd_level() -> u8 {
    use std::sync::OnceLock;
    static LEVEL: OnceLock<u8> = OnceLock::new();
    SIMD_CAP.load(std::sync::atomic::Ordering::Relaxed).min(*LEVEL.get_or_init(|| {
        if std::arch::is_x86_feature_detected!("avx512f") {
            2
        } else if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            1
        } else {
            0
        }
    }))
}

/// The highest level [`simd_level`] may return: tests lower it to compare the paths.
static SIMD_CAP: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(u8::MAX);

#[cfg(test)]
pub(super) fn cap_simd_level(level: u8) {
    SIMD_CAP.store(level, std::sync::atomic::Ordering::Relaxed);
}

/// Defines a kernel function that runs compiled for AVX-512 or AVX2/FMA when the CPU has
/// them. The crate is built for baseline x86-64 (SSE2); the kernels' loops are written to
/// vectorise, and the exp-heavy ones run several times faster on wider vectors. Results do not
/// depend on the path taken: Rust never contracts a·b + c into an FMA, and every reduction
/// keeps a fixed order over 16 lanes. The body is an `inline(always)` function so that it is
/// compiled into each feature-specific copy (a closure would stay a separate baseline call).
macro_rules! simd_fn {
    ($(#[$m:meta])* $vis:vis fn $name:ident<$T:ident: $bound:path>($($a:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$m])*
        $vis fn $name<$T: $bound>($($a: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body<$T: $bound>($($a: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx2,fma")]
                unsafe fn v4<$T: $bound>($($a: $ty),*) $(-> $ret)? {
                    body($($a),*)
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn v3<$T: $bound>($($a: $ty),*) $(-> $ret)? {
                    body($($a),*)
                }
                match $crate::train::fused::simd_level() {
                    // SAFETY: the CPU has these features (detected at run time).
                    2 => return unsafe { v4($($a),*) },
                    1 => return unsafe { v3($($a),*) },
                    _ => {}
                }
            }
            body($($a),*)
        }
    };
}
pub(super) use simd_fn;

/// Row maximum and `ln Σ exp(x)` (the log-sum-exp).
#[inline(always)]
fn max_and_lse<T: Float>(row: &[T]) -> (T, f64) {
    let m = row_max(row, T::neg_infinity());
    let (s, _) = T::sum_exp(row, m);
    (m, m.to_f64() + s.ln())
}

pub(super) fn slices<'a, T: 'static>(s: &'a [T], l: &Layout) -> candle_core::Result<&'a [T]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&s[a..b]),
        None => candle_core::bail!("fused head kernels need contiguous inputs"),
    }
}

fn targets<'a>(s: &'a CpuStorage, l: &Layout, op: &str) -> candle_core::Result<&'a [u32]> {
    match s {
        CpuStorage::U32(t) => slices(t, l),
        _ => candle_core::bail!("{op}: targets must be u32"),
    }
}

/// Log-probability of each row's target: logits [N, V] (f32/f64), targets [N] (u32) → [N].
struct TargetLogprob;

simd_fn! {
    fn logprob_row<T: Float>(row: &[T], t: u32) -> T {
        let (_, lse) = max_and_lse(row);
        T::from_f64(row[t as usize].to_f64() - lse)
    }
}

fn logprob_rows<T: Float>(x: &[T], t: &[u32], v: usize) -> candle_core::Result<Vec<T>> {
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
            CpuStorage::F32(x) => CpuStorage::F32(logprob_rows(slices(x, l1)?, t, v)?),
            CpuStorage::F64(x) => CpuStorage::F64(logprob_rows(slices(x, l1)?, t, v)?),
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
    fn logprob_grad_row<T: Float>(o: &mut [T], row: &[T], t: u32, g: T) {
        let (_, lse) = max_and_lse(row);
        let g = g.to_f64();
        T::scaled_exp(row, T::from_f64(lse), -g, o);
        o[t as usize] = T::from_f64(o[t as usize].to_f64() + g);
    }
}

fn logprob_grad_rows<T: Float>(x: &[T], t: &[u32], g: &[T], v: usize) -> Vec<T> {
    let mut out = vec![T::from_f64(0.0); x.len()];
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
                CpuStorage::F32(logprob_grad_rows(slices(x, l1)?, t, slices(g, l3)?, v))
            }
            (CpuStorage::F64(x), CpuStorage::F64(g)) => {
                CpuStorage::F64(logprob_grad_rows(slices(x, l1)?, t, slices(g, l3)?, v))
            }
            _ => candle_core::bail!("target-logprob-grad: logits and gradient must be both f32 or both f64"),
        };
        Ok((out, l1.shape().clone()))
    }
}

/// Entropy of each row: `lse − Σ softmax·x`, from one max pass and one exp pass.
struct Entropy;

simd_fn! {
    fn entropy_row<T: Float>(row: &[T]) -> T {
        let m = row_max(row, T::neg_infinity());
        let (s, sx) = T::sum_exp(row, m);
        // H = lse − Σ p·x, with lse = m + ln Σe and Σ p·x = m + Σ e·(x − m) / Σ e.
        T::from_f64(s.ln() - sx / s)
    }
}

fn entropy_rows<T: Float>(x: &[T], v: usize) -> Vec<T> {
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
            CpuStorage::F32(x) => CpuStorage::F32(entropy_rows(slices(x, l)?, v)),
            CpuStorage::F64(x) => CpuStorage::F64(entropy_rows(slices(x, l)?, v)),
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
        let lp = super::super::model::log_softmax(logits).unwrap();
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
            let lp = super::super::model::log_softmax(x.as_tensor()).unwrap();
            let want = (lp.exp().unwrap() * &lp).unwrap().sum(D::Minus1).unwrap().neg().unwrap();
            assert!(max_diff(&entropy(x.as_tensor()).unwrap(), &want) < tol * 10.0, "{dtype:?} entropy");
        }
    }

    #[test]
    fn exp_f32_is_accurate_over_the_shifted_range() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x <= 0.0 {
            let (got, want) = (exp_f32(x) as f64, (x as f64).exp());
            worst = worst.max((got - want).abs() / want);
            x += 0.000_7;
        }
        assert!(worst < 5e-7, "relative error {worst}");
        assert_eq!(exp_f32(0.0), 1.0);
        assert!(exp_f32(-200.0) < 1e-37);
    }

    #[test]
    fn out_of_vocabulary_target_is_an_error() {
        let x = Tensor::zeros((2, 4), DType::F32, &Device::Cpu).unwrap();
        let t = Tensor::new(&[1u32, 4], &Device::Cpu).unwrap();
        assert!(target_logprobs(&x, &t).is_err());
    }
}
