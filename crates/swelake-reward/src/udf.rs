//! `swerl_reward(context, oracle, output)` and `swerl_format_error(context, oracle, output)`:
//! the search/replace reward as DataFusion scalar functions, so a rollout table can be
//! scored in SQL.
//!
//! `context` and `oracle` are path → content maps, given either as `MAP<VARCHAR, VARCHAR>`
//! columns or as JSON object strings (`'{"a.py": "…"}'`); `output` is the model's answer.
//! `swerl_reward` returns a DOUBLE: −1 for a malformed answer, else the mean similarity;
//! NULL when an argument is NULL, a map argument is not a JSON object of strings, or the case
//! is one the reference cannot score (neither side changes anything). `swerl_format_error`
//! returns the reason for a −1 (NULL otherwise).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Float64Builder, StringBuilder};
use arrow::compute::cast;
use arrow::datatypes::DataType;
use datafusion::common::{exec_datafusion_err, exec_err, plan_err, Result};
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility};

use super::columns::MapColumn;
use super::{search_replace_reward, Reward};

/// Which of the two functions an instance computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Output {
    Reward,
    FormatError,
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct SwerlReward {
    output: Output,
    signature: Signature,
}

pub fn swerl_reward_udf() -> ScalarUDF {
    ScalarUDF::new_from_impl(SwerlReward {
        output: Output::Reward,
        signature: Signature::user_defined(Volatility::Immutable),
    })
}

pub fn swerl_format_error_udf() -> ScalarUDF {
    ScalarUDF::new_from_impl(SwerlReward {
        output: Output::FormatError,
        signature: Signature::user_defined(Volatility::Immutable),
    })
}

/// Whether `t` is a string type (or NULL, which reads as a NULL string).
fn stringlike(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null)
}

impl ScalarUDFImpl for SwerlReward {
    fn name(&self) -> &str {
        match self.output {
            Output::Reward => "swerl_reward",
            Output::FormatError => "swerl_format_error",
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    /// `(context, oracle, output)`: two maps (`MAP<VARCHAR, VARCHAR>` or JSON object strings)
    /// and a string, checked when the query is planned; NULL literals read as NULL strings.
    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        let usage = "(context MAP<VARCHAR, VARCHAR> or JSON VARCHAR, oracle MAP<VARCHAR, VARCHAR> or JSON VARCHAR, output VARCHAR)";
        if arg_types.len() != 3 {
            return plan_err!("{}{usage} takes 3 arguments, not {}", self.name(), arg_types.len());
        }
        let mut out = Vec::with_capacity(3);
        for (i, (t, what)) in arg_types.iter().zip(["context", "oracle", "output"]).enumerate() {
            let map_ok = i < 2 && matches!(t, DataType::Map(..));
            if !(map_ok || stringlike(t)) {
                return plan_err!("{}{usage}: argument {} ({what}) is {t}", self.name(), i + 1);
            }
            out.push(if *t == DataType::Null { DataType::Utf8 } else { t.clone() });
        }
        Ok(out)
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(match self.output {
            Output::Reward => DataType::Float64,
            Output::FormatError => DataType::Utf8,
        })
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        // The arity and types were checked at planning (coerce_types).
        let [context, oracle, output] = arrays.as_slice() else {
            return exec_err!("{} takes (context, oracle, output)", self.name());
        };
        let context = MapColumn::new(context).map_err(|e| exec_datafusion_err!("{}: context: {e}", self.name()))?;
        let oracle = MapColumn::new(oracle).map_err(|e| exec_datafusion_err!("{}: oracle: {e}", self.name()))?;
        let output = cast(output, &DataType::Utf8)?;
        let output = output.as_string::<i32>();
        let score = |row: usize| -> Option<Reward> {
            if output.is_null(row) {
                return None;
            }
            let (c, o) = (context.get(row)?, oracle.get(row)?);
            search_replace_reward(&c, &o, output.value(row)).ok()
        };
        let array: ArrayRef = match self.output {
            Output::Reward => {
                let mut b = Float64Builder::with_capacity(n);
                for row in 0..n {
                    b.append_option(score(row).map(|r| r.reward));
                }
                Arc::new(b.finish())
            }
            Output::FormatError => {
                let mut b = StringBuilder::with_capacity(n, 0);
                for row in 0..n {
                    b.append_option(score(row).and_then(|r| r.format_error));
                }
                Arc::new(b.finish())
            }
        };
        Ok(ColumnarValue::Array(array))
    }
}
