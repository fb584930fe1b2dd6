//! Every swelake SQL function, registered in one place so `swelake sql`, the jobs and the
//! tests all see the same set.

use datafusion::prelude::SessionContext;

pub fn register_all(ctx: &SessionContext) {
    ctx.register_udf(crate::reward::udf::swerl_reward_udf());
    ctx.register_udf(crate::reward::udf::swerl_format_error_udf());
    ctx.register_udf(crate::prs::udf::resolving_refs_udf());
    // The filter predicates with the built-in config; jobs run with `--config` re-register
    // them with theirs.
    for f in crate::filters::udf::filter_udfs(crate::filters::Predicates::default_set().clone()) {
        ctx.register_udf(f);
    }
}
