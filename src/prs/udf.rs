//! `resolving_refs(text, repo_name [, own_number])` → `LIST<STRUCT<repo, number, keyword>>`:
//! the issues a PR text says it resolves (see [`super::links`] for the forms recognised).
//! `repo_name` resolves bare `#N` references; `own_number`, when given, drops references to
//! the PR itself. NULL text gives an empty list.

use std::sync::{Arc, LazyLock};

use arrow::array::{Array, ArrayRef, AsArray, Int64Builder, ListBuilder, StringBuilder, StructBuilder};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, Fields};
use datafusion::common::types::{logical_int32, logical_int64, logical_string, NativeType};
use datafusion::common::Result;
use datafusion::logical_expr::{
    Coercion, ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, TypeSignature,
    TypeSignatureClass, Volatility,
};

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

/// `(text VARCHAR, repo_name VARCHAR)` or `(…, own_number BIGINT)`: a call of another shape
/// is a planning error that names the function and these signatures.
pub fn resolving_refs_udf() -> ScalarUDF {
    let string = Coercion::new_exact(TypeSignatureClass::Native(logical_string()));
    let number = Coercion::new_implicit(
        TypeSignatureClass::Native(logical_int64()),
        vec![TypeSignatureClass::Native(logical_int32()), TypeSignatureClass::Integer],
        NativeType::Int64,
    );
    let signature = Signature::one_of(
        vec![
            TypeSignature::Coercible(vec![string.clone(), string.clone()]),
            TypeSignature::Coercible(vec![string.clone(), string, number]),
        ],
        Volatility::Immutable,
    );
    ScalarUDF::new_from_impl(ResolvingRefs { signature })
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
        // The signature admits any string type; the links are found in plain strings.
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

#[cfg(test)]
mod tests {
    use datafusion::prelude::SessionContext;

    async fn plan(sql: &str) -> Result<(), String> {
        let ctx = SessionContext::new();
        ctx.register_udf(super::resolving_refs_udf());
        ctx.sql(sql).await.map(|_| ()).map_err(|e| e.to_string())
    }

    #[tokio::test]
    async fn a_wrong_call_is_a_planning_error_naming_the_function_and_its_arguments() {
        for bad in ["SELECT resolving_refs(1)", "SELECT resolving_refs('t')", "SELECT resolving_refs(1, 'o/r')"] {
            let e = plan(bad).await.unwrap_err();
            assert!(e.contains("resolving_refs") && e.contains("String"), "{bad}: {e}");
        }
        plan("SELECT resolving_refs('Fixes #1', 'o/r')").await.unwrap();
        plan("SELECT resolving_refs('Fixes #1', 'o/r', 7)").await.unwrap();
        plan("SELECT resolving_refs(arrow_cast('Fixes #1', 'Utf8View'), NULL, CAST(7 AS INT))").await.unwrap();
    }
}
