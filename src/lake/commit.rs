//! Commits that replace what a *key* produced (an hour file, a partition, a shard), safe with
//! several writers on one table.
//!
//! A commit is built from the version its writer read: remove the active files of its keys,
//! add the new ones. When another writer committed first, the log has moved on; this module
//! then reads the commits it missed, and
//! - if one of them added or removed files of the same key, that is a real conflict — two
//!   writers replacing the same input — and an error naming the key;
//! - otherwise (another hour into the same date partition, another table's creation, a
//!   maintenance compaction) it rebuilds the commit over the new version and tries again,
//!   with a bounded, jittered backoff.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use deltalake::kernel::transaction::{CommitBuilder, CommitProperties, TransactionError};
use deltalake::kernel::Action;
use deltalake::protocol::{DeltaOperation, SaveMode};
use deltalake::{DeltaTable, DeltaTableError};
use serde_json::Value;

use super::StagedFile;

/// Attempts of one commit before giving up (each after re-reading the log).
const MAX_ATTEMPTS: u32 = 12;

/// The file-name prefix of a key's files.
fn prefix_of(key: &str) -> String {
    format!("{key}.")
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Whether a lost race is what `e` says (another writer committed the version we wanted).
fn lost_race(e: &DeltaTableError) -> bool {
    matches!(
        e,
        DeltaTableError::VersionAlreadyExists(_)
            | DeltaTableError::Transaction { source: TransactionError::MaxCommitAttempts(_) }
    )
}

/// A real conflict between `scope` and the commits after `read_version`, if any: the key
/// (or "the whole table") and the version that replaced it. Any file added or removed by
/// another writer conflicts with a rewrite of the whole table.
async fn conflicting_key(table: &DeltaTable, read_version: u64, scope: Replace<'_>) -> Result<Option<(String, u64)>> {
    let latest = table.version().unwrap_or(read_version);
    let store = table.log_store();
    for v in read_version + 1..=latest {
        let Some(bytes) = store.read_commit_entry(v).await? else { continue };
        for action in deltalake::logstore::get_actions(v, &bytes)? {
            let path = match &action {
                Action::Add(a) => &a.path,
                Action::Remove(r) => &r.path,
                _ => continue,
            };
            let name = file_name(path);
            match scope {
                Replace::All => return Ok(Some(("the whole table".to_string(), v))),
                Replace::Keys(keys) => {
                    if let Some(k) = keys.iter().find(|k| name.starts_with(&prefix_of(k))) {
                        return Ok(Some((k.clone(), v)));
                    }
                }
            }
        }
    }
    Ok(None)
}

/// Which active files a commit replaces.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Replace<'a> {
    /// The files of these keys.
    Keys(&'a [String]),
    /// Every file: the new files are the whole table.
    All,
}

/// Replaces the files of `keys` by `files` (already in the table's store) in one commit;
/// returns the new version, or `None` when there was nothing to add or remove.
pub(crate) async fn replace_keys(
    table: &mut DeltaTable,
    keys: &[String],
    files: Vec<StagedFile>,
    predicate: String,
    app_metadata: HashMap<String, Value>,
) -> Result<Option<i64>> {
    replace(table, Replace::Keys(keys), files, predicate, app_metadata).await
}

/// Replaces what `scope` names by `files` in one commit (see [`replace_keys`]).
pub(crate) async fn replace(
    table: &mut DeltaTable,
    scope: Replace<'_>,
    files: Vec<StagedFile>,
    predicate: String,
    app_metadata: HashMap<String, Value>,
) -> Result<Option<i64>> {
    let keys: &[String] = match scope {
        Replace::Keys(k) => k,
        Replace::All => &[],
    };
    let prefixes: Vec<String> = keys.iter().map(|k| prefix_of(k)).collect();
    let replaced = |name: &str| match scope {
        Replace::Keys(_) => prefixes.iter().any(|p| name.starts_with(p.as_str())),
        Replace::All => true,
    };
    let adds: Vec<Action> = files.into_iter().map(|f| Action::Add(f.into_add())).collect();
    let what = || match scope {
        Replace::All => "the whole table".to_string(),
        Replace::Keys([one]) => format!("key {one}"),
        Replace::Keys(many) => format!("{} keys starting {:?}", many.len(), many.first()),
    };
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let snapshot = table.snapshot()?;
        let read_version = snapshot.version();
        let partition_by = snapshot.metadata().partition_columns().to_vec();
        let removes: Vec<Action> = snapshot
            .log_data()
            .iter()
            .filter(|f| {
                let path = f.path();
                replaced(file_name(&path))
            })
            .map(|f| Action::Remove(f.remove_action(true)))
            .collect();
        if removes.is_empty() && adds.is_empty() {
            return Ok(None);
        }
        let mut actions = removes;
        actions.extend(adds.iter().cloned());
        let op = DeltaOperation::Write {
            mode: SaveMode::Overwrite,
            partition_by: (!partition_by.is_empty()).then_some(partition_by),
            predicate: Some(predicate.clone()),
        };
        // No retries inside deltalake: a lost race comes back here, where the actions are
        // rebuilt over the new version (deltalake would retry the same removes).
        let props = CommitProperties::default().with_metadata(app_metadata.clone()).with_max_retries(0);
        let result =
            CommitBuilder::from(props).with_actions(actions).build(Some(snapshot), table.log_store(), op).await;
        match result {
            Ok(commit) => {
                let version = commit.version as i64;
                table.load().await?;
                return Ok(Some(version));
            }
            Err(e) if lost_race(&e) && attempt < MAX_ATTEMPTS => {
                table.load().await.context("re-reading the table after a lost commit race")?;
                if let Some((key, v)) = conflicting_key(table, read_version, scope).await? {
                    bail!(
                        "another writer replaced {key} at version {v} of this table while this run did: \
                         two runs must not write the same input (the later run's rows are not committed)"
                    );
                }
                let backoff = Duration::from_millis((20u64 << attempt.min(6)) + jitter_ms());
                tracing::debug!(attempt, version = table.version(), "commit race lost; retrying over the new version");
                tokio::time::sleep(backoff).await;
            }
            Err(e) => {
                return Err(anyhow::Error::new(e)).with_context(|| format!("committing {} (attempt {attempt})", what()))
            }
        }
    }
}

/// A few milliseconds of jitter, so that writers that lost together do not retry together.
fn jitter_ms() -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    u64::from(nanos % 37)
}

/// Appends `files` in a commit made over exactly the version `table` holds: `Ok(None)` when
/// another writer committed first (nothing of this commit landed; the caller re-reads and
/// decides again), else the new version. For writes that are only right over what their
/// writer read, such as insert-if-absent.
pub(crate) async fn append_over_read_version(table: &DeltaTable, files: Vec<StagedFile>) -> Result<Option<i64>> {
    let snapshot = table.snapshot()?;
    let partition_by = snapshot.metadata().partition_columns().to_vec();
    let actions: Vec<Action> = files.into_iter().map(|f| Action::Add(f.into_add())).collect();
    let op = DeltaOperation::Write {
        mode: SaveMode::Append,
        partition_by: (!partition_by.is_empty()).then_some(partition_by),
        predicate: None,
    };
    let props = CommitProperties::default().with_max_retries(0);
    match CommitBuilder::from(props).with_actions(actions).build(Some(snapshot), table.log_store(), op).await {
        Ok(commit) => Ok(Some(commit.version as i64)),
        Err(e) if lost_race(&e) => Ok(None),
        Err(e) => Err(anyhow::Error::new(e)).context("committing an insert-if-absent"),
    }
}

/// The backoff before attempt `attempt` of a commit that lost a race.
pub(crate) fn backoff(attempt: u32) -> Duration {
    Duration::from_millis((20u64 << attempt.min(6)) + jitter_ms())
}

pub(crate) const MAX_COMMIT_ATTEMPTS: u32 = MAX_ATTEMPTS;

/// Removes the files `removed` (table-relative paths) and adds `files`, in a commit made over
/// exactly the version `table` holds: `Ok(None)` when another writer committed first (nothing
/// of this commit landed; the caller re-reads and decides again), else the new version. For
/// rewrites that are only right over what their writer read (an upsert by key).
pub(crate) async fn replace_files_over_read_version(
    table: &DeltaTable,
    removed: &[String],
    files: Vec<StagedFile>,
    predicate: String,
) -> Result<Option<i64>> {
    let snapshot = table.snapshot()?;
    let partition_by = snapshot.metadata().partition_columns().to_vec();
    let Some(mut actions) = remove_actions(table, removed)? else {
        bail!("some of the files to replace are no longer in the table");
    };
    actions.extend(files.into_iter().map(|f| Action::Add(f.into_add())));
    if actions.is_empty() {
        return Ok(None);
    }
    let op = DeltaOperation::Write {
        mode: SaveMode::Overwrite,
        partition_by: (!partition_by.is_empty()).then_some(partition_by),
        predicate: Some(predicate),
    };
    let props = CommitProperties::default().with_max_retries(0);
    match CommitBuilder::from(props).with_actions(actions).build(Some(snapshot), table.log_store(), op).await {
        Ok(commit) => Ok(Some(commit.version as i64)),
        Err(e) if lost_race(&e) => Ok(None),
        Err(e) => Err(anyhow::Error::new(e)).context("committing an upsert"),
    }
}

/// Remove actions for the data files `paths` (table-relative) of the version `table` holds;
/// `None` when one of them is no longer in it.
pub(crate) fn remove_actions(table: &DeltaTable, paths: &[String]) -> Result<Option<Vec<Action>>> {
    let wanted: std::collections::HashSet<&str> = paths.iter().map(String::as_str).collect();
    let removes: Vec<Action> = table
        .snapshot()?
        .log_data()
        .iter()
        .filter(|f| wanted.contains(f.path().as_ref()))
        .map(|f| Action::Remove(f.remove_action(true)))
        .collect();
    Ok((removes.len() == wanted.len()).then_some(removes))
}
