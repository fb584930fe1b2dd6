//! Fused CPU kernels, each with its own backward, for every op of a training step that is
//! not a plain product: RMSNorm ([`rms_norm`]), the move of heads with RoPE ([`rope`]), causal
//! attention ([`attention`]), SwiGLU ([`swiglu`]), the products themselves over `gemm`
//! ([`gemm`]), the head's log-probabilities and entropy ([`head`]) and the AdamW update
//! ([`adamw`]).
//!
//! Composed from tensor primitives each of these is 5–10 operations forward and more
//! backward, every one a full pass over an activation with a fresh allocation, and candle's
//! backward adds a zero-filled buffer and an addition per edge of the graph. In a
//! SmolLM2-shaped step that was as much time as the matmuls (perf, `swelake bench train`).
//! Here a row is read while it is in cache and the gradient is written once. Other devices
//! (CUDA) and other dtypes keep the composed expressions, which the tests use as the
//! reference for values and gradients.
//!
//! This file holds what the kernels share: the element trait [`Real`] (f32 and f64), the
//! vectorisable building blocks (16-lane sums, an `exp` without calls), the [`simd_fn!`]
//! dispatch to AVX-512 / AVX2 copies, and the thresholds for going parallel. Results never
//! depend on the vector path or the thread count: no FMA contraction, fixed reduction orders.

pub mod adamw;
pub mod attention;
pub mod gemm;
pub mod head;
pub mod rms_norm;
pub mod rope;
pub mod swiglu;

use std::ops::{Add, AddAssign, Div, Mul, MulAssign, Neg, Sub};

use candle_core::{CpuStorage, DType, Layout, Tensor};
use rayon::prelude::*;

pub use attention::attention;
pub use gemm::{linear, matmul};
pub use head::{entropy, target_logprobs};
pub use rms_norm::rms_norm;
pub use rope::{merge_heads, split_heads, Rotary};
pub use swiglu::swiglu;

/// Below this many elements one thread does it all: handing work to the pool costs more than
/// the work (the tiny model's tensors).
pub(crate) const PARALLEL_FROM: usize = 1 << 16;

/// Elements per task of the elementwise kernels.
pub(crate) const CHUNK: usize = 1 << 14;

/// Partial sums a reduction keeps so that its loop vectorises.
pub(crate) const LANES: usize = 16;

/// Whether the fused kernels apply to `t`: a CPU tensor of f32 or f64 (and not a test asking
/// for the composed path).
pub(crate) fn fusable(t: &Tensor) -> bool {
    t.device().is_cpu() && matches!(t.dtype(), DType::F32 | DType::F64) && t.rank() >= 1 && !COMPOSED.get()
}

thread_local! {
    /// Set by tests to run the composed expressions (the path of other devices) on the CPU.
    static COMPOSED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with the composed tensor expressions instead of the fused kernels, on this thread.
#[cfg(test)]
pub(crate) fn composed<R>(f: impl FnOnce() -> R) -> R {
    COMPOSED.set(true);
    let r = f();
    COMPOSED.set(false);
    r
}

/// The element types of the kernels. The f32 reductions keep [`LANES`] partial sums so that
/// they vectorise, and carry them into f64 every 1024 elements.
pub trait Real:
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
    const NEG_INFINITY: Self;
    fn of(x: f64) -> Self;
    fn to_f64(self) -> f64;
    fn sqrt(self) -> Self;
    /// `e^x` for x <= 0.
    fn exp_nonpos(self) -> Self;
    /// `(Σ exp(x − shift), Σ exp(x − shift)·(x − shift))` over the row (shift >= max).
    fn sum_exp(row: &[Self], shift: Self) -> (f64, f64);
    /// `out = scale · exp(x − shift)` (shift >= max).
    fn scaled_exp(row: &[Self], shift: Self, scale: f64, out: &mut [Self]);
    fn data(s: &CpuStorage) -> Option<&[Self]>;
    fn data_mut(s: &mut CpuStorage) -> Option<&mut [Self]>;
    fn storage(v: Vec<Self>) -> CpuStorage;
}

/// One macro implements [`Real`] for both types; only `exp` and the row reductions differ.
macro_rules! impl_real {
    ($t:ident, $variant:ident, $exp_nonpos:expr, $sum_exp:path, $scaled_exp:path) => {
        impl Real for $t {
            const ZERO: $t = 0.0;
            const ONE: $t = 1.0;
            const NEG_INFINITY: $t = $t::NEG_INFINITY;
            #[inline(always)]
            fn of(x: f64) -> $t {
                x as $t
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn sqrt(self) -> $t {
                $t::sqrt(self)
            }
            #[inline(always)]
            fn exp_nonpos(self) -> $t {
                $exp_nonpos(self)
            }
            #[inline(always)]
            fn sum_exp(row: &[$t], shift: $t) -> (f64, f64) {
                $sum_exp(row, shift)
            }
            #[inline(always)]
            fn scaled_exp(row: &[$t], shift: $t, scale: f64, out: &mut [$t]) {
                $scaled_exp(row, shift, scale, out)
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

impl_real!(f32, F32, exp_f32, sum_exp_f32, scaled_exp_f32);
impl_real!(f64, F64, f64::exp, sum_exp_f64, scaled_exp_f64);

#[inline(always)]
fn sum_exp_f64(row: &[f64], shift: f64) -> (f64, f64) {
    row.iter().fold((0.0, 0.0), |(s, sx), &x| {
        let e = (x - shift).exp();
        (s + e, sx + e * (x - shift))
    })
}

#[inline(always)]
fn scaled_exp_f64(row: &[f64], shift: f64, scale: f64, out: &mut [f64]) {
    for (o, &x) in out.iter_mut().zip(row) {
        *o = scale * (x - shift).exp();
    }
}

#[inline(always)]
fn sum_exp_f32(row: &[f32], shift: f32) -> (f64, f64) {
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
fn scaled_exp_f32(row: &[f32], shift: f32, scale: f64, out: &mut [f32]) {
    let scale = scale as f32;
    for (o, &x) in out.iter_mut().zip(row) {
        *o = scale * exp_f32(x - shift);
    }
}

/// `e^x` for x <= 0 (arguments here are logits minus their row maximum), to ~2 ulp, without
/// branches or calls so that loops over a row vectorise: x = n·ln2 + r with |r| <= ln2/2, a
/// degree-6 polynomial for e^r, and 2^n put into the exponent bits. Underflows to ~0 below
/// -87 (where e^x is below f32's normal range, irrelevant next to the row's 1).
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
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
pub(crate) fn row_max<T: Copy + PartialOrd>(row: &[T], lowest: T) -> T {
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
pub(crate) fn simd_level() -> u8 {
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
pub(crate) fn cap_simd_level(level: u8) {
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
                match $crate::kernels::simd_level() {
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
pub(crate) use simd_fn;

/// The contiguous elements of a storage slice that `l` lays out.
pub(crate) fn contiguous<'a, T>(s: &'a [T], l: &Layout) -> candle_core::Result<&'a [T]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&s[a..b]),
        None => candle_core::bail!("the fused CPU kernels need contiguous inputs"),
    }
}

/// [`contiguous`] for writing.
pub(crate) fn contiguous_mut<'a, T>(s: &'a mut [T], l: &Layout) -> candle_core::Result<&'a mut [T]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&mut s[a..b]),
        None => candle_core::bail!("the fused CPU kernels need contiguous inputs"),
    }
}

pub(crate) fn input<'a, T: Real>(s: &'a CpuStorage, l: &Layout, op: &str) -> candle_core::Result<&'a [T]> {
    match T::data(s) {
        Some(v) => contiguous(v, l),
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
pub(crate) use by_dtype;

/// Calls `f(row index, row)` for every `width`-long row of `out`, on the pool when it is big.
pub(crate) fn each_row<T: Send, F: Fn(usize, &mut [T]) + Sync + Send>(out: &mut [T], width: usize, f: F) {
    if out.len() < PARALLEL_FROM {
        out.chunks_mut(width).enumerate().for_each(|(i, r)| f(i, r));
    } else {
        out.par_chunks_mut(width).enumerate().for_each(|(i, r)| f(i, r));
    }
}

/// Σ a·b with 16 partial sums, so that the loop vectorises.
#[inline(always)]
pub(crate) fn dot<T: Real>(a: &[T], b: &[T]) -> T {
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
pub(crate) fn sum<T: Real>(a: &[T]) -> T {
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

/// What the kernels' tests share: random inputs and a check of values and every gradient
/// against a reference expression.
#[cfg(test)]
pub(crate) mod testing {
    use candle_core::{DType, Device, Tensor, Var};

    pub fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        let d = (a.to_dtype(DType::F64).unwrap() - b.to_dtype(DType::F64).unwrap()).unwrap();
        d.abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f64>().unwrap()
    }

    pub fn var(shape: &[usize], std: f64, dtype: DType) -> Var {
        Var::from_tensor(&Tensor::randn(0f64, std, shape, &Device::Cpu).unwrap().to_dtype(dtype).unwrap()).unwrap()
    }

    /// Checks values and the gradients of every input against `reference`, under a fixed
    /// weighting of the outputs (so that each output element's gradient differs).
    pub fn check(
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

    pub const CASES: [(DType, f64); 2] = [(DType::F64, 1e-12), (DType::F32, 3e-6)];
}

#[cfg(test)]
mod tests {
    use super::testing::var;
    use super::*;
    use candle_core::{Device, D};

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
                target_logprobs(x, &t).unwrap(),
                entropy(x).unwrap(),
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
            cap_simd_level(level);
            let got = run();
            cap_simd_level(u8::MAX);
            for (i, (a, b)) in widest.iter().zip(&got).enumerate() {
                let same = a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "output {i} differs at vector level {level}");
            }
        }
    }
}
