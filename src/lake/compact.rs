//! Compaction: small files of one partition and key group rewritten as one file, in one commit
//! that only removes files no other writer removed first (see [`super::maintain`]).

use std::collections::HashMap;

use anyhow::{Context, Result};
use arrow::array::{new_null_array, ArrayRef, RecordBatch, StringArray};
use deltalake::kernel::transaction::{CommitBuilder, CommitProperties};
use deltalake::kernel::Action;
use deltalake::protocol::DeltaOperation;
use deltalake::DeltaTable;
use object_store::ObjectStoreExt;

use super::{writer_properties, Codec, Lake, TableWriter};

impl Lake {
    /// Rewrites `files` (of one partition and key group) as one file in one commit; false when
    /// another writer removed one of them first (the group is left to the next run).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn compact(
        &self,
        table: &mut DeltaTable,
        name: &str,
        schema: &arrow::datatypes::SchemaRef,
        partition_col: Option<&String>,
        part: Option<&str>,
        key: &str,
        files: &[String],
    ) -> Result<bool> {
        let new_key = if key.is_empty() { uuid::Uuid::new_v4().simple().to_string() } else { key.to_string() };
        let mut writer = TableWriter::new(
            self,
            name,
            &new_key,
            schema,
            partition_col.map(|s| s.as_str()),
            writer_properties(&[], &[], Codec::Zstd),
        )?;
        for f in files {
            let (store, path) = self.object(&format!("{name}/{f}"));
            let bytes = store.get(&path).await.with_context(|| format!("reading {f}"))?.bytes().await?;
            let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(bytes)?.build()?;
            for batch in reader {
                let batch = batch?;
                let columns: Vec<ArrayRef> = schema
                    .fields()
                    .iter()
                    .map(|field| -> Result<ArrayRef> {
                        if Some(field.name()) == partition_col {
                            let constant: ArrayRef = match part {
                                Some(v) => arrow::compute::cast(
                                    &StringArray::from(vec![v; batch.num_rows()]),
                                    field.data_type(),
                                )?,
                                None => new_null_array(field.data_type(), batch.num_rows()),
                            };
                            return Ok(constant);
                        }
                        let col = batch
                            .column_by_name(field.name())
                            .with_context(|| format!("{f} has no column {}", field.name()))?;
                        Ok(arrow::compute::cast(col, field.data_type())?)
                    })
                    .collect::<Result<_>>()?;
                writer.write(&RecordBatch::try_new(schema.clone(), columns)?)?;
            }
        }
        let mut staged = writer.finish()?;
        self.upload(name, &mut staged).await?;
        let Some(mut actions) = super::commit::remove_actions(table, files)? else {
            return Ok(false);
        };
        actions.extend(staged.into_iter().map(|f| Action::Add(f.into_add())));
        let op = DeltaOperation::Optimize { predicate: None, target_size: 0 };
        let props = CommitProperties::default()
            .with_metadata(HashMap::from([("swelake.job".to_string(), serde_json::json!("maintain"))]));
        // deltalake's conflict checker retries over commits that did not touch these files
        // and fails when one removed them: then the group waits for the next run.
        let snapshot = table.snapshot()?;
        match CommitBuilder::from(props).with_actions(actions).build(Some(snapshot), table.log_store(), op).await {
            Ok(_) => {
                table.load().await?;
                Ok(true)
            }
            Err(e) => {
                tracing::info!(table = name, error = %e, "compaction of a group lost to another writer; left for later");
                table.load().await?;
                Ok(false)
            }
        }
    }
}
