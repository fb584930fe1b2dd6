//! Where a lake's bytes live: a local directory or any store `object_store` speaks (`s3://`,
//! `gs://`, `az://`, `file://`), with the options that reach it, and the one place that keeps
//! credentials out of every message.
//!
//! Options come from the environment (`AWS_*`, `GOOGLE_*`, `AZURE_*`, as the stores' own
//! tools read them) and from `--storage-option KEY=VALUE`, which win. The values of secret
//! options (keys, tokens, passwords) are remembered so that [`redact`] can blank them in logs,
//! errors and anything recorded in the lake.

use std::collections::BTreeMap;
use std::sync::{Arc, Once, RwLock};

use anyhow::{Context, Result};
use object_store::path::Path as ObjectPath;
use object_store::ObjectStore;
use url::Url;

/// The environment variables that configure object stores.
const ENV_PREFIXES: [&str; 3] = ["AWS_", "GOOGLE_", "AZURE_"];

/// Parts of an option's name that make its value a secret.
const SECRET_MARKERS: [&str; 7] = ["secret", "token", "password", "account_key", "service_account", "sas", "signature"];

/// The storage options for a lake: the environment's store variables, lower-cased as the
/// stores accept them, with `given` over them.
pub fn options(given: &[(String, String)]) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = std::env::vars()
        .filter(|(k, _)| ENV_PREFIXES.iter().any(|p| k.starts_with(p)))
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .collect();
    for (k, v) in given {
        out.insert(k.to_ascii_lowercase(), v.clone());
    }
    for (k, v) in &out {
        if is_secret(k) {
            remember_secret(v);
        }
    }
    out
}

/// Whether the value of option `key` is a credential.
pub fn is_secret(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    SECRET_MARKERS.iter().any(|m| k.contains(m))
}

static SECRETS: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// Remembers a secret value, so that [`redact`] blanks it wherever it would be shown.
pub fn remember_secret(value: &str) {
    // Very short values would blank ordinary text; no real credential is that short.
    if value.len() < 4 {
        return;
    }
    let mut s = SECRETS.write().unwrap_or_else(|e| e.into_inner());
    if !s.iter().any(|x| x == value) {
        s.push(value.to_string());
    }
}

/// `text` with every remembered secret replaced by `***`.
pub fn redact(text: &str) -> String {
    let secrets = SECRETS.read().unwrap_or_else(|e| e.into_inner());
    let mut out = text.to_string();
    for s in secrets.iter() {
        if out.contains(s.as_str()) {
            out = out.replace(s.as_str(), "***");
        }
    }
    out
}

/// Registers deltalake's handlers for the cloud stores, once per process.
pub fn register_handlers() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        deltalake::aws::register_handlers(None);
        deltalake::gcp::register_handlers(None);
        deltalake::azure::register_handlers(None);
    });
}

/// The store a URL names and the path of the URL inside it.
pub fn open(url: &Url, options: &BTreeMap<String, String>) -> Result<(Arc<dyn ObjectStore>, ObjectPath)> {
    let (store, path) = object_store::parse_url_opts(url, options.clone())
        .with_context(|| format!("opening the store of {}", display_url(url)))?;
    Ok((Arc::from(store), path))
}

/// A URL as it may be shown: without user, password or query (where signed URLs keep tokens).
pub fn display_url(url: &Url) -> String {
    let mut u = url.clone();
    let _ = u.set_username("");
    let _ = u.set_password(None);
    u.set_query(None);
    u.to_string()
}

/// Downloads the objects a store glob names (`s3://bucket/lake/shards/seed/*.parquet`) into
/// `dir`, keeping their file names, and returns the glob of the copies: how readers that take
/// local paths (the trainer, the reward scorer) read shards and rollouts from a store. A plain
/// path is returned as it is.
pub async fn fetch_glob(pattern: &str, given: &[(String, String)], dir: &std::path::Path) -> Result<String> {
    if !pattern.contains("://") || pattern.starts_with("file://") {
        return Ok(pattern.strip_prefix("file://").unwrap_or(pattern).to_string());
    }
    register_handlers();
    let wild = pattern.find(['*', '?', '[']).unwrap_or(pattern.len());
    let base_end = pattern[..wild].rfind('/').map_or(0, |i| i + 1);
    let (base, name_glob) = pattern.split_at(base_end);
    if name_glob.contains('/') {
        anyhow::bail!("{pattern}: only the file name may hold wildcards in a store URL");
    }
    let url = Url::parse(base).with_context(|| format!("{base:?} is not a URL"))?;
    let opts = options(given);
    let (store, prefix) = open(&url, &opts)?;
    let matcher = glob::Pattern::new(if name_glob.is_empty() { "*" } else { name_glob })
        .with_context(|| format!("{name_glob:?} is not a glob"))?;
    let listed: Vec<object_store::ObjectMeta> = store
        .list_with_delimiter(Some(&prefix))
        .await
        .with_context(|| format!("listing {}", display_url(&url)))?
        .objects;
    std::fs::create_dir_all(dir)?;
    let mut n = 0;
    for meta in listed {
        let Some(name) = meta.location.filename().map(str::to_string) else { continue };
        if !matcher.matches(&name) {
            continue;
        }
        download(store.as_ref(), &meta.location, &dir.join(&name), &format!("{base}{name}")).await?;
        n += 1;
    }
    if n == 0 {
        anyhow::bail!("no object matches {}", display_url(&url).trim_end_matches('/').to_string() + "/" + name_glob);
    }
    tracing::info!(files = n, from = %display_url(&url), "fetched from the store");
    Ok(format!("{}/{}", dir.display(), if name_glob.is_empty() { "*" } else { name_glob }))
}

/// Downloads of one object before giving up.
pub const DOWNLOAD_ATTEMPTS: u32 = 5;

/// Copies object `path` of `store` to the file `local`, streamed (memory stays bounded
/// whatever the size). A copy cut by a transient error (a 5xx the client's own retries did not
/// outlast, a timeout, a connection reset mid-body) is started again, up to
/// [`DOWNLOAD_ATTEMPTS`] times with backoff; a 4xx (missing, forbidden) is not. `what` names
/// the object in messages.
pub async fn download(store: &dyn ObjectStore, path: &ObjectPath, local: &std::path::Path, what: &str) -> Result<()> {
    let mut attempt = 1;
    loop {
        match copy_once(store, path, local).await {
            Ok(()) => return Ok(()),
            Err(Copy::Store(e)) if transient(&e) && attempt < DOWNLOAD_ATTEMPTS => {
                tracing::warn!(source = %redact(what), attempt, error = %redact(&e.to_string()), "download failed; retrying");
                tokio::time::sleep(std::time::Duration::from_millis(250 << attempt)).await;
                attempt += 1;
            }
            Err(Copy::Store(e)) => {
                return Err(anyhow::Error::new(e).context(format!("fetching {what} (attempt {attempt})")))
            }
            Err(Copy::Local(e)) => return Err(anyhow::Error::new(e).context(format!("writing {}", local.display()))),
        }
    }
}

enum Copy {
    Store(object_store::Error),
    Local(std::io::Error),
}

async fn copy_once(
    store: &dyn ObjectStore,
    path: &ObjectPath,
    local: &std::path::Path,
) -> std::result::Result<(), Copy> {
    use futures::StreamExt;
    use object_store::ObjectStoreExt;
    use tokio::io::AsyncWriteExt;
    let mut file = tokio::fs::File::create(local).await.map_err(Copy::Local)?;
    let mut stream = store.get(path).await.map_err(Copy::Store)?.into_stream();
    while let Some(chunk) = stream.next().await {
        file.write_all(&chunk.map_err(Copy::Store)?).await.map_err(Copy::Local)?;
    }
    // A tokio file writes in the background: without a flush the tail may be lost.
    file.flush().await.map_err(Copy::Local)
}

/// Whether a store error may go away by itself: not a missing, forbidden or invalid request.
fn transient(e: &object_store::Error) -> bool {
    use object_store::Error as E;
    !matches!(
        e,
        E::NotFound { .. }
            | E::PermissionDenied { .. }
            | E::Unauthenticated { .. }
            | E::InvalidPath { .. }
            | E::NotSupported { .. }
            | E::NotImplemented { .. }
            | E::Precondition { .. }
            | E::NotModified { .. }
            | E::UnknownConfigurationKey { .. }
    ) && !e.to_string().contains("status code: 4")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_values_are_blanked_and_others_kept() {
        let o = options(&[
            ("AWS_SECRET_ACCESS_KEY".into(), "sentinel-7f3a-secret".into()),
            ("aws_region".into(), "us-east-1".into()),
        ]);
        assert_eq!(o["aws_secret_access_key"], "sentinel-7f3a-secret");
        let msg = "failed with key sentinel-7f3a-secret in us-east-1";
        assert_eq!(redact(msg), "failed with key *** in us-east-1");
        assert!(is_secret("azure_storage_account_key") && is_secret("aws_session_token"));
        assert!(!is_secret("aws_endpoint") && !is_secret("aws_allow_http"));
        let u = Url::parse("s3://user:pw@bucket/lake?X-Amz-Signature=abc").unwrap();
        assert_eq!(display_url(&u), "s3://bucket/lake");
    }
}
