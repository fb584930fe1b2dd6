//! Every swelake SQL function, registered in one place so `swelake sql`, the jobs, the
//! Ballista scheduler and executors, and the tests all see the same set.

use datafusion::logical_expr::{AggregateUDF, ScalarUDF};
use datafusion::prelude::SessionContext;

/// The functions, the filter predicates with the built-in config (jobs run with `--config`
/// re-register those with theirs, and a plan carries that config to other processes).
pub fn all() -> Vec<ScalarUDF> {
    let mut out = vec![
        crate::reward::udf::swerl_reward_udf(),
        crate::reward::udf::swerl_format_error_udf(),
        crate::prs::udf::resolving_refs_udf(),
    ];
    out.extend(crate::filters::udf::filter_udfs(crate::filters::Predicates::default_set().clone()));
    out
}

/// The aggregate functions.
pub fn aggregates() -> Vec<AggregateUDF> {
    vec![crate::prs::latest::latest_by_udaf()]
}

pub fn register_all(ctx: &SessionContext) {
    for f in all() {
        ctx.register_udf(f);
    }
    for f in aggregates() {
        ctx.register_udaf(f);
    }
}
