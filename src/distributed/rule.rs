//! The optimizer rule a client's plans need before they travel (see [`KeepEmptySchemas`]).

use datafusion::common::ScalarValue;
use datafusion::logical_expr::{lit, Expr};

/// The last optimizer rule of a client session: an empty relation that has columns (what
/// DataFusion leaves where a filter or a join can match nothing) becomes a projection of
/// typed NULLs under `WHERE false`, which the wire format carries with its columns.
/// DataFusion's own rules turn it back into an empty relation on the scheduler, after the
/// plan has arrived.
#[derive(Debug, Default)]
pub(super) struct KeepEmptySchemas;

impl datafusion::optimizer::OptimizerRule for KeepEmptySchemas {
    fn name(&self) -> &str {
        "swelake_keep_empty_schemas"
    }

    fn apply_order(&self) -> Option<datafusion::optimizer::ApplyOrder> {
        Some(datafusion::optimizer::ApplyOrder::BottomUp)
    }

    fn rewrite(
        &self,
        plan: datafusion::logical_expr::LogicalPlan,
        _config: &dyn datafusion::optimizer::OptimizerConfig,
    ) -> datafusion::common::Result<datafusion::common::tree_node::Transformed<datafusion::logical_expr::LogicalPlan>>
    {
        use datafusion::common::tree_node::Transformed;
        use datafusion::logical_expr::{LogicalPlan, LogicalPlanBuilder};
        let LogicalPlan::EmptyRelation(e) = &plan else { return Ok(Transformed::no(plan)) };
        if e.produce_one_row || e.schema.fields().is_empty() {
            return Ok(Transformed::no(plan));
        }
        let exprs = e
            .schema
            .iter()
            .map(|(q, f)| Ok(lit(ScalarValue::try_from(f.data_type())?).alias_qualified(q.cloned(), f.name())))
            .collect::<datafusion::common::Result<Vec<Expr>>>()?;
        let rebuilt = LogicalPlanBuilder::empty(true).filter(lit(false))?.project(exprs)?.build()?;
        Ok(Transformed::yes(rebuilt))
    }
}
