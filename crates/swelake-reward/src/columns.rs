//! Reading path → content maps out of Arrow columns, as the reward needs them: a
//! `MAP<VARCHAR, VARCHAR>` column (the `rl_seed` table), a list of `{path, content}` structs
//! (the seed shards, which Hugging Face `datasets` reads), or a string column holding a JSON
//! object.

use std::collections::BTreeMap;

use arrow::array::{Array, ArrayRef, AsArray, GenericListArray, MapArray};
use arrow::compute::cast;
use arrow::datatypes::DataType;
use arrow::error::ArrowError;

/// A path → content map column, decoded row by row.
pub enum MapColumn {
    Json(ArrayRef),
    Map(Box<(MapArray, ArrayRef, ArrayRef)>),
    /// A list of `{path, content}` structs: the list, its paths and its contents.
    Pairs(Box<(GenericListArray<i32>, ArrayRef, ArrayRef)>),
}

impl MapColumn {
    /// Accepts Utf8/LargeUtf8/Utf8View (JSON objects) or a map with string keys and values.
    pub fn new(arr: &ArrayRef) -> Result<Self, ArrowError> {
        match arr.data_type() {
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
                Ok(MapColumn::Json(cast(arr, &DataType::Utf8)?))
            }
            DataType::Map(_, _) => {
                let m = arr.as_map().clone();
                let keys = cast(m.keys(), &DataType::Utf8)?;
                let values = cast(m.values(), &DataType::Utf8)?;
                Ok(MapColumn::Map(Box::new((m, keys, values))))
            }
            DataType::List(item) if matches!(item.data_type(), DataType::Struct(_)) => {
                let list = arr.as_list::<i32>().clone();
                let items = list.values().as_struct();
                let field = |name: &str| {
                    items.column_by_name(name).ok_or_else(|| {
                        ArrowError::InvalidArgumentError(format!(
                            "expected a list of {{path, content}} structs, got {}",
                            arr.data_type()
                        ))
                    })
                };
                let paths = cast(field("path")?, &DataType::Utf8)?;
                let contents = cast(field("content")?, &DataType::Utf8)?;
                Ok(MapColumn::Pairs(Box::new((list, paths, contents))))
            }
            other => Err(ArrowError::InvalidArgumentError(format!(
                "expected MAP<VARCHAR,VARCHAR>, a list of {{path, content}} structs or a JSON object string, got {other}"
            ))),
        }
    }

    /// The map of `row`; `None` for NULL, malformed JSON, or NULL values inside the map.
    pub fn get(&self, row: usize) -> Option<BTreeMap<String, String>> {
        match self {
            MapColumn::Json(a) => {
                let a = a.as_string::<i32>();
                if a.is_null(row) {
                    return None;
                }
                serde_json::from_str(a.value(row)).ok()
            }
            MapColumn::Map(parts) => {
                let (m, keys, values) = &**parts;
                if m.is_null(row) {
                    return None;
                }
                let offsets = m.value_offsets();
                pairs(keys, values, offsets[row] as usize, offsets[row + 1] as usize)
            }
            MapColumn::Pairs(parts) => {
                let (list, paths, contents) = &**parts;
                if list.is_null(row) {
                    return None;
                }
                let offsets = list.value_offsets();
                pairs(paths, contents, offsets[row] as usize, offsets[row + 1] as usize)
            }
        }
    }
}

/// Entries `start..end` of two string columns as a map; `None` if a key or value is NULL.
fn pairs(keys: &ArrayRef, values: &ArrayRef, start: usize, end: usize) -> Option<BTreeMap<String, String>> {
    let (keys, values) = (keys.as_string::<i32>(), values.as_string::<i32>());
    (start..end)
        .map(|i| {
            (!keys.is_null(i) && !values.is_null(i)).then(|| (keys.value(i).to_string(), values.value(i).to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{ListBuilder, StringBuilder, StructBuilder};
    use arrow::datatypes::{Field, Fields};
    use std::sync::Arc;

    #[test]
    fn a_list_of_path_content_structs_reads_as_a_map() {
        let fields =
            Fields::from(vec![Field::new("path", DataType::Utf8, false), Field::new("content", DataType::Utf8, false)]);
        let mut b = ListBuilder::new(StructBuilder::from_fields(fields, 0));
        for row in [vec![("a.py", "x"), ("b.py", "")], vec![]] {
            for (p, c) in row {
                b.values().field_builder::<StringBuilder>(0).unwrap().append_value(p);
                b.values().field_builder::<StringBuilder>(1).unwrap().append_value(c);
                b.values().append(true);
            }
            b.append(true);
        }
        b.append(false);
        let arr: ArrayRef = Arc::new(b.finish());
        let col = MapColumn::new(&arr).unwrap();
        let first = col.get(0).unwrap();
        assert_eq!(first.get("a.py").map(String::as_str), Some("x"));
        assert_eq!(first.get("b.py").map(String::as_str), Some(""));
        assert!(col.get(1).unwrap().is_empty());
        assert_eq!(col.get(2), None);
    }
}
