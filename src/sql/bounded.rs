//! Scalar functions that build values, bounded: `SELECT length(repeat('x', 2000000000))` would
//! have DataFusion build a 2 GB string (during planning, when it folds the constant, where no
//! timeout reaches it), outside any memory pool. The server's sessions register these
//! wrappers over the built-ins of the same names: a call whose result would pass the limit
//! fails with a clear error (SQLSTATE 53200) before anything is allocated where its size can
//! be told from the arguments (`repeat`, `lpad`, `rpad`, `range`, `generate_series`,
//! `array_repeat`, `array_resize`), and right after it is built for the others (`concat`,
//! `concat_ws`, `replace`, `regexp_replace`, `overlay`, `translate`, `array_concat`), whose
//! results are at most their inputs' size times their count, so a nest of them grows by a
//! bounded factor per level before it is stopped.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Int64Array};
use arrow::datatypes::{DataType, FieldRef};
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::logical_expr::simplify::{ExprSimplifyResult, SimplifyContext};
use datafusion::logical_expr::{
    ColumnarValue, Documentation, Expr, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
};
use datafusion::prelude::SessionContext;

/// How a function's result size is told before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Size {
    /// `repeat(s, n)`: the bytes of `s` times `n`, per row.
    Repeat,
    /// `lpad(s, n [, fill])`, `rpad`: `n` characters of up to 4 bytes, per row.
    Pad,
    /// `range(start, stop [, step])`, `generate_series`: the elements times 8 bytes.
    Range,
    /// `array_repeat(x, n)`: `n` elements (16 bytes each, or the string's bytes).
    ArrayRepeat,
    /// `array_resize(a, n [, v])`: `n` elements of 16 bytes.
    ArrayResize,
    /// Only its result's size, once built.
    After,
}

const FUNCTIONS: &[(&str, Size)] = &[
    ("repeat", Size::Repeat),
    ("lpad", Size::Pad),
    ("rpad", Size::Pad),
    ("range", Size::Range),
    ("generate_series", Size::Range),
    ("array_repeat", Size::ArrayRepeat),
    ("array_resize", Size::ArrayResize),
    ("concat", Size::After),
    ("concat_ws", Size::After),
    ("replace", Size::After),
    ("regexp_replace", Size::After),
    ("overlay", Size::After),
    ("translate", Size::After),
    ("array_concat", Size::After),
];

/// Registers the bounded functions in `ctx` in place of the built-ins: one call's result (a
/// batch of rows) may hold at most `limit` bytes.
pub fn register(ctx: &SessionContext, limit: usize) {
    for (name, size) in FUNCTIONS {
        if let Some(udf) = ctx.state().scalar_functions().get(*name).cloned() {
            let inner = udf.inner().clone();
            ctx.register_udf(ScalarUDF::new_from_impl(Bounded { inner, size: *size, limit }));
        }
    }
}

#[derive(Debug)]
struct Bounded {
    inner: Arc<dyn ScalarUDFImpl>,
    size: Size,
    limit: usize,
}

impl PartialEq for Bounded {
    fn eq(&self, other: &Self) -> bool {
        self.inner.name() == other.inner.name() && self.size == other.size && self.limit == other.limit
    }
}

impl Eq for Bounded {}

impl Hash for Bounded {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.inner.name().hash(state);
        self.size.hash(state);
        self.limit.hash(state);
    }
}

impl Bounded {
    fn refuse(&self, bytes: u128) -> DataFusionError {
        DataFusionError::ResourcesExhausted(format!(
            "{}() would build {} of values in one call, past this server's limit of {} (a quarter of \
             --memory-limit): ask for smaller values",
            self.inner.name(),
            human(bytes),
            human(self.limit as u128)
        ))
    }

    /// The bytes the call would build, told from its arguments (`None`: not told before).
    fn before(&self, args: &ScalarFunctionArgs) -> Result<Option<u128>> {
        let rows = args.number_rows.max(1);
        let a = &args.args;
        let bytes = match self.size {
            Size::Repeat if a.len() >= 2 => sum_products(&byte_lengths(&a[0])?, &ints(&a[1])?, 1, rows),
            Size::Pad if a.len() >= 2 => sum_products(&PerRow::Scalar(Some(4)), &ints(&a[1])?, 1, rows),
            Size::Range => {
                let v: Vec<PerRow> = match a.iter().map(ints).collect::<Result<Vec<_>>>() {
                    Ok(v) => v,
                    // Dates and timestamps with intervals: told after.
                    Err(_) => return Ok(None),
                };
                match v.as_slice() {
                    [stop] => sum_products(stop, &PerRow::Scalar(Some(1)), 8, rows),
                    [start, stop] => sum_spans(start, stop, None, rows),
                    [start, stop, step] => sum_spans(start, stop, Some(step), rows),
                    _ => return Ok(None),
                }
            }
            Size::ArrayRepeat if a.len() >= 2 => {
                let each = match byte_lengths(&a[0]) {
                    Ok(l) => l,
                    Err(_) => PerRow::Scalar(Some(16)),
                };
                sum_products(&each, &ints(&a[1])?, 1, rows).max(sum_products(
                    &PerRow::Scalar(Some(16)),
                    &ints(&a[1])?,
                    1,
                    rows,
                ))
            }
            Size::ArrayResize if a.len() >= 2 => sum_products(&PerRow::Scalar(Some(16)), &ints(&a[1])?, 1, rows),
            _ => return Ok(None),
        };
        Ok(Some(bytes))
    }
}

impl ScalarUDFImpl for Bounded {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        self.inner.return_type(arg_types)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        self.inner.return_field_from_args(args)
    }

    fn is_nullable(&self, args: &[Expr], schema: &dyn datafusion::common::ExprSchema) -> bool {
        #[allow(deprecated)]
        self.inner.is_nullable(args, schema)
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        self.inner.coerce_types(arg_types)
    }

    fn simplify(&self, args: Vec<Expr>, _info: &SimplifyContext) -> Result<ExprSimplifyResult> {
        // The built-ins' own rewrites (concat merging its literals) would put the unbounded
        // function back in this one's place; constant calls are still folded, through
        // `invoke_with_args`.
        Ok(ExprSimplifyResult::Original(args))
    }

    fn is_strict(&self) -> bool {
        self.inner.is_strict()
    }

    fn short_circuits(&self) -> bool {
        self.inner.short_circuits()
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.inner.documentation()
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        if let Some(bytes) = self.before(&args)? {
            if bytes > self.limit as u128 {
                return Err(self.refuse(bytes));
            }
        }
        let out = self.inner.invoke_with_args(args)?;
        let bytes = match &out {
            ColumnarValue::Array(a) => a.get_array_memory_size(),
            ColumnarValue::Scalar(s) => s.size(),
        };
        if bytes > self.limit {
            return Err(self.refuse(bytes as u128));
        }
        Ok(out)
    }
}

/// A per-row integer: one value for every row, or one per row.
enum PerRow {
    Scalar(Option<i64>),
    Array(Int64Array),
}

impl PerRow {
    fn get(&self, i: usize) -> Option<i64> {
        match self {
            PerRow::Scalar(v) => *v,
            PerRow::Array(a) => (!a.is_null(i)).then(|| a.value(i)),
        }
    }

    fn is_scalar(&self) -> bool {
        matches!(self, PerRow::Scalar(_))
    }
}

/// An integer argument as `Int64` (an error for another kind).
fn ints(v: &ColumnarValue) -> Result<PerRow> {
    Ok(match v {
        ColumnarValue::Scalar(s) => match s.cast_to(&DataType::Int64)? {
            ScalarValue::Int64(n) => PerRow::Scalar(n),
            other => return Err(DataFusionError::Internal(format!("not an integer: {other:?}"))),
        },
        ColumnarValue::Array(a) => {
            let a: ArrayRef = arrow::compute::cast(a, &DataType::Int64)?;
            PerRow::Array(a.as_any().downcast_ref::<Int64Array>().cloned().expect("cast to Int64"))
        }
    })
}

/// The bytes of a string (or binary) argument, per row.
fn byte_lengths(v: &ColumnarValue) -> Result<PerRow> {
    Ok(match v {
        ColumnarValue::Scalar(s) => match s {
            ScalarValue::Utf8(x) | ScalarValue::LargeUtf8(x) | ScalarValue::Utf8View(x) => {
                PerRow::Scalar(x.as_ref().map(|s| s.len() as i64))
            }
            ScalarValue::Binary(x) | ScalarValue::LargeBinary(x) | ScalarValue::BinaryView(x) => {
                PerRow::Scalar(x.as_ref().map(|s| s.len() as i64))
            }
            other => return Err(DataFusionError::Internal(format!("not a string: {other:?}"))),
        },
        ColumnarValue::Array(a) => {
            let lens = arrow::compute::kernels::length::length(a)?;
            let lens = arrow::compute::cast(&lens, &DataType::Int64)?;
            PerRow::Array(lens.as_any().downcast_ref::<Int64Array>().cloned().expect("cast to Int64"))
        }
    })
}

/// Σ max(a, 0) × max(b, 0) × `unit` over the rows (one product times the rows when both are
/// scalars).
fn sum_products(a: &PerRow, b: &PerRow, unit: u128, rows: usize) -> u128 {
    let term = |i: usize| -> u128 {
        let x = a.get(i).unwrap_or(0).max(0) as u128;
        let y = b.get(i).unwrap_or(0).max(0) as u128;
        x.saturating_mul(y).saturating_mul(unit)
    };
    if a.is_scalar() && b.is_scalar() {
        term(0).saturating_mul(rows as u128)
    } else {
        (0..rows).map(term).fold(0u128, u128::saturating_add)
    }
}

/// Σ (elements of `start..stop` by `step`) × 8 bytes over the rows.
fn sum_spans(start: &PerRow, stop: &PerRow, step: Option<&PerRow>, rows: usize) -> u128 {
    let term = |i: usize| -> u128 {
        let (Some(a), Some(b)) = (start.get(i), stop.get(i)) else { return 0 };
        let s = step.map_or(Some(1), |s| s.get(i)).unwrap_or(1);
        if s == 0 {
            return 0;
        }
        let span = (b as i128 - a as i128) / s as i128;
        (span.max(0) as u128 + 1).saturating_mul(8)
    };
    let all_scalar = start.is_scalar() && stop.is_scalar() && step.is_none_or(PerRow::is_scalar);
    if all_scalar {
        term(0).saturating_mul(rows as u128)
    } else {
        (0..rows).map(term).fold(0u128, u128::saturating_add)
    }
}

fn human(bytes: u128) -> String {
    const MIB: u128 = 1 << 20;
    if bytes >= 1 << 30 {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else if bytes >= MIB {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{bytes} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn ctx(limit: usize) -> SessionContext {
        let ctx = SessionContext::new();
        register(&ctx, limit);
        ctx
    }

    async fn run(ctx: &SessionContext, sql: &str) -> Result<Vec<arrow::array::RecordBatch>> {
        ctx.sql(sql).await?.collect().await
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn values_past_the_limit_are_refused_before_they_are_built() {
        let ctx = ctx(16 << 20).await;
        let started = std::time::Instant::now();
        for sql in [
            "SELECT length(repeat('x', 2000000000))",
            "SELECT length(lpad('x', 2000000000))",
            "SELECT length(rpad('x', 2000000000, 'ab'))",
            "SELECT cardinality(range(1, 2000000000))",
            "SELECT cardinality(generate_series(0, 4000000000, 2))",
            "SELECT cardinality(array_repeat(1, 2000000000))",
            // Per row: a batch of 8,192 rows of 5,000 bytes is 40 MB.
            "SELECT max(length(repeat('x', 5000 + (value % 2)))) FROM range(0, 100000)",
        ] {
            let e = run(&ctx, sql).await.expect_err(sql);
            assert!(e.to_string().contains("past this server's limit"), "{sql}: {e}");
            assert!(matches!(e.find_root(), DataFusionError::ResourcesExhausted(_)), "{sql}: {e:?}");
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
        // A nest of concatenations stops at the level that passes the limit.
        let e = run(
            &ctx,
            "WITH a AS (SELECT repeat('x', 4000000) AS s), b AS (SELECT concat(s, s, s) AS s FROM a) \
             SELECT length(concat(s, s)) FROM b",
        )
        .await
        .unwrap_err();
        assert!(e.to_string().contains("concat() would build"), "{e}");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn values_within_the_limit_are_the_built_ins() {
        let ctx = ctx(16 << 20).await;
        let plain = SessionContext::new();
        for sql in [
            "SELECT repeat('ab', 3), lpad('7', 3, '0'), rpad('x', 2), concat('a', NULL, 'b'), concat_ws('-', 'a', 'b')",
            "SELECT replace('aXbX', 'X', 'yy'), regexp_replace('a1b2', '[0-9]', '#', 'g'), translate('abc', 'ab', 'xy')",
            "SELECT range(1, 5), generate_series(1, 3), array_repeat('z', 2), array_resize([1, 2], 3, 0)",
            "SELECT repeat(s, n) FROM (VALUES ('a', 2), ('bc', 0), (NULL, 3)) t(s, n)",
        ] {
            let ours = arrow::util::pretty::pretty_format_batches(&run(&ctx, sql).await.unwrap()).unwrap().to_string();
            let theirs =
                arrow::util::pretty::pretty_format_batches(&run(&plain, sql).await.unwrap()).unwrap().to_string();
            assert_eq!(ours, theirs, "{sql}");
        }
    }
}
