//! `resolving_refs(text, repo_name [, own_number])` → `LIST<STRUCT<repo, number, keyword>>`:
//! the issues a PR text says it resolves (see [`super::links`] for the forms recognised).
//! `repo_name` resolves bare `#N` references; `own_number`, when given, drops references to
//! the PR itself. NULL text gives an empty list.

use std::sync::{Arc, LazyLock};

use arrow::array::{Array, ArrayRef, AsArray, Int64Builder, ListBuilder, StringBuilder, StructBuilder};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, Fields};
use datafusion::common::{exec_err, Result};
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility};

use super::links::resolving_refs;

static ITEM_FIELDS: LazyLock<Fields> = LazyLock::new(|| {
    Fields::from(vec![
        Field::new("repo", DataType::Utf8, false),
        Field::new("number", DataType::Int64, false),
        Field::new("keyword", DataType::Utf8, false),
    ])
});

fn return_type() -> DataType {
    DataType::List(Arc::new(Field::new("item", DataType::Struct(ITEM_FIELDS.clone()), true)))
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct ResolvingRefs {
    signature: Signature,
}

pub fn resolving_refs_udf() -> ScalarUDF {
    ScalarUDF::new_from_impl(ResolvingRefs { signature: Signature::variadic_any(Volatility::Immutable) })
}

impl ScalarUDFImpl for ResolvingRefs {
    fn name(&self) -> &str {
        "resolving_refs"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(return_type())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        if !(2..=3).contains(&arrays.len()) {
            return exec_err!("resolving_refs takes (text, repo_name [, own_number])");
        }
        let text = cast(&arrays[0], &DataType::Utf8)?;
        let repo = cast(&arrays[1], &DataType::Utf8)?;
        let own: Option<ArrayRef> = match arrays.get(2) {
            Some(a) => Some(cast(a, &DataType::Int64)?),
            None => None,
        };
        let (text, repo) = (text.as_string::<i32>(), repo.as_string::<i32>());
        let own = own.as_ref().map(|a| a.as_primitive::<arrow::datatypes::Int64Type>());
        let values = StructBuilder::new(
            ITEM_FIELDS.clone(),
            vec![Box::new(StringBuilder::new()), Box::new(Int64Builder::new()), Box::new(StringBuilder::new())],
        );
        let mut list = ListBuilder::with_capacity(values, n).with_field(Arc::new(Field::new(
            "item",
            DataType::Struct(ITEM_FIELDS.clone()),
            true,
        )));
        for row in 0..n {
            if !text.is_null(row) && !repo.is_null(row) {
                let own_number = own.and_then(|o| (!o.is_null(row)).then(|| o.value(row)));
                for r in resolving_refs(text.value(row), repo.value(row), own_number) {
                    let item = list.values();
                    item.field_builder::<StringBuilder>(0).expect("repo").append_value(&r.repo);
                    item.field_builder::<Int64Builder>(1).expect("number").append_value(r.number);
                    item.field_builder::<StringBuilder>(2).expect("keyword").append_value(&r.keyword);
                    item.append(true);
                }
            }
            list.append(true);
        }
        Ok(ColumnarValue::Array(Arc::new(list.finish())))
    }
}
