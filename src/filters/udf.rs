//! The filter predicates as DataFusion scalar UDFs returning BOOLEAN (NULL inputs count as
//! absent: `is_bot_account(NULL, NULL)` is false).

use std::sync::Arc;

use arrow::array::{Array, AsArray, BooleanArray};
use arrow::compute::cast;
use arrow::datatypes::DataType;
use datafusion::common::types::logical_string;
use datafusion::common::Result;
use datafusion::logical_expr::{
    Coercion, ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, TypeSignatureClass, Volatility,
};

use super::{is_version_only_patch, Predicates};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Which {
    BotAccount,
    BotText,
    NoisePath,
    VersionOnlyPatch,
}

#[derive(Debug)]
struct FilterUdf {
    which: Which,
    predicates: Arc<Predicates>,
    signature: Signature,
}

// Two instances are interchangeable when they compute the same predicate; the config they
// carry only changes per session.
impl PartialEq for FilterUdf {
    fn eq(&self, other: &Self) -> bool {
        self.which == other.which && Arc::ptr_eq(&self.predicates, &other.predicates)
    }
}
impl Eq for FilterUdf {}
impl std::hash::Hash for FilterUdf {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.which.hash(state);
    }
}

impl ScalarUDFImpl for FilterUdf {
    fn name(&self) -> &str {
        match self.which {
            Which::BotAccount => "is_bot_account",
            Which::BotText => "botlike_text",
            Which::NoisePath => "is_noise_path",
            Which::VersionOnlyPatch => "is_version_only_patch",
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::Boolean)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        // The signature admits any string type (and NULL); the predicates read plain strings.
        let cols: Vec<_> = arrays.iter().map(|a| cast(a, &DataType::Utf8)).collect::<std::result::Result<_, _>>()?;
        let get = |c: usize, r: usize| -> Option<&str> {
            let a = cols[c].as_string::<i32>();
            (!a.is_null(r)).then(|| a.value(r))
        };
        let p = &self.predicates;
        let out: BooleanArray = (0..args.number_rows)
            .map(|r| {
                Some(match self.which {
                    Which::BotAccount => p.is_bot_account(get(0, r), get(1, r)),
                    Which::BotText => get(0, r).is_some_and(|t| p.botlike_text(t)),
                    Which::NoisePath => get(0, r).is_some_and(|t| p.is_noise_path(t)),
                    Which::VersionOnlyPatch => get(0, r).is_some_and(is_version_only_patch),
                })
            })
            .collect();
        Ok(ColumnarValue::Array(Arc::new(out)))
    }
}

/// The four filter UDFs for `predicates`.
pub fn filter_udfs(predicates: Arc<Predicates>) -> Vec<ScalarUDF> {
    [Which::BotAccount, Which::BotText, Which::NoisePath, Which::VersionOnlyPatch]
        .into_iter()
        .map(|which| {
            ScalarUDF::new_from_impl(FilterUdf {
                which,
                predicates: predicates.clone(),
                // `is_bot_account(login, user_type)`, the others `(text)`: strings, a fixed arity.
                signature: Signature::coercible(
                    vec![
                        Coercion::new_exact(TypeSignatureClass::Native(logical_string()));
                        if which == Which::BotAccount { 2 } else { 1 }
                    ],
                    Volatility::Immutable,
                ),
            })
        })
        .collect()
}

/// The config a filter function was built from, when `udf` is one: what a plan carries to
/// the processes that run it (Ballista's scheduler and executors), so that they filter by
/// the job's `--config`, not by their own defaults.
pub fn encode(udf: &ScalarUDF) -> Option<Vec<u8>> {
    let inner: &dyn std::any::Any = udf.inner().as_ref();
    inner.downcast_ref::<FilterUdf>().map(|f| f.predicates.config_json.as_bytes().to_vec())
}

/// The filter function `name` built from the config [`encode`] wrote. Compiled predicates are
/// kept per config, since every task of a job decodes the same ones.
pub fn decode(name: &str, buf: &[u8]) -> anyhow::Result<ScalarUDF> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static COMPILED: OnceLock<Mutex<HashMap<Vec<u8>, Arc<Predicates>>>> = OnceLock::new();
    let predicates = {
        let mut cache = COMPILED.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
        match cache.get(buf) {
            Some(p) => p.clone(),
            None => {
                let config: super::FilterConfig = serde_json::from_slice(buf)
                    .map_err(|e| anyhow::anyhow!("the filter config carried by `{name}` does not parse: {e}"))?;
                let p = Arc::new(Predicates::new(&config)?);
                if cache.len() > 64 {
                    cache.clear();
                }
                cache.insert(buf.to_vec(), p.clone());
                p
            }
        }
    };
    filter_udfs(predicates)
        .into_iter()
        .find(|f| f.name() == name)
        .ok_or_else(|| anyhow::anyhow!("`{name}` is not a filter function"))
}
