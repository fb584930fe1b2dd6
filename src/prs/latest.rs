//! `latest_by(value, at, tiebreak)`: the `value` of the row with the greatest `(at, tiebreak)`
//! among the rows an aggregate's `FILTER` keeps (NULL when it keeps none); `at` is a
//! timestamp or integer, `tiebreak` any ordered type; rows with a NULL key are skipped.
//!
//! It says what `first_value(value ORDER BY at DESC, tiebreak DESC) FILTER (…)` says, but
//! DataFusion 55 runs that form either behind a per-group `row_number()` window over input
//! sorted by group (most of `pull_requests`' time: one window partition per PR) or, without
//! the window, as a row-at-a-time accumulator. This one is a hash-aggregation accumulator:
//! one integer comparison per row, the tiebreak compared only on equal `at`, and the values
//! copied with one `take` per batch instead of one per row. (DuckDB: `first(value ORDER BY at
//! DESC, tiebreak DESC)`, as `bench/duckdb_pr_jobs.py` ports it; Spark: `max_by(value,
//! struct(at, tiebreak))`.)

use std::cmp::Ordering;
use std::sync::Arc;

use arrow::array::{new_null_array, Array, ArrayRef, AsArray, BooleanArray, Int64Array, UInt32Array};
use arrow::compute::{cast, interleave, take};
use arrow::datatypes::{DataType, Field, FieldRef, Int64Type};
use datafusion::common::{exec_err, Result, ScalarValue};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, EmitTo, GroupsAccumulator, Signature, Volatility,
};

pub const NAME: &str = "latest_by";

#[derive(Debug, PartialEq, Eq, Hash)]
struct LatestBy {
    signature: Signature,
}

pub fn latest_by_udaf() -> AggregateUDF {
    AggregateUDF::from(LatestBy { signature: Signature::any(3, Volatility::Immutable) })
}

/// `at` as plain integers (timestamps and dates by their epoch counts).
fn at_values(a: &ArrayRef) -> Result<Int64Array> {
    let a = match a.data_type() {
        DataType::Int64 => a.clone(),
        DataType::Timestamp(_, _)
        | DataType::Date32
        | DataType::Date64
        | DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32 => {
            // A timestamp cast keeps the time zone; Int64 from it is the raw count.
            let a = match a.data_type() {
                DataType::Timestamp(u, _) => cast(a, &DataType::Timestamp(*u, None))?,
                _ => a.clone(),
            };
            cast(&a, &DataType::Int64)?
        }
        other => return exec_err!("{NAME}: the second argument must be a timestamp or an integer, not {other}"),
    };
    Ok(a.as_primitive::<Int64Type>().clone())
}

/// The type of the third argument (the signature guarantees three).
fn tiebreak_type(args: &AccumulatorArgs) -> DataType {
    args.expr_fields.get(2).map_or(DataType::Utf8, |f| f.data_type().clone())
}

fn tiebreak_cmp(a: &dyn Array, i: usize, b: &dyn Array, j: usize) -> Result<Ordering> {
    let (x, y) = (ScalarValue::try_from_array(a, i)?, ScalarValue::try_from_array(b, j)?);
    x.partial_cmp(&y).map_or_else(|| exec_err!("{NAME}: cannot compare {x:?} with {y:?}"), Ok)
}

impl AggregateUDFImpl for LatestBy {
    fn name(&self) -> &str {
        NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        match arg_types.first() {
            Some(t) => Ok(t.clone()),
            None => exec_err!("{NAME} takes (value, at, tiebreak)"),
        }
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        Ok(Box::new(LatestRow {
            value_type: args.return_type().clone(),
            tiebreak_type: tiebreak_type(&args),
            best: None,
        }))
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        let tiebreak = args.input_fields.get(2).map_or(DataType::Utf8, |f| f.data_type().clone());
        Ok(vec![
            Arc::new(Field::new(format!("{}[value]", args.name), args.return_type().clone(), true)),
            Arc::new(Field::new(format!("{}[at]", args.name), DataType::Int64, true)),
            Arc::new(Field::new(format!("{}[tiebreak]", args.name), tiebreak, true)),
        ])
    }

    fn groups_accumulator_supported(&self, _args: AccumulatorArgs) -> bool {
        true
    }

    fn create_groups_accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn GroupsAccumulator>> {
        Ok(Box::new(LatestGroups::new(args.return_type().clone(), tiebreak_type(&args))))
    }
}

/// One group's accumulator (no GROUP BY, or where DataFusion asks for a row accumulator).
#[derive(Debug)]
struct LatestRow {
    value_type: DataType,
    tiebreak_type: DataType,
    best: Option<(i64, ScalarValue, ScalarValue)>,
}

impl LatestRow {
    fn offer(&mut self, value: &ArrayRef, at: &Int64Array, tiebreak: &ArrayRef) -> Result<()> {
        for i in 0..at.len() {
            if at.is_null(i) || tiebreak.is_null(i) {
                continue;
            }
            let t = at.value(i);
            let better = match &self.best {
                None => true,
                Some((bt, btb, _)) => match t.cmp(bt) {
                    Ordering::Greater => true,
                    Ordering::Less => false,
                    Ordering::Equal => {
                        let tb = ScalarValue::try_from_array(tiebreak, i)?;
                        tb.partial_cmp(btb) == Some(Ordering::Greater)
                    }
                },
            };
            if better {
                self.best =
                    Some((t, ScalarValue::try_from_array(tiebreak, i)?, ScalarValue::try_from_array(value, i)?));
            }
        }
        Ok(())
    }
}

impl Accumulator for LatestRow {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let at = at_values(&values[1])?;
        self.offer(&values[0], &at, &values[2])
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let at = at_values(&states[1])?;
        self.offer(&states[0], &at, &states[2])
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        Ok(match &self.best {
            Some((t, tb, v)) => vec![v.clone(), ScalarValue::Int64(Some(*t)), tb.clone()],
            None => vec![
                ScalarValue::try_from(&self.value_type)?,
                ScalarValue::Int64(None),
                ScalarValue::try_from(&self.tiebreak_type)?,
            ],
        })
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        match &self.best {
            Some((_, _, v)) => Ok(v.clone()),
            None => ScalarValue::try_from(&self.value_type),
        }
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self) + self.best.as_ref().map_or(0, |(_, tb, v)| tb.size() + v.size())
    }
}

/// No row yet.
const NONE: u32 = u32::MAX;

/// Superseded rows kept beyond twice the groups before compacting (small in tests, so that
/// they compact).
const SLACK: usize = if cfg!(test) { 64 } else { 65_536 };

/// Every group's best row so far, by reference: `at` per group, and (chunk, row) into the
/// value and tiebreak arrays that earlier batches' winners were taken into.
#[derive(Debug)]
struct LatestGroups {
    value_type: DataType,
    tiebreak_type: DataType,
    at: Vec<i64>,
    slot: Vec<(u32, u32)>,
    chunks: Vec<(ArrayRef, ArrayRef)>,
    /// Rows held in `chunks` (live or superseded): compacted when far above the groups.
    held: usize,
    /// Within one batch: the group's best row + 1 (0: none in this batch).
    in_batch: Vec<u32>,
    touched: Vec<usize>,
}

impl LatestGroups {
    fn new(value_type: DataType, tiebreak_type: DataType) -> LatestGroups {
        LatestGroups {
            value_type,
            tiebreak_type,
            at: Vec::new(),
            slot: Vec::new(),
            chunks: Vec::new(),
            held: 0,
            in_batch: Vec::new(),
            touched: Vec::new(),
        }
    }

    fn offer(
        &mut self,
        value: &ArrayRef,
        at: &Int64Array,
        tiebreak: &ArrayRef,
        groups: &[usize],
        filter: Option<&BooleanArray>,
        total: usize,
    ) -> Result<()> {
        self.at.resize(total, i64::MIN);
        self.slot.resize(total, (NONE, 0));
        self.in_batch.resize(total, 0);
        for (i, &g) in groups.iter().enumerate() {
            if filter.is_some_and(|f| !f.is_valid(i) || !f.value(i)) || at.is_null(i) || tiebreak.is_null(i) {
                continue;
            }
            let t = at.value(i);
            let better = match self.in_batch[g] {
                0 => {
                    let (c, r) = self.slot[g];
                    c == NONE
                        || match t.cmp(&self.at[g]) {
                            Ordering::Greater => true,
                            Ordering::Less => false,
                            Ordering::Equal => {
                                tiebreak_cmp(tiebreak, i, &self.chunks[c as usize].1, r as usize)? == Ordering::Greater
                            }
                        }
                }
                b => {
                    let r = (b - 1) as usize;
                    match t.cmp(&at.value(r)) {
                        Ordering::Greater => true,
                        Ordering::Less => false,
                        Ordering::Equal => tiebreak_cmp(tiebreak, i, tiebreak, r)? == Ordering::Greater,
                    }
                }
            };
            if better {
                if self.in_batch[g] == 0 {
                    self.touched.push(g);
                }
                self.in_batch[g] = i as u32 + 1;
            }
        }
        if self.touched.is_empty() {
            return Ok(());
        }
        let rows = UInt32Array::from_iter_values(self.touched.iter().map(|&g| self.in_batch[g] - 1));
        let chunk = self.chunks.len() as u32;
        self.chunks.push((take(value, &rows, None)?, take(tiebreak, &rows, None)?));
        self.held += rows.len();
        for (k, &g) in self.touched.iter().enumerate() {
            self.at[g] = at.value(rows.value(k) as usize);
            self.slot[g] = (chunk, k as u32);
            self.in_batch[g] = 0;
        }
        self.touched.clear();
        if self.held > 2 * self.slot.len() + SLACK {
            self.compact()?;
        }
        Ok(())
    }

    /// The winners' values and tiebreaks for `slots`, NULL where a group has none.
    fn gather(&self, slots: &[(u32, u32)]) -> Result<(ArrayRef, ArrayRef)> {
        let nulls = (new_null_array(&self.value_type, 1), new_null_array(&self.tiebreak_type, 1));
        let none = self.chunks.len();
        let idx: Vec<(usize, usize)> =
            slots.iter().map(|&(c, r)| if c == NONE { (none, 0) } else { (c as usize, r as usize) }).collect();
        let values: Vec<&dyn Array> = self.chunks.iter().map(|(v, _)| v.as_ref()).chain([nulls.0.as_ref()]).collect();
        let tiebreaks: Vec<&dyn Array> =
            self.chunks.iter().map(|(_, t)| t.as_ref()).chain([nulls.1.as_ref()]).collect();
        Ok((interleave(&values, &idx)?, interleave(&tiebreaks, &idx)?))
    }

    /// Superseded rows are dropped: the live ones move into one chunk. String views would
    /// still point into every input batch they came from: `gc` copies out the live strings.
    fn compact(&mut self) -> Result<()> {
        let (v, t) = self.gather(&self.slot)?;
        let gc = |a: ArrayRef| -> ArrayRef {
            match a.data_type() {
                DataType::Utf8View => Arc::new(a.as_string_view().gc()),
                DataType::BinaryView => Arc::new(a.as_binary_view().gc()),
                _ => a,
            }
        };
        let (v, t) = (gc(v), gc(t));
        for (g, s) in self.slot.iter_mut().enumerate() {
            if s.0 != NONE {
                *s = (0, g as u32);
            }
        }
        self.held = v.len();
        self.chunks = vec![(v, t)];
        Ok(())
    }

    /// Takes the emitted groups out (the rest shift down): their values, tiebreaks and `at`s.
    fn emit(&mut self, emit_to: EmitTo) -> Result<(ArrayRef, ArrayRef, Vec<Option<i64>>)> {
        let slots = emit_to.take_needed(&mut self.slot);
        let at = emit_to.take_needed(&mut self.at);
        let _ = emit_to.take_needed(&mut self.in_batch);
        let (v, t) = self.gather(&slots)?;
        if self.slot.is_empty() {
            self.chunks.clear();
            self.held = 0;
        }
        Ok((v, t, slots.iter().zip(at).map(|(s, a)| (s.0 != NONE).then_some(a)).collect()))
    }
}

impl GroupsAccumulator for LatestGroups {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        let at = at_values(&values[1])?;
        self.offer(&values[0], &at, &values[2], group_indices, opt_filter, total_num_groups)
    }

    fn merge_batch(&mut self, values: &[ArrayRef], group_indices: &[usize], total_num_groups: usize) -> Result<()> {
        let at = at_values(&values[1])?;
        self.offer(&values[0], &at, &values[2], group_indices, None, total_num_groups)
    }

    /// Each row as a one-row state (DataFusion skips partial aggregation when it groups
    /// little): a filtered-out row gets a NULL `at`, which `offer` skips.
    fn convert_to_state(&self, values: &[ArrayRef], opt_filter: Option<&BooleanArray>) -> Result<Vec<ArrayRef>> {
        let at = at_values(&values[1])?;
        let at: Int64Array = match opt_filter {
            None => at,
            Some(f) => {
                (0..at.len()).map(|i| (f.is_valid(i) && f.value(i) && at.is_valid(i)).then(|| at.value(i))).collect()
            }
        };
        Ok(vec![values[0].clone(), Arc::new(at), values[2].clone()])
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        Ok(self.emit(emit_to)?.0)
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        let (v, t, at) = self.emit(emit_to)?;
        Ok(vec![v, Arc::new(Int64Array::from(at)), t])
    }

    fn size(&self) -> usize {
        let arrays: usize =
            self.chunks.iter().map(|(v, t)| v.get_array_memory_size() + t.get_array_memory_size()).sum();
        arrays
            + self.at.capacity() * 8
            + self.slot.capacity() * 8
            + self.in_batch.capacity() * 4
            + self.touched.capacity() * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Builder, StringArray, TimestampMicrosecondArray};
    use arrow::datatypes::{Schema, TimeUnit};
    use arrow::record_batch::RecordBatch;
    use datafusion::datasource::MemTable;
    use datafusion::prelude::{SessionConfig, SessionContext};

    /// Rows with many equal times (so the tiebreak decides), NULL values and a filter, over
    /// several partitions and small batches (so groups span batches and partial states merge).
    fn table(rows: usize, groups: u64) -> MemTable {
        let schema = Arc::new(Schema::new(vec![
            Field::new("g", DataType::Int64, false),
            Field::new("ts", DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), false),
            Field::new("id", DataType::Utf8, false),
            Field::new("v", DataType::Utf8, true),
            Field::new("n", DataType::Int64, true),
        ]));
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut parts: Vec<Vec<RecordBatch>> = vec![Vec::new(), Vec::new(), Vec::new()];
        for start in (0..rows).step_by(97) {
            let n = 97.min(rows - start);
            let (mut g, mut ts, mut id, mut v, mut num) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Int64Builder::new());
            for _ in 0..n {
                let r = next();
                g.push((r % groups) as i64);
                ts.push(((r >> 8) % 5) as i64);
                // Ids of different lengths: string order is not numeric order.
                id.push(format!("{}", (r >> 16) % 1000));
                v.push(((r >> 32) % 4 != 0).then(|| format!("v{}", (r >> 40) % 100_000)));
                if (r >> 50) % 3 == 0 {
                    num.append_null();
                } else {
                    num.append_value(((r >> 20) % 1000) as i64);
                }
            }
            let batch = RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int64Array::from(g)),
                    Arc::new(TimestampMicrosecondArray::from(ts).with_timezone("UTC")),
                    Arc::new(StringArray::from(id)),
                    Arc::new(StringArray::from(v)),
                    Arc::new(num.finish()),
                ],
            )
            .unwrap();
            parts[start % 3].push(batch);
        }
        MemTable::try_new(schema, parts).unwrap()
    }

    async fn rows(ctx: &SessionContext, sql: &str) -> Vec<String> {
        let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
        let text = arrow::util::pretty::pretty_format_batches(&batches).unwrap().to_string();
        text.lines().skip(3).map(str::to_string).collect()
    }

    /// DataFusion's own `first_value(… ORDER BY ts DESC, id DESC)` is the oracle.
    async fn check(rows_n: usize, groups: u64) {
        let ctx = SessionContext::new_with_config(SessionConfig::new().with_batch_size(64).with_target_partitions(3));
        ctx.register_table("t", Arc::new(table(rows_n, groups))).unwrap();
        ctx.register_udaf(latest_by_udaf());
        let ours = "latest_by(v, ts, id) FILTER (WHERE v IS NOT NULL) AS a, latest_by(n, ts, id) AS b, \
                    latest_by(id, ts, id) FILTER (WHERE n > 500) AS c";
        let theirs = "first_value(v ORDER BY ts DESC, id DESC) FILTER (WHERE v IS NOT NULL) AS a, \
                      first_value(n ORDER BY ts DESC, id DESC) AS b, \
                      first_value(id ORDER BY ts DESC, id DESC) FILTER (WHERE n > 500) AS c";
        let grouped = |f: &str| format!("SELECT g, {f} FROM t GROUP BY g ORDER BY g");
        let got = rows(&ctx, &grouped(ours)).await;
        assert_eq!(got.len() as u64, groups.min(rows_n as u64) + 1);
        assert_eq!(got, rows(&ctx, &grouped(theirs)).await);
        // No GROUP BY: the row accumulator.
        let whole = |f: &str| format!("SELECT {f} FROM t");
        assert_eq!(rows(&ctx, &whole(ours)).await, rows(&ctx, &whole(theirs)).await);
        // A filter that keeps nothing: NULL, as first_value gives.
        let none = |f: &str| format!("SELECT g, {f} FILTER (WHERE g < 0) AS a FROM t GROUP BY g ORDER BY g");
        assert_eq!(
            rows(&ctx, &none("latest_by(v, ts, id)")).await,
            rows(&ctx, &none("first_value(v ORDER BY ts DESC, id DESC)")).await
        );
    }

    #[tokio::test]
    async fn latest_by_equals_first_value_ordered_descending() {
        // Many groups, and few groups with many rows each (superseded rows get compacted).
        check(20_000, 700).await;
        check(20_000, 3).await;
    }

    #[test]
    fn compacting_string_views_keeps_the_newest_values() {
        let mut acc = LatestGroups::new(DataType::Utf8View, DataType::Utf8View);
        let ids: ArrayRef = Arc::new(arrow::array::StringViewArray::from(vec!["a"; 2]));
        for round in 0..100i64 {
            let long = format!("a value longer than twelve bytes, round {round}");
            let values: ArrayRef = Arc::new(arrow::array::StringViewArray::from(vec![long.as_str(), "short"]));
            acc.offer(&values, &Int64Array::from(vec![round; 2]), &ids, &[0, 1], None, 2).unwrap();
        }
        assert!(acc.chunks.len() < 100);
        let out = acc.evaluate(EmitTo::All).unwrap();
        let out: Vec<_> = out.as_string_view().iter().map(|v| v.map(str::to_string)).collect();
        assert_eq!(
            out,
            vec![Some("a value longer than twelve bytes, round 99".to_string()), Some("short".to_string())]
        );
    }

    #[test]
    fn compacts_superseded_rows_and_emits_the_first_groups() {
        let mut acc = LatestGroups::new(DataType::Utf8, DataType::Utf8);
        let ids: ArrayRef = Arc::new(StringArray::from(vec!["a"; 4]));
        for round in 0..100i64 {
            let values: ArrayRef = Arc::new(StringArray::from(vec![format!("r{round}"); 4]));
            let at = Int64Array::from(vec![round; 4]);
            acc.offer(&values, &at, &ids, &[0, 1, 2, 0], None, 3).unwrap();
        }
        assert!(acc.chunks.len() < 100, "{} chunks after 100 batches", acc.chunks.len());
        let first = acc.evaluate(EmitTo::First(2)).unwrap();
        assert_eq!(first.as_string::<i32>().iter().collect::<Vec<_>>(), vec![Some("r99"), Some("r99")]);
        // An older row does not replace the newest; the remaining group shifted to index 0.
        let old: ArrayRef = Arc::new(StringArray::from(vec!["old"]));
        let z: ArrayRef = Arc::new(StringArray::from(vec!["z"]));
        acc.offer(&old, &Int64Array::from(vec![5]), &z, &[0], None, 1).unwrap();
        let rest = acc.evaluate(EmitTo::All).unwrap();
        assert_eq!(rest.as_string::<i32>().iter().collect::<Vec<_>>(), vec![Some("r99")]);
    }
}
