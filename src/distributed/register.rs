//! The client's side: a session whose plans run on the cluster, with every table of the lake
//! registered as the Parquet files of the one Delta version the client read.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use arrow::datatypes::{Schema, SchemaRef};
use ballista::prelude::SessionContextExt;
use datafusion::common::ScalarValue;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl};
use datafusion::logical_expr::{col, lit, Expr};
use datafusion::prelude::SessionContext;

use crate::lake::Lake;

use super::process::{ballista_config, state};
use super::scheduler_url;

/// A session on the cluster at `scheduler` with every table of `lake` registered as the files
/// of its current version, and each of `optional` that does not exist as an empty table.
pub async fn session(lake: &Lake, scheduler: &str, optional: &[&str]) -> Result<SessionContext> {
    let url = scheduler_url(scheduler)?;
    // Ballista connects only when a plan runs; a job would by then have created its output
    // table. Say at once that the scheduler is not there.
    let addr = url.trim_start_matches("df://").to_string();
    match tokio::time::timeout(std::time::Duration::from_secs(10), tokio::net::TcpStream::connect(&addr)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => bail!("the Ballista scheduler at {url} is not reachable: {e}"),
        Err(_) => bail!("the Ballista scheduler at {url} did not answer within 10 s"),
    }
    let state = state(ballista_config(), lake.storage_options(), true).map_err(|e| anyhow::anyhow!("{e}"))?;
    let ctx = SessionContext::remote_with_state(&url, state)
        .await
        .with_context(|| format!("connecting to the Ballista scheduler at {url}"))?;
    // Ballista's upgrade of the state resets its functions to Ballista's set.
    crate::udfs::register_all(&ctx);
    for name in lake.tables().await? {
        let table = lake.open_table(&name).await?;
        register_files(&ctx, &name, &table).await.with_context(|| format!("registering table `{name}`"))?;
    }
    for name in optional {
        if !lake.has_table(name).await? {
            let schema = crate::schema::arrow(name)?;
            register_empty(&ctx, name, schema)?;
        }
    }
    Ok(ctx)
}

fn parquet_listing(urls: Vec<ListingTableUrl>, schema: SchemaRef) -> Result<Arc<ListingTable>> {
    let options = ListingOptions::new(Arc::new(ParquetFormat::default())).with_file_extension(".parquet");
    let config = ListingTableConfig::new_with_multi_paths(urls).with_listing_options(options).with_schema(schema);
    Ok(Arc::new(ListingTable::try_new(config)?))
}

/// Table `name` as the Parquet files of `table`'s version: one listing per partition value,
/// the partition columns put back as literals, in the table's column order.
async fn register_files(ctx: &SessionContext, name: &str, table: &deltalake::DeltaTable) -> Result<()> {
    let snapshot = table.snapshot()?;
    let schema = snapshot.snapshot().arrow_schema();
    let partition_cols: Vec<String> = snapshot.metadata().partition_columns().to_vec();
    let root = table.table_url().clone();
    let mut groups: BTreeMap<Vec<Option<String>>, Vec<ListingTableUrl>> = BTreeMap::new();
    for f in snapshot.log_data().iter() {
        let values = f.partition_values_map();
        let key: Vec<Option<String>> = partition_cols.iter().map(|c| values.get(c).cloned().flatten()).collect();
        let url = root.join(f.path().as_ref()).with_context(|| format!("file {} of `{name}`", f.path()))?;
        groups.entry(key).or_default().push(ListingTableUrl::parse(url.as_str())?);
    }
    if groups.is_empty() {
        ctx.register_table(name, empty_table(ctx, &schema)?.into_view())?;
        return Ok(());
    }
    if partition_cols.is_empty() {
        let files = groups.into_values().next().unwrap_or_default();
        ctx.register_table(name, parquet_listing(files, schema)?)?;
        return Ok(());
    }
    let file_schema = Arc::new(Schema::new(
        schema.fields().iter().filter(|f| !partition_cols.contains(f.name())).cloned().collect::<Vec<_>>(),
    ));
    let mut union: Option<datafusion::prelude::DataFrame> = None;
    for (values, files) in groups {
        let part = ctx.read_table(parquet_listing(files, file_schema.clone())?)?;
        let exprs: Vec<Expr> = schema
            .fields()
            .iter()
            .map(|f| -> Result<Expr> {
                Ok(match partition_cols.iter().position(|c| c == f.name()) {
                    Some(i) => {
                        let v = match &values[i] {
                            Some(s) => ScalarValue::try_from_string(s.clone(), f.data_type())?,
                            None => ScalarValue::try_from(f.data_type())?,
                        };
                        lit(v).alias(f.name())
                    }
                    None => col(datafusion::common::Column::from_name(f.name())),
                })
            })
            .collect::<Result<_>>()?;
        let part = part.select(exprs)?;
        union = Some(match union {
            None => part,
            Some(u) => u.union(part)?,
        });
    }
    ctx.register_table(name, union.expect("at least one partition").into_view())?;
    Ok(())
}

/// A table with no rows and `schema`'s columns: typed NULLs from one VALUES row that a filter
/// drops. Not an empty listing: a scan of no files has no partitions, and a union of it with
/// a real scan never finishes on Ballista 55 (its task metrics do not line up); not an empty
/// relation, whose columns the wire format drops.
fn empty_table(ctx: &SessionContext, schema: &Schema) -> Result<datafusion::prelude::DataFrame> {
    use datafusion::logical_expr::LogicalPlanBuilder;
    let exprs = schema
        .fields()
        .iter()
        .map(|f| Ok(lit(ScalarValue::try_from(f.data_type())?).alias(f.name())))
        .collect::<Result<Vec<Expr>>>()?;
    let plan = LogicalPlanBuilder::values(vec![vec![lit(0i64)]])?
        .filter(col("column1").eq(lit(1i64)))?
        .project(exprs)?
        .build()?;
    Ok(datafusion::prelude::DataFrame::new(ctx.state(), plan))
}

/// An optional input that does not exist yet.
fn register_empty(ctx: &SessionContext, name: &str, schema: SchemaRef) -> Result<()> {
    ctx.register_table(name, empty_table(ctx, &schema)?.into_view())?;
    Ok(())
}
