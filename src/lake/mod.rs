//! The lake: Delta tables, one per name, under one root — a local directory or a prefix of an
//! object store (`s3://bucket/prefix`, `gs://…`, `az://…`, `file://…`). [`Lake`] is a thin
//! handle (the root, its store and options); each operation on the tables is a file of its own,
//! as delta-rs keeps its `operations/`:
//!
//! | file | operation |
//! |---|---|
//! | [`tables`] | has, list, open, create from a schema (adding columns a newer version added) |
//! | [`replace`] | replace the files one *key* produced, or the whole table; delete by predicate |
//! | [`upsert`] | upsert rows by primary key, rewriting only the files that hold replaced keys |
//! | [`append`] | append; append a staged file; insert the rows whose key is absent |
//! | [`maintain`], [`compact`] | compact small files, checkpoint, vacuum, a table's status |
//! | [`lease`] | leases that keep two runs off the same inputs |
//! | [`runs`] | each job's run records (`_job_runs`) |
//! | [`session`] | DataFusion sessions over the tables |
//! | [`commit`] | the commits under them all: retried over other writers' versions |
//!
//! Replacement by key is what makes jobs idempotent: each data file's name starts with the
//! key of the input that produced it (`2015-01-01-15.<uuid>.parquet`), and a rerun for that
//! key removes those files and adds the new ones in one commit, so readers see either the old
//! rows or the new ones, never both or neither. Several writers may commit to one table at
//! once: a commit that loses the race is retried over the new version unless another writer
//! replaced the same key, which is an error naming the key ([`commit`]).
//!
//! Also here: where the bytes live and how credentials stay out of messages ([`store`]), the
//! Parquet writer ([`writer`]), rows written by column name from their schema ([`rows`]),
//! the content-addressed blob store that two stages write ([`blobs`]) and the crash points
//! tests use ([`failpoint()`]).
//!
//! Not here: what goes into the tables (the stage modules) and SQL functions (a session has
//! none until the layer that plans a query registers them).

pub mod append;
pub mod blobs;
mod columns;
pub mod commit;
pub mod compact;
pub mod failpoint;
pub mod lease;
pub mod maintain;
pub mod replace;
pub mod rows;
pub mod runs;
pub mod session;
pub mod store;
pub mod tables;
pub mod upsert;
pub mod writer;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use object_store::path::Path as ObjectPath;
use object_store::ObjectStore;
use url::Url;

pub use failpoint::failpoint;
pub use session::session_config;
pub use writer::{
    conform, conform_for_writer, writer_properties, written_as, Codec, ColumnStats, StagedFile, TableWriter,
};

/// A lake: its root URL, the store behind it and the options that reach it.
#[derive(Debug, Clone)]
pub struct Lake {
    /// The root, ending in `/`.
    url: Url,
    store: Arc<dyn ObjectStore>,
    /// The root's path inside `store`.
    prefix: ObjectPath,
    /// Storage options for deltalake (credentials, endpoint).
    options: BTreeMap<String, String>,
    /// The directory, for a local lake.
    local: Option<PathBuf>,
    /// Where writers stage Parquet files before upload, for an object-store lake.
    staging: Option<Arc<tempfile::TempDir>>,
}

impl Lake {
    /// Opens the lake at a local directory (created if needed) or a store URL, with the store
    /// options of the environment.
    pub fn open(location: &str) -> Result<Lake> {
        Lake::open_with(location, &[])
    }

    /// [`Lake::open`] with explicit storage options (`--storage-option KEY=VALUE`) over the
    /// environment's.
    pub fn open_with(location: &str, given: &[(String, String)]) -> Result<Lake> {
        let options = store::options(given);
        let is_url = location.contains("://");
        if !is_url || location.starts_with("file://") {
            let path = PathBuf::from(location.strip_prefix("file://").unwrap_or(location));
            std::fs::create_dir_all(&path).with_context(|| format!("creating lake directory {}", path.display()))?;
            let root = path.canonicalize().with_context(|| format!("resolving {}", path.display()))?;
            let url = Url::from_directory_path(&root)
                .map_err(|_| anyhow::anyhow!("{} is not an absolute path", root.display()))?;
            let store: Arc<dyn ObjectStore> = Arc::new(object_store::local::LocalFileSystem::new());
            let prefix = ObjectPath::from_filesystem_path(&root)?;
            return Ok(Lake { url, store, prefix, options, local: Some(root), staging: None });
        }
        store::register_handlers();
        let mut url = Url::parse(location).with_context(|| format!("lake {location:?} is not a URL"))?;
        if !url.path().ends_with('/') {
            url.set_path(&format!("{}/", url.path()));
        }
        let (store, prefix) = store::open(&url, &options)?;
        let staging =
            tempfile::Builder::new().prefix("swelake-staging-").tempdir().context("creating a staging directory")?;
        Ok(Lake { url, store, prefix, options, local: None, staging: Some(Arc::new(staging)) })
    }

    /// The lake's location as it may be shown (no credentials).
    pub fn location(&self) -> String {
        match &self.local {
            Some(p) => p.display().to_string(),
            None => store::display_url(&self.url),
        }
    }

    /// The directory of a local lake (`None` for an object-store lake).
    pub fn local_root(&self) -> Option<&Path> {
        self.local.as_deref()
    }

    /// The storage options the lake was opened with (for readers of its files).
    pub fn storage_options(&self) -> &BTreeMap<String, String> {
        &self.options
    }

    /// The store and the path of `rel` (a path under the lake's root) in it.
    pub fn object(&self, rel: &str) -> (Arc<dyn ObjectStore>, ObjectPath) {
        let mut p = self.prefix.clone();
        for part in rel.split('/').filter(|s| !s.is_empty()) {
            p = p.clone().join(part);
        }
        (self.store.clone(), p)
    }

    /// Where `rel` (a path under the root) is, as it may be shown: a local path or a store URL.
    pub fn display_of(&self, rel: &str) -> String {
        match &self.local {
            Some(root) => root.join(rel).display().to_string(),
            None => format!("{}{rel}", self.location()),
        }
    }

    /// The URL of table `name`.
    pub fn table_url(&self, name: &str) -> Url {
        self.url.join(&format!("{name}/")).expect("table names are plain path segments")
    }

    /// Where a writer of `table` puts its files, and whether they are staged for upload.
    pub(crate) fn writer_dir(&self, table: &str) -> (PathBuf, bool) {
        match (&self.local, &self.staging) {
            (Some(root), _) => (root.join(table), false),
            (None, Some(staging)) => (staging.path().join(table), true),
            (None, None) => unreachable!("an object-store lake has a staging directory"),
        }
    }
}
