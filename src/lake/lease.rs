//! Leases: which run holds which inputs of a job, recorded in the lake, so that two runs of one
//! job never work on the same input at once while runs on disjoint inputs never wait for each
//! other.
//!
//! A lease is per job and *input key* (an hour file, a date partition, a repository, or
//! `__all__` for a job over its inputs as a whole). Its history is a sequence of small JSON
//! objects under `_leases/{job}/{key}/`, numbered `00000000000000000001.json`, … ; the highest
//! number says who holds the key until when (or that it was released). Taking a key writes the
//! next number with create-if-absent, which the store does atomically (a local file system,
//! S3's conditional put, GCS and Azure alike), so of two runs racing for a key exactly one
//! wins. A holder renews its lease while it runs; a run that was killed stops renewing, and its
//! lease expires (at once, when its process is gone from this host), so it never blocks for
//! ever.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};

use super::Lake;

/// How long a lease lasts without renewal (`SWELAKE_LEASE_TTL_SECS` overrides it).
pub const DEFAULT_TTL: Duration = Duration::from_secs(600);

fn ttl() -> Duration {
    std::env::var("SWELAKE_LEASE_TTL_SECS").ok().and_then(|s| s.parse().ok()).map_or(DEFAULT_TTL, Duration::from_secs)
}

/// One entry of a key's lease history.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Entry {
    pub job: String,
    pub key: String,
    /// `host:pid:id` of the run.
    pub holder: String,
    /// Milliseconds since the epoch.
    pub acquired_at: i64,
    pub expires_at: i64,
    /// The holder let go (finished or failed).
    pub released: bool,
}

impl Entry {
    /// Whether the entry still holds its key at `now` (ms).
    fn live(&self, now: i64) -> bool {
        !self.released && self.expires_at > now && !holder_gone(&self.holder)
    }
}

/// Whether `holder` was a process of this host that no longer exists.
fn holder_gone(holder: &str) -> bool {
    let mut parts = holder.splitn(3, ':');
    let (Some(host), Some(pid)) = (parts.next(), parts.next()) else { return false };
    if host != hostname() {
        return false;
    }
    match pid.parse::<u32>() {
        Ok(pid) if pid != std::process::id() => !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        _ => false,
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "localhost".to_string())
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Keys as path segments.
fn segment(s: &str) -> String {
    crate::files::path_segment(s)
}

/// Another run holds inputs this run needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Busy {
    pub job: String,
    pub key: String,
    pub holder: String,
    pub expires_at: i64,
}

impl std::fmt::Display for Busy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let until = chrono::DateTime::from_timestamp_millis(self.expires_at)
            .map_or_else(|| self.expires_at.to_string(), |d| d.format("%Y-%m-%dT%H:%M:%SZ").to_string());
        write!(
            f,
            "job {} input {} is held by run {} (lease until {until}); another run of this job is working on it",
            self.job, self.key, self.holder
        )
    }
}

impl std::error::Error for Busy {}

/// The leases a run holds. They are renewed in the background until [`Held::release`].
pub struct Held {
    lake: Lake,
    job: String,
    holder: String,
    keys: Vec<String>,
    renewer: Option<tokio::task::JoinHandle<()>>,
}

/// The highest entry of a key's history, with its number.
async fn latest(store: &dyn ObjectStore, dir: &ObjectPath) -> Result<Option<(u64, Entry)>> {
    let mut best: Option<(u64, ObjectPath)> = None;
    let mut listing = store.list(Some(dir));
    while let Some(meta) = listing.next().await {
        let meta = meta?;
        let Some(n) =
            meta.location.filename().and_then(|f| f.strip_suffix(".json")).and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        if best.as_ref().is_none_or(|(b, _)| n > *b) {
            best = Some((n, meta.location));
        }
    }
    let Some((n, path)) = best else { return Ok(None) };
    let bytes = store.get(&path).await?.bytes().await?;
    let entry: Entry = serde_json::from_slice(&bytes).with_context(|| format!("reading lease {path}"))?;
    Ok(Some((n, entry)))
}

fn entry_path(dir: &ObjectPath, n: u64) -> ObjectPath {
    dir.clone().join(format!("{n:020}.json"))
}

/// Writes entry `n` if no one has; false when someone did.
async fn create(store: &dyn ObjectStore, path: &ObjectPath, e: &Entry) -> Result<bool> {
    let payload = PutPayload::from(serde_json::to_vec(e)?);
    match store.put_opts(path, payload, PutOptions::from(PutMode::Create)).await {
        Ok(_) => Ok(true),
        Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

impl Lake {
    fn lease_dir(&self, job: &str, key: &str) -> (std::sync::Arc<dyn ObjectStore>, ObjectPath) {
        self.object(&format!("_leases/{}/{}", segment(job), segment(key)))
    }

    /// Takes the leases of `keys` of `job` for this run, or reports who holds one of them. With
    /// `wait`, a held key is retried until it frees or `wait` passes. Keys are taken in sorted
    /// order, and all that were taken are given back when one is held, so two runs never hold
    /// parts of each other's inputs while waiting.
    pub async fn acquire_leases(&self, job: &str, keys: &[String], wait: Option<Duration>) -> Result<Held> {
        let holder =
            format!("{}:{}:{}", hostname(), std::process::id(), &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let mut keys: Vec<String> = keys.to_vec();
        keys.sort();
        keys.dedup();
        let deadline = wait.map(|w| std::time::Instant::now() + w);
        loop {
            let mut taken: Vec<String> = Vec::new();
            let mut busy = None;
            for key in &keys {
                match self.take(job, key, &holder).await? {
                    None => taken.push(key.clone()),
                    Some(b) => {
                        busy = Some(b);
                        break;
                    }
                }
            }
            let Some(b) = busy else {
                let mut held = Held { lake: self.clone(), job: job.to_string(), holder, keys: taken, renewer: None };
                held.start_renewing();
                super::failpoint(&format!("lease.acquired:{job}"));
                return Ok(held);
            };
            for key in &taken {
                self.give_back(job, key, &holder).await?;
            }
            match deadline {
                Some(d) if std::time::Instant::now() < d => tokio::time::sleep(Duration::from_millis(500)).await,
                _ => return Err(anyhow::Error::new(b)),
            }
        }
    }

    /// Runs `work` holding the leases of `keys` of `job`, and gives them back after it, whether
    /// it succeeded or not.
    pub async fn with_leases<T, F>(&self, job: &str, keys: &[String], wait: Option<Duration>, work: F) -> Result<T>
    where
        F: std::future::Future<Output = Result<T>>,
    {
        let held = self.acquire_leases(job, keys, wait).await?;
        let result = work.await;
        held.release().await?;
        result
    }

    /// Takes one key; `Some` when another run holds it.
    async fn take(&self, job: &str, key: &str, holder: &str) -> Result<Option<Busy>> {
        let (store, dir) = self.lease_dir(job, key);
        loop {
            let now = now_ms();
            let next = match latest(store.as_ref(), &dir).await? {
                Some((_, e)) if e.live(now) && e.holder != holder => {
                    return Ok(Some(Busy {
                        job: job.to_string(),
                        key: key.to_string(),
                        holder: e.holder,
                        expires_at: e.expires_at,
                    }))
                }
                Some((n, _)) => n + 1,
                None => 1,
            };
            let e = Entry {
                job: job.to_string(),
                key: key.to_string(),
                holder: holder.to_string(),
                acquired_at: now,
                expires_at: now + ttl().as_millis() as i64,
                released: false,
            };
            if create(store.as_ref(), &entry_path(&dir, next), &e).await? {
                return Ok(None);
            }
            // Someone wrote that number first: look again at who holds the key.
        }
    }

    /// Writes a release entry for a key this run holds (nothing when it no longer does).
    async fn give_back(&self, job: &str, key: &str, holder: &str) -> Result<()> {
        self.write_own(job, key, holder, true).await
    }

    /// Appends an entry for a key whose latest entry is `holder`'s: a renewal, or a release.
    async fn write_own(&self, job: &str, key: &str, holder: &str, release: bool) -> Result<()> {
        let (store, dir) = self.lease_dir(job, key);
        for _ in 0..8 {
            let Some((n, e)) = latest(store.as_ref(), &dir).await? else { return Ok(()) };
            if e.holder != holder || e.released {
                return Ok(());
            }
            let now = now_ms();
            let next = Entry {
                acquired_at: e.acquired_at,
                expires_at: if release { now } else { now + ttl().as_millis() as i64 },
                released: release,
                ..e
            };
            if create(store.as_ref(), &entry_path(&dir, n + 1), &next).await? {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Every key of `job` (all jobs when `None`) with its latest lease entry.
    pub async fn leases(&self, job: Option<&str>) -> Result<Vec<Entry>> {
        let (store, root) = self.object(&match job {
            Some(j) => format!("_leases/{}", segment(j)),
            None => "_leases".to_string(),
        });
        let mut dirs: std::collections::BTreeSet<ObjectPath> = std::collections::BTreeSet::new();
        let mut listing = store.list(Some(&root));
        while let Some(meta) = listing.next().await {
            let meta = meta?;
            let parts: Vec<_> = meta.location.parts().collect();
            if parts.len() >= 2 {
                dirs.insert(ObjectPath::from_iter(parts[..parts.len() - 1].iter().cloned()));
            }
        }
        let mut out = Vec::new();
        for dir in dirs {
            if let Some((_, e)) = latest(store.as_ref(), &dir).await? {
                out.push(e);
            }
        }
        Ok(out)
    }
}

impl Held {
    fn start_renewing(&mut self) {
        let (lake, job, holder, keys) = (self.lake.clone(), self.job.clone(), self.holder.clone(), self.keys.clone());
        let every = ttl() / 3;
        self.renewer = tokio::runtime::Handle::try_current().ok().map(|h| {
            h.spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    for key in &keys {
                        if let Err(e) = lake.write_own(&job, key, &holder, false).await {
                            tracing::warn!(job = %job, key = %key, error = %format!("{e:#}"), "could not renew a lease");
                        }
                    }
                }
            })
        });
    }

    /// The run that holds these leases.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Gives every lease back.
    pub async fn release(mut self) -> Result<()> {
        if let Some(r) = self.renewer.take() {
            r.abort();
        }
        for key in std::mem::take(&mut self.keys) {
            self.lake.give_back(&self.job, &key, &self.holder).await?;
        }
        Ok(())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // Not released (an error unwound past it): stop renewing, and the leases expire.
        if let Some(r) = self.renewer.take() {
            r.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn overlapping_keys_conflict_and_disjoint_ones_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
        let k = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let a = lake.acquire_leases("ingest", &k(&["2025-01-01-0", "2025-01-01-1"]), None).await.unwrap();
        // Disjoint keys of the same job, and the same keys of another job: both fine.
        let b = lake.acquire_leases("ingest", &k(&["2025-01-01-2"]), None).await.unwrap();
        let c = lake.acquire_leases("pr_timeline", &k(&["2025-01-01-1"]), None).await.unwrap();
        // An overlap is refused, saying who holds what.
        let e = lake.acquire_leases("ingest", &k(&["2025-01-01-1", "2025-01-01-5"]), None).await.err().unwrap();
        let busy = e.downcast_ref::<Busy>().expect("a Busy error");
        assert_eq!((busy.key.as_str(), busy.holder.as_str()), ("2025-01-01-1", a.holder()));
        // ... and it took nothing: 2025-01-01-5 is free.
        let d = lake.acquire_leases("ingest", &k(&["2025-01-01-5"]), None).await.unwrap();
        let live: Vec<Entry> = lake.leases(Some("ingest")).await.unwrap();
        assert_eq!(live.iter().filter(|e| !e.released).count(), 4, "{live:?}");
        // Released keys can be taken again.
        a.release().await.unwrap();
        let again = lake.acquire_leases("ingest", &k(&["2025-01-01-1"]), None).await.unwrap();
        for h in [b, c, d, again] {
            h.release().await.unwrap();
        }
        assert!(lake.leases(None).await.unwrap().iter().all(|e| e.released));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_lease_of_a_process_that_is_gone_does_not_block() {
        let dir = tempfile::tempdir().unwrap();
        let lake = Lake::open(dir.path().to_str().unwrap()).unwrap();
        // A lease written by a process of this host that has exited (a killed run).
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        let (store, dir_path) = lake.lease_dir("seed", crate::lake::runs::WHOLE);
        let stale = Entry {
            job: "seed".into(),
            key: crate::lake::runs::WHOLE.into(),
            holder: format!("{}:{pid}:dead", hostname()),
            acquired_at: now_ms(),
            expires_at: now_ms() + 3_600_000,
            released: false,
        };
        assert!(create(store.as_ref(), &entry_path(&dir_path, 1), &stale).await.unwrap());
        let held = lake.acquire_leases("seed", &[crate::lake::runs::WHOLE.to_string()], None).await.unwrap();
        held.release().await.unwrap();
    }
}
