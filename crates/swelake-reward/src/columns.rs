//! Reading path → content maps out of Arrow columns, as the reward needs them: either a
//! `MAP<VARCHAR, VARCHAR>` column or a string column holding a JSON object.

use std::collections::BTreeMap;

use arrow::array::{Array, ArrayRef, AsArray, MapArray};
use arrow::compute::cast;
use arrow::datatypes::DataType;
use arrow::error::ArrowError;

/// A path → content map column, decoded row by row.
pub enum MapColumn {
    Json(ArrayRef),
    Map(Box<(MapArray, ArrayRef, ArrayRef)>),
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
            other => Err(ArrowError::InvalidArgumentError(format!(
                "expected MAP<VARCHAR,VARCHAR> or a JSON object string, got {other}"
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
                let (keys, values) = (keys.as_string::<i32>(), values.as_string::<i32>());
                let offsets = m.value_offsets();
                let (start, end) = (offsets[row] as usize, offsets[row + 1] as usize);
                (start..end)
                    .map(|i| (!values.is_null(i)).then(|| (keys.value(i).to_string(), values.value(i).to_string())))
                    .collect()
            }
        }
    }
}
