//! Typed reads of query results: the rows of a DataFusion query deserialised into any
//! `T: Deserialize` — a struct (columns by name), a tuple (columns by position) or, for a
//! one-column query, a bare value.
//!
//! Values keep their Arrow types: an integer column reads into integer fields, a string
//! column into strings, a list into a `Vec`, a struct or map column into a struct or map. A
//! value that does not fit its field — a string into an `i64`, NULL into a non-`Option`, a
//! negative number into a `u64` — is an error naming the column and the row, never a silent
//! default. Timestamps read as their raw integer (microseconds for the lake's tables) and
//! dates as days since the epoch.
//!
//! Not here: writing rows (the stages build Arrow batches) or planning queries.

use std::fmt;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{
    DataType, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use datafusion::prelude::SessionContext;
use serde::de::{self, DeserializeOwned, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor};

/// Runs `sql` and reads every row into a `T`.
pub async fn rows<T: DeserializeOwned>(ctx: &SessionContext, sql: &str) -> anyhow::Result<Vec<T>> {
    let batches = ctx.sql(sql).await?.collect().await?;
    Ok(from_batches(&batches)?)
}

/// Runs `sql`, which must return exactly one row, and reads it into a `T`.
pub async fn one<T: DeserializeOwned>(ctx: &SessionContext, sql: &str) -> anyhow::Result<T> {
    let mut all: Vec<T> = rows(ctx, sql).await?;
    match all.len() {
        1 => Ok(all.remove(0)),
        n => anyhow::bail!("expected one row, the query returned {n}: {sql}"),
    }
}

/// Reads every row of `batches` into a `T`.
pub fn from_batches<T: DeserializeOwned>(batches: &[RecordBatch]) -> Result<Vec<T>, RowError> {
    let mut out = Vec::with_capacity(batches.iter().map(|b| b.num_rows()).sum());
    let mut offset = 0;
    for b in batches {
        for row in 0..b.num_rows() {
            let value = T::deserialize(RowDe { batch: b, row }).map_err(|e| e.at_row(offset + row))?;
            out.push(value);
        }
        offset += b.num_rows();
    }
    Ok(out)
}

/// A value that does not fit the type it is read into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowError {
    column: Option<String>,
    row: Option<usize>,
    message: String,
}

impl RowError {
    fn in_column(mut self, name: &str) -> Self {
        if self.column.is_none() {
            self.column = Some(name.to_string());
        }
        self
    }

    fn at_row(mut self, row: usize) -> Self {
        self.row.get_or_insert(row);
        self
    }
}

impl fmt::Display for RowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.column, self.row) {
            (Some(c), Some(r)) => write!(f, "column `{c}`, row {r}: {}", self.message),
            (Some(c), None) => write!(f, "column `{c}`: {}", self.message),
            (None, Some(r)) => write!(f, "row {r}: {}", self.message),
            (None, None) => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for RowError {}

impl de::Error for RowError {
    fn custom<M: fmt::Display>(msg: M) -> Self {
        RowError { column: None, row: None, message: msg.to_string() }
    }
}

fn null_error() -> RowError {
    de::Error::custom("is NULL (read it into an Option to allow that)")
}

/// One row of a batch: a map of its columns, or a sequence of them.
struct RowDe<'a> {
    batch: &'a RecordBatch,
    row: usize,
}

impl RowDe<'_> {
    /// The only column, for rows read as a bare value.
    fn single(&self) -> Result<ValueDe, RowError> {
        if self.batch.num_columns() != 1 {
            return Err(de::Error::custom(format!(
                "a bare value needs a one-column query; this one has {} columns (read a struct or a tuple)",
                self.batch.num_columns()
            )));
        }
        Ok(ValueDe { array: self.batch.column(0).clone(), row: self.row })
    }

    fn name(&self, i: usize) -> String {
        self.batch.schema().field(i).name().clone()
    }
}

macro_rules! single_column {
    ($($method:ident),*) => {
        $(fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, RowError> {
            let name = self.name(0);
            self.single()?.$method(visitor).map_err(|e| e.in_column(&name))
        })*
    };
}

impl<'de> de::Deserializer<'de> for RowDe<'_> {
    type Error = RowError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, RowError> {
        self.deserialize_map(visitor)
    }

    single_column!(
        deserialize_bool,
        deserialize_i8,
        deserialize_i16,
        deserialize_i32,
        deserialize_i64,
        deserialize_u8,
        deserialize_u16,
        deserialize_u32,
        deserialize_u64,
        deserialize_f32,
        deserialize_f64,
        deserialize_char,
        deserialize_str,
        deserialize_string,
        deserialize_bytes,
        deserialize_byte_buf,
        deserialize_option,
        deserialize_seq
    );

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, RowError> {
        visitor.visit_map(Columns { batch: self.batch, row: self.row, next: 0 })
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, RowError> {
        self.deserialize_map(visitor)
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, RowError> {
        if len != self.batch.num_columns() {
            return Err(de::Error::custom(format!(
                "the query has {} columns, the tuple read from it {len}",
                self.batch.num_columns()
            )));
        }
        visitor.visit_seq(Columns { batch: self.batch, row: self.row, next: 0 })
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, RowError> {
        self.deserialize_tuple(len, visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, RowError> {
        visitor.visit_newtype_struct(self)
    }

    serde::forward_to_deserialize_any! {
        i128 u128 unit unit_struct enum identifier ignored_any
    }
}

/// The columns of one row, by name (a map) or by position (a sequence).
struct Columns<'a> {
    batch: &'a RecordBatch,
    row: usize,
    next: usize,
}

impl Columns<'_> {
    fn value<'de, S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, RowError> {
        let i = self.next;
        self.next += 1;
        let name = self.batch.schema().field(i).name().clone();
        seed.deserialize(ValueDe { array: self.batch.column(i).clone(), row: self.row }).map_err(|e| e.in_column(&name))
    }
}

impl<'de> MapAccess<'de> for Columns<'_> {
    type Error = RowError;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, RowError> {
        if self.next >= self.batch.num_columns() {
            return Ok(None);
        }
        let schema = self.batch.schema();
        let name: &str = schema.field(self.next).name();
        seed.deserialize(name.into_deserializer()).map(Some)
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, RowError> {
        self.value(seed)
    }
}

impl<'de> SeqAccess<'de> for Columns<'_> {
    type Error = RowError;

    fn next_element_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<Option<S::Value>, RowError> {
        if self.next >= self.batch.num_columns() {
            return Ok(None);
        }
        self.value(seed).map(Some)
    }
}

/// One value: element `row` of `array`.
struct ValueDe {
    array: ArrayRef,
    row: usize,
}

impl ValueDe {
    fn is_null(&self) -> bool {
        self.array.is_null(self.row)
    }

    fn text(&self) -> Option<&str> {
        let (a, r) = (&self.array, self.row);
        match a.data_type() {
            DataType::Utf8 => Some(a.as_string::<i32>().value(r)),
            DataType::LargeUtf8 => Some(a.as_string::<i64>().value(r)),
            DataType::Utf8View => Some(a.as_string_view().value(r)),
            _ => None,
        }
    }

    fn bytes(&self) -> Option<&[u8]> {
        let (a, r) = (&self.array, self.row);
        match a.data_type() {
            DataType::Binary => Some(a.as_binary::<i32>().value(r)),
            DataType::LargeBinary => Some(a.as_binary::<i64>().value(r)),
            DataType::BinaryView => Some(a.as_binary_view().value(r)),
            DataType::FixedSizeBinary(_) => Some(a.as_fixed_size_binary().value(r)),
            _ => None,
        }
    }

    /// The elements of a list value, as an array.
    fn list(&self) -> Option<ArrayRef> {
        let (a, r) = (&self.array, self.row);
        match a.data_type() {
            DataType::List(_) => Some(a.as_list::<i32>().value(r)),
            DataType::LargeList(_) => Some(a.as_list::<i64>().value(r)),
            DataType::FixedSizeList(..) => Some(a.as_fixed_size_list().value(r)),
            DataType::ListView(_) => Some(a.as_list_view::<i32>().value(r)),
            _ => None,
        }
    }
}

macro_rules! null_checked {
    ($($method:ident),*) => {
        $(fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, RowError> {
            if self.is_null() {
                return Err(null_error());
            }
            self.deserialize_any(visitor)
        })*
    };
}

impl<'de> de::Deserializer<'de> for ValueDe {
    type Error = RowError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, RowError> {
        if self.is_null() {
            return visitor.visit_none();
        }
        let (a, r) = (&self.array, self.row);
        match a.data_type() {
            DataType::Boolean => visitor.visit_bool(a.as_boolean().value(r)),
            DataType::Int8 => visitor.visit_i64(a.as_primitive::<Int8Type>().value(r).into()),
            DataType::Int16 => visitor.visit_i64(a.as_primitive::<Int16Type>().value(r).into()),
            DataType::Int32 => visitor.visit_i64(a.as_primitive::<Int32Type>().value(r).into()),
            DataType::Int64 => visitor.visit_i64(a.as_primitive::<Int64Type>().value(r)),
            DataType::UInt8 => visitor.visit_u64(a.as_primitive::<UInt8Type>().value(r).into()),
            DataType::UInt16 => visitor.visit_u64(a.as_primitive::<UInt16Type>().value(r).into()),
            DataType::UInt32 => visitor.visit_u64(a.as_primitive::<UInt32Type>().value(r).into()),
            DataType::UInt64 => visitor.visit_u64(a.as_primitive::<UInt64Type>().value(r)),
            DataType::Float16 => visitor.visit_f64(a.as_primitive::<arrow::datatypes::Float16Type>().value(r).to_f64()),
            DataType::Float32 => visitor.visit_f32(a.as_primitive::<arrow::datatypes::Float32Type>().value(r)),
            DataType::Float64 => visitor.visit_f64(a.as_primitive::<arrow::datatypes::Float64Type>().value(r)),
            DataType::Date32 => visitor.visit_i64(a.as_primitive::<arrow::datatypes::Date32Type>().value(r).into()),
            DataType::Date64 => visitor.visit_i64(a.as_primitive::<arrow::datatypes::Date64Type>().value(r)),
            DataType::Timestamp(..) | DataType::Time64(_) | DataType::Duration(_) => {
                let v = arrow::compute::cast(&a.slice(r, 1), &DataType::Int64).map_err(de::Error::custom)?;
                visitor.visit_i64(v.as_primitive::<Int64Type>().value(0))
            }
            DataType::Decimal128(_, scale) => {
                let v = a.as_primitive::<arrow::datatypes::Decimal128Type>().value(r);
                visitor.visit_f64(v as f64 / 10f64.powi(i32::from(*scale)))
            }
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
                visitor.visit_str(self.text().expect("a string type"))
            }
            DataType::Binary | DataType::LargeBinary | DataType::BinaryView | DataType::FixedSizeBinary(_) => {
                visitor.visit_bytes(self.bytes().expect("a binary type"))
            }
            DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(..) | DataType::ListView(_) => {
                let items = self.list().expect("a list type");
                visitor.visit_seq(Elements { len: items.len(), items, next: 0 })
            }
            DataType::Struct(fields) => {
                let s = a.as_struct();
                let columns: Vec<(String, ArrayRef)> =
                    fields.iter().zip(s.columns()).map(|(f, c)| (f.name().clone(), c.clone())).collect();
                visitor.visit_map(Fields { columns, row: r, next: 0 })
            }
            DataType::Map(..) => {
                let m = a.as_map();
                let (start, end) = (m.value_offsets()[r] as usize, m.value_offsets()[r + 1] as usize);
                visitor.visit_map(Entries {
                    keys: m.keys().clone(),
                    values: m.values().clone(),
                    next: start,
                    end,
                    pending_value: None,
                })
            }
            DataType::Dictionary(_, value_type) => {
                let v = arrow::compute::cast(&a.slice(r, 1), value_type).map_err(de::Error::custom)?;
                ValueDe { array: v, row: 0 }.deserialize_any(visitor)
            }
            DataType::Null => visitor.visit_none(),
            other => Err(de::Error::custom(format!("values of type {other} cannot be read"))),
        }
    }

    null_checked!(
        deserialize_bool,
        deserialize_i8,
        deserialize_i16,
        deserialize_i32,
        deserialize_i64,
        deserialize_u8,
        deserialize_u16,
        deserialize_u32,
        deserialize_u64,
        deserialize_f32,
        deserialize_f64,
        deserialize_char,
        deserialize_str,
        deserialize_string,
        deserialize_map,
        deserialize_unit
    );

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, RowError> {
        if self.is_null() {
            visitor.visit_none()
        } else {
            visitor.visit_some(self)
        }
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, RowError> {
        if self.is_null() {
            return Err(null_error());
        }
        // `Vec<u8>` asks for a sequence: give it a binary value's bytes one by one.
        if let Some(b) = self.bytes() {
            return visitor.visit_seq(de::value::SeqDeserializer::new(b.iter().copied()));
        }
        self.deserialize_any(visitor)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, RowError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, RowError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, RowError> {
        match self.text() {
            Some(s) if !self.is_null() => visitor.visit_enum(s.into_deserializer()),
            _ if self.is_null() => Err(null_error()),
            _ => Err(de::Error::custom(format!("an enum reads from a string, not from {}", self.array.data_type()))),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, RowError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, RowError> {
        self.deserialize_map(visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, RowError> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        i128 u128 unit_struct tuple tuple_struct identifier
    }
}

/// The elements of a list value.
struct Elements {
    items: ArrayRef,
    len: usize,
    next: usize,
}

impl<'de> SeqAccess<'de> for Elements {
    type Error = RowError;

    fn next_element_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<Option<S::Value>, RowError> {
        if self.next >= self.len {
            return Ok(None);
        }
        let row = self.next;
        self.next += 1;
        seed.deserialize(ValueDe { array: self.items.clone(), row }).map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.len - self.next)
    }
}

/// The fields of a struct value.
struct Fields {
    columns: Vec<(String, ArrayRef)>,
    row: usize,
    next: usize,
}

impl<'de> MapAccess<'de> for Fields {
    type Error = RowError;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, RowError> {
        match self.columns.get(self.next) {
            None => Ok(None),
            Some((name, _)) => seed.deserialize(name.as_str().into_deserializer()).map(Some),
        }
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, RowError> {
        let (name, array) = self.columns[self.next].clone();
        self.next += 1;
        seed.deserialize(ValueDe { array, row: self.row }).map_err(|e| e.in_column(&name))
    }
}

/// The entries of a map value.
struct Entries {
    keys: ArrayRef,
    values: ArrayRef,
    next: usize,
    end: usize,
    pending_value: Option<usize>,
}

impl<'de> MapAccess<'de> for Entries {
    type Error = RowError;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, RowError> {
        if self.next >= self.end {
            return Ok(None);
        }
        let i = self.next;
        self.next += 1;
        self.pending_value = Some(i);
        seed.deserialize(ValueDe { array: self.keys.clone(), row: i }).map(Some)
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, RowError> {
        let i = self.pending_value.take().ok_or_else(|| de::Error::custom("a map value without its key"))?;
        seed.deserialize(ValueDe { array: self.values.clone(), row: i })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use arrow::array::{
        BinaryArray, BooleanArray, Int64Array, ListBuilder, MapBuilder, StringArray, StringBuilder, StringViewArray,
        TimestampMicrosecondArray,
    };
    use serde::Deserialize;
    use std::sync::Arc;

    use super::*;

    fn batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
        RecordBatch::try_from_iter(columns).unwrap()
    }

    #[derive(Debug, Deserialize, PartialEq)]
    struct Pr {
        repo_name: String,
        number: i64,
        merged: Option<bool>,
        labels: Vec<String>,
    }

    fn prs() -> RecordBatch {
        let mut labels = ListBuilder::new(StringBuilder::new());
        labels.values().append_value("bug");
        labels.append(true);
        labels.append(true);
        batch(vec![
            ("repo_name", Arc::new(StringViewArray::from(vec!["o/a", "o/b"])) as ArrayRef),
            ("number", Arc::new(Int64Array::from(vec![9, 12]))),
            ("merged", Arc::new(BooleanArray::from(vec![Some(true), None]))),
            ("labels", Arc::new(labels.finish())),
            ("extra", Arc::new(Int64Array::from(vec![0, 0]))),
        ])
    }

    #[test]
    fn structs_by_name_tuples_by_position_values_alone() {
        let b = prs();
        let rows: Vec<Pr> = from_batches(std::slice::from_ref(&b)).unwrap();
        assert_eq!(
            rows,
            vec![
                Pr { repo_name: "o/a".into(), number: 9, merged: Some(true), labels: vec!["bug".into()] },
                Pr { repo_name: "o/b".into(), number: 12, merged: None, labels: vec![] },
            ]
        );
        let pairs: Vec<(String, i64)> = from_batches(&[b.project(&[0, 1]).unwrap()]).unwrap();
        assert_eq!(pairs, vec![("o/a".to_string(), 9), ("o/b".to_string(), 12)]);
        let numbers: Vec<u32> = from_batches(&[b.project(&[1]).unwrap()]).unwrap();
        assert_eq!(numbers, vec![9, 12]);
    }

    #[test]
    fn mismatches_are_errors_that_name_the_column_and_row() {
        let b = prs();
        // A string column read as a number.
        let e = from_batches::<(i64, i64)>(&[b.project(&[0, 1]).unwrap()]).unwrap_err().to_string();
        assert!(e.starts_with("column `repo_name`, row 0:") && e.contains("expected i64"), "{e}");
        // NULL into a non-Option.
        let e = from_batches::<bool>(&[b.project(&[2]).unwrap()]).unwrap_err().to_string();
        assert!(e.contains("column `merged`, row 1: is NULL"), "{e}");
        // A number that does not fit.
        let neg = batch(vec![("n", Arc::new(Int64Array::from(vec![-1])) as ArrayRef)]);
        let e = from_batches::<u64>(&[neg]).unwrap_err().to_string();
        assert!(e.contains("column `n`, row 0") && e.contains("-1"), "{e}");
        // A tuple of the wrong width.
        let e = from_batches::<(String,)>(&[b]).unwrap_err().to_string();
        assert!(e.contains("5 columns, the tuple read from it 1"), "{e}");
    }

    #[test]
    fn maps_binaries_and_timestamps() {
        let mut m = MapBuilder::new(None, StringBuilder::new(), StringBuilder::new());
        m.keys().append_value("a.py");
        m.values().append_value("x = 1\n");
        m.append(true).unwrap();
        let b = batch(vec![
            ("context", Arc::new(m.finish()) as ArrayRef),
            ("raw", Arc::new(BinaryArray::from(vec![&b"\xff\x00"[..]]))),
            ("at", Arc::new(TimestampMicrosecondArray::from(vec![1_700_000_000_000_000]).with_timezone("UTC"))),
            ("name", Arc::new(StringArray::from(vec!["ok"]))),
        ]);
        #[derive(Deserialize)]
        struct Row {
            context: BTreeMap<String, String>,
            raw: Vec<u8>,
            at: i64,
            name: Status,
        }
        #[derive(Deserialize, Debug, PartialEq)]
        #[serde(rename_all = "lowercase")]
        enum Status {
            Ok,
        }
        let r: Vec<Row> = from_batches(&[b]).unwrap();
        assert_eq!(r[0].context["a.py"], "x = 1\n");
        assert_eq!(r[0].raw, vec![0xff, 0]);
        assert_eq!(r[0].at, 1_700_000_000_000_000);
        assert_eq!(r[0].name, Status::Ok);
    }
}
