//! The codecs of plans sent to the cluster: Ballista's own, plus swelake's functions — those
//! built from a job's config carry it inside the plan, the others are found by name.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use ballista_core::serde::{BallistaLogicalExtensionCodec, BallistaPhysicalExtensionCodec};
use datafusion::common::{DataFusionError, TableReference};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{AggregateUDF, ScalarUDF};
use datafusion_proto::logical_plan::LogicalExtensionCodec;
use datafusion_proto::physical_plan::PhysicalExtensionCodec;

use super::write;

fn udf_error(e: anyhow::Error) -> DataFusionError {
    DataFusionError::Plan(format!("{e:#}"))
}

fn encode_udf(node: &ScalarUDF, buf: &mut Vec<u8>) {
    if let Some(bytes) = crate::filters::udf::encode(node) {
        buf.extend(bytes);
    }
}

fn decode_udf(name: &str, buf: &[u8]) -> datafusion::common::Result<Arc<ScalarUDF>> {
    if buf.is_empty() {
        // A function known by name only: swelake's (every process registers the same set) or
        // one of DataFusion's own that Ballista's registry leaves out (`array_compact`).
        return crate::udfs::all()
            .into_iter()
            .map(Arc::new)
            .chain(datafusion::functions::all_default_functions())
            .chain(datafusion::functions_nested::all_default_nested_functions())
            .find(|f| f.name() == name || f.aliases().iter().any(|a| a == name))
            .ok_or_else(|| DataFusionError::Plan(format!("no SQL function `{name}` in this swelake")));
    }
    crate::filters::udf::decode(name, buf).map(Arc::new).map_err(udf_error)
}

fn decode_udaf(name: &str) -> datafusion::common::Result<Arc<AggregateUDF>> {
    crate::udfs::aggregates()
        .into_iter()
        .map(Arc::new)
        .chain(datafusion::functions_aggregate::all_default_aggregate_functions())
        .find(|f| f.name() == name || f.aliases().iter().any(|a| a == name))
        .ok_or_else(|| DataFusionError::Plan(format!("no SQL aggregate function `{name}` in this swelake")))
}

#[derive(Debug, Default)]
pub struct LogicalCodec {
    inner: BallistaLogicalExtensionCodec,
}

impl LogicalExtensionCodec for LogicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[datafusion::logical_expr::LogicalPlan],
        ctx: &TaskContext,
    ) -> datafusion::common::Result<datafusion::logical_expr::Extension> {
        match write::decode_node(buf, inputs) {
            Some(node) => node,
            None => self.inner.try_decode(buf, inputs, ctx),
        }
    }

    fn try_encode(
        &self,
        node: &datafusion::logical_expr::Extension,
        buf: &mut Vec<u8>,
    ) -> datafusion::common::Result<()> {
        if write::encode_node(node, buf) {
            return Ok(());
        }
        self.inner.try_encode(node, buf)
    }

    fn try_decode_table_provider(
        &self,
        buf: &[u8],
        table_ref: &TableReference,
        schema: SchemaRef,
        ctx: &TaskContext,
    ) -> datafusion::common::Result<Arc<dyn datafusion::catalog::TableProvider>> {
        self.inner.try_decode_table_provider(buf, table_ref, schema, ctx)
    }

    fn try_encode_table_provider(
        &self,
        table_ref: &TableReference,
        node: Arc<dyn datafusion::catalog::TableProvider>,
        buf: &mut Vec<u8>,
    ) -> datafusion::common::Result<()> {
        self.inner.try_encode_table_provider(table_ref, node, buf)
    }

    fn try_decode_file_format(
        &self,
        buf: &[u8],
        ctx: &TaskContext,
    ) -> datafusion::common::Result<Arc<dyn datafusion::datasource::file_format::FileFormatFactory>> {
        self.inner.try_decode_file_format(buf, ctx)
    }

    fn try_encode_file_format(
        &self,
        buf: &mut Vec<u8>,
        node: Arc<dyn datafusion::datasource::file_format::FileFormatFactory>,
    ) -> datafusion::common::Result<()> {
        self.inner.try_encode_file_format(buf, node)
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> datafusion::common::Result<Arc<ScalarUDF>> {
        decode_udf(name, buf)
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> datafusion::common::Result<()> {
        encode_udf(node, buf);
        Ok(())
    }

    fn try_decode_udaf(&self, name: &str, _buf: &[u8]) -> datafusion::common::Result<Arc<AggregateUDF>> {
        decode_udaf(name)
    }
}

#[derive(Debug, Default)]
pub struct PhysicalCodec {
    inner: BallistaPhysicalExtensionCodec,
}

impl PhysicalExtensionCodec for PhysicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn datafusion::physical_plan::ExecutionPlan>],
        ctx: &TaskContext,
        converter: &dyn datafusion_proto::physical_plan::PhysicalProtoConverterExtension,
    ) -> datafusion::common::Result<Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
        match write::decode_exec(buf, inputs) {
            Some(exec) => exec,
            None => self.inner.try_decode(buf, inputs, ctx, converter),
        }
    }

    fn try_encode(
        &self,
        node: Arc<dyn datafusion::physical_plan::ExecutionPlan>,
        buf: &mut Vec<u8>,
        converter: &dyn datafusion_proto::physical_plan::PhysicalProtoConverterExtension,
    ) -> datafusion::common::Result<()> {
        if write::encode_exec(&node, buf) {
            return Ok(());
        }
        self.inner.try_encode(node, buf, converter)
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> datafusion::common::Result<Arc<ScalarUDF>> {
        decode_udf(name, buf)
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> datafusion::common::Result<()> {
        encode_udf(node, buf);
        Ok(())
    }

    fn try_decode_udaf(&self, name: &str, _buf: &[u8]) -> datafusion::common::Result<Arc<AggregateUDF>> {
        decode_udaf(name)
    }
}
