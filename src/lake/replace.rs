//! Replacing what a key produced (see the module doc of [`super`]): staged files uploaded, then
//! the key's old files removed and the new ones added in one commit; the whole table the same
//! way; rows deleted by a predicate.

use std::collections::HashMap;
use std::path::Path;

use super::commit;
use super::failpoint::failpoint;
use super::tables::table_name_of;
use super::{Lake, StagedFile};
use anyhow::{Context, Result};
use deltalake::DeltaTable;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde_json::Value;

impl Lake {
    /// Uploads the staged files of an object-store lake into table `name` (a no-op for files
    /// already in place).
    pub(crate) async fn upload(&self, name: &str, files: &mut [StagedFile]) -> Result<()> {
        failpoint(&format!("upload.before:{name}"));
        for f in files.iter_mut() {
            let Some(local) = f.local.take() else { continue };
            let (store, path) = self.object(&format!("{name}/{}", f.rel_path));
            // The store's client retries transient failures (5xx, timeouts, resets) itself.
            put_file(store.as_ref(), &path, &local)
                .await
                .with_context(|| format!("uploading {name}/{}", f.rel_path))?;
            let _ = std::fs::remove_file(&local);
        }
        failpoint(&format!("upload.after:{name}"));
        Ok(())
    }

    /// Commits `files` as the complete output of `key`: removes every active file whose name
    /// starts with `{key}.` and adds the new ones, in one transaction. Returns the new table
    /// version, or `None` when there was nothing to add or remove.
    pub async fn replace_key(
        &self,
        table: &mut DeltaTable,
        key: &str,
        files: Vec<StagedFile>,
        predicate: String,
        app_metadata: HashMap<String, Value>,
    ) -> Result<Option<i64>> {
        self.replace_keys(table, &[key.to_string()], files, predicate, app_metadata).await
    }

    /// [`Lake::replace_key`] for several keys in one transaction.
    pub async fn replace_keys(
        &self,
        table: &mut DeltaTable,
        keys: &[String],
        mut files: Vec<StagedFile>,
        predicate: String,
        app_metadata: HashMap<String, Value>,
    ) -> Result<Option<i64>> {
        let name = table_name_of(table);
        self.upload(&name, &mut files).await?;
        failpoint(&format!("commit.before:{name}"));
        let v = commit::replace_keys(table, keys, files, predicate, app_metadata).await?;
        failpoint(&format!("commit.after:{name}"));
        Ok(v)
    }

    /// Commits `files` as the whole content of `table`: every active file is removed and the
    /// new ones added, in one transaction (an overwrite whose rows were streamed to staged
    /// files rather than held in memory). Returns the new version.
    pub async fn replace_all(
        &self,
        table: &mut DeltaTable,
        mut files: Vec<StagedFile>,
        app_metadata: HashMap<String, Value>,
    ) -> Result<Option<i64>> {
        let name = table_name_of(table);
        self.upload(&name, &mut files).await?;
        failpoint(&format!("commit.before:{name}"));
        let v = commit::replace(table, commit::Replace::All, files, "overwrite".into(), app_metadata).await?;
        failpoint(&format!("commit.after:{name}"));
        Ok(v)
    }

    /// Deletes the rows matching a SQL predicate (a no-op when the table does not exist).
    pub async fn delete_where(&self, name: &str, predicate: &str) -> Result<()> {
        if !self.has_table(name).await? {
            return Ok(());
        }
        let table = self.open_table(name).await?;
        table
            .delete()
            .with_predicate(predicate)
            .await
            .with_context(|| format!("deleting from `{name}` where {predicate}"))?;
        Ok(())
    }
}

/// Copies a local file into the store, in parts for large files.
pub(crate) async fn put_file(store: &dyn ObjectStore, path: &ObjectPath, local: &Path) -> Result<()> {
    const SMALL: u64 = 8 << 20;
    let len = std::fs::metadata(local).with_context(|| format!("reading {}", local.display()))?.len();
    if len <= SMALL {
        let bytes = tokio::fs::read(local).await?;
        store.put(path, PutPayload::from(bytes)).await?;
        return Ok(());
    }
    use tokio::io::AsyncReadExt;
    let mut upload = object_store::WriteMultipart::new(store.put_multipart(path).await?);
    let mut f = tokio::fs::File::open(local).await?;
    let mut buf = vec![0u8; 8 << 20];
    loop {
        let n = f.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        upload.write(&buf[..n]);
    }
    upload.finish().await?;
    Ok(())
}
