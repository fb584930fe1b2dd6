//! Where hour files come from: a local file, directory or glob, or a URL prefix on any store
//! `object_store` speaks (`s3://`, `gs://`, `az://`, `file://`) or plain HTTP(S).
//!
//! Every source file gets a *key*: its GH Archive hour (`2015-01-01-15`) when the name
//! follows the archive's `YYYY-MM-DD-H.json[.gz]` pattern, else its file stem. The key is the
//! unit of idempotency: re-ingesting a key replaces exactly the rows that key produced.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use url::Url;

pub use crate::archive::Hour;

/// One file to ingest.
#[derive(Debug, Clone)]
pub struct SourceFile {
    /// Idempotency key (see module docs).
    pub key: String,
    /// The file name, for messages and the `source_file` column.
    pub name: String,
    pub location: Location,
    pub hour: Option<Hour>,
    pub size: Option<u64>,
}

#[derive(Debug, Clone)]
pub enum Location {
    Local(PathBuf),
    Remote { store: Arc<dyn ObjectStore>, path: ObjectPath, url: String },
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Local(p) => write!(f, "{}", p.display()),
            Location::Remote { url, .. } => write!(f, "{url}"),
        }
    }
}

fn is_hour_file_name(name: &str) -> bool {
    name.ends_with(".json.gz") || name.ends_with(".json") || name.ends_with(".ndjson") || name.ends_with(".ndjson.gz")
}

/// The key and hour of a file name: `2015-01-01-15.json.gz` → (`2015-01-01-15`, that hour).
pub fn key_of(name: &str) -> (String, Option<Hour>) {
    let stem = name.trim_end_matches(".gz").trim_end_matches(".ndjson").trim_end_matches(".json");
    match Hour::parse(stem) {
        Some(h) => (h.key(), Some(h)),
        None => {
            let clean: String =
                stem.chars().map(|c| if c.is_ascii_alphanumeric() || "-_".contains(c) { c } else { '_' }).collect();
            (clean, None)
        }
    }
}

fn in_range(hour: Option<Hour>, from: Option<Hour>, to: Option<Hour>) -> bool {
    match hour {
        Some(h) => from.is_none_or(|f| h >= f) && to.is_none_or(|t| h <= t),
        // Files without an hour in their name are only taken when no range is asked for.
        None => from.is_none() && to.is_none(),
    }
}

fn local_file(path: PathBuf) -> Result<SourceFile> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{}: not a file name", path.display()))?
        .to_string();
    let (key, hour) = key_of(&name);
    let size = std::fs::metadata(&path).with_context(|| format!("reading {}", path.display()))?.len();
    Ok(SourceFile { key, name, location: Location::Local(path), hour, size: Some(size) })
}

/// Options for object stores (`aws_endpoint`, `aws_access_key_id`, ...): the ones given, or
/// else every environment variable (the store picks the keys it knows, e.g. `AWS_*`).
pub fn store_options(given: &[(String, String)]) -> Vec<(String, String)> {
    if given.is_empty() {
        std::env::vars().map(|(k, v)| (k.to_ascii_lowercase(), v)).collect()
    } else {
        given.to_vec()
    }
}

/// Resolves `--source` into the list of hour files, sorted by hour then name.
pub async fn list_sources(
    src: &str,
    from: Option<Hour>,
    to: Option<Hour>,
    options: &[(String, String)],
) -> Result<Vec<SourceFile>> {
    let mut files = if let Ok(url) =
        Url::parse(src).map_err(|_| ()).and_then(|u| if u.scheme().len() > 1 { Ok(u) } else { Err(()) })
    {
        list_url(&url, from, to, options).await?
    } else if src.contains(['*', '?', '[']) {
        let mut out = Vec::new();
        for entry in glob::glob(src).with_context(|| format!("invalid glob {src:?}"))? {
            let path = entry?;
            if path.is_file() {
                out.push(local_file(path)?);
            }
        }
        if out.is_empty() {
            bail!("no files match {src:?}");
        }
        out
    } else {
        let path = Path::new(src);
        if path.is_dir() {
            let mut out = Vec::new();
            for entry in std::fs::read_dir(path).with_context(|| format!("listing {}", path.display()))? {
                let p = entry?.path();
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                if p.is_file() && is_hour_file_name(name) {
                    out.push(local_file(p)?);
                }
            }
            out
        } else if path.is_file() {
            vec![local_file(path.to_path_buf())?]
        } else {
            bail!("source {src:?} is not a file, directory, glob or URL");
        }
    };
    files.retain(|f| in_range(f.hour, from, to));
    files.sort_by(|a, b| a.hour.cmp(&b.hour).then_with(|| a.name.cmp(&b.name)));
    // Two files for one key (say `x.json` and `x.json.gz`) would replace each other's rows.
    for w in files.windows(2) {
        if w[0].key == w[1].key {
            bail!("{} and {} are the same hour ({}); keep one of them", w[0].location, w[1].location, w[0].key);
        }
    }
    Ok(files)
}

async fn list_url(
    url: &Url,
    from: Option<Hour>,
    to: Option<Hour>,
    options: &[(String, String)],
) -> Result<Vec<SourceFile>> {
    let is_http = matches!(url.scheme(), "http" | "https");
    let last = url.path_segments().and_then(|mut s| s.next_back()).unwrap_or_default().to_string();
    if is_http {
        // HTTP servers (data.gharchive.org among them) cannot list: a single file, or the
        // hours of --from..--to under the prefix.
        if is_hour_file_name(&last) {
            let (base, name) = url.as_str().rsplit_once('/').context("URL without a path")?;
            let store = http_store(base)?;
            let (key, hour) = key_of(name);
            return Ok(vec![SourceFile {
                key,
                name: name.to_string(),
                location: Location::Remote { store, path: ObjectPath::from(name), url: url.to_string() },
                hour,
                size: None,
            }]);
        }
        let (Some(from), Some(to)) = (from, to) else {
            bail!("an HTTP(S) source cannot be listed: give --from and --to (hours YYYY-MM-DD-H) to fetch {url}YYYY-MM-DD-H.json.gz");
        };
        let base = url.as_str().trim_end_matches('/');
        let store = http_store(base)?;
        let mut out = Vec::new();
        let mut h = from;
        while h <= to {
            let name = format!("{}.json.gz", h.key());
            out.push(SourceFile {
                key: h.key(),
                name: name.clone(),
                location: Location::Remote {
                    store: store.clone(),
                    path: ObjectPath::from(name.as_str()),
                    url: format!("{base}/{name}"),
                },
                hour: Some(h),
                size: None,
            });
            h = h.next();
        }
        return Ok(out);
    }
    let (store, prefix) =
        object_store::parse_url_opts(url, store_options(options)).with_context(|| format!("opening {url}"))?;
    let store: Arc<dyn ObjectStore> = Arc::from(store);
    if is_hour_file_name(&last) {
        let meta = store.head(&prefix).await.with_context(|| format!("reading {url}"))?;
        let (key, hour) = key_of(&last);
        return Ok(vec![SourceFile {
            key,
            name: last,
            location: Location::Remote { store, path: prefix, url: url.to_string() },
            hour,
            size: Some(meta.size),
        }]);
    }
    let mut out = Vec::new();
    let mut listing = store.list(Some(&prefix));
    while let Some(meta) = listing.next().await {
        let meta = meta.with_context(|| format!("listing {url}"))?;
        let name = meta.location.filename().unwrap_or_default().to_string();
        if !is_hour_file_name(&name) {
            continue;
        }
        let (key, hour) = key_of(&name);
        let file_url = format!("{}/{name}", url.as_str().trim_end_matches('/'));
        out.push(SourceFile {
            key,
            name,
            location: Location::Remote { store: store.clone(), path: meta.location.clone(), url: file_url },
            hour,
            size: Some(meta.size),
        });
    }
    Ok(out)
}

fn http_store(base: &str) -> Result<Arc<dyn ObjectStore>> {
    // A plain http:// source was asked for explicitly, so allow it (object_store refuses
    // unencrypted HTTP unless told otherwise).
    let client = object_store::ClientOptions::new().with_allow_http(base.starts_with("http://"));
    let store = object_store::http::HttpBuilder::new()
        .with_url(base)
        .with_client_options(client)
        .build()
        .with_context(|| format!("opening {base}"))?;
    Ok(Arc::new(store))
}

/// Makes `source` available as a local file: itself when local, else a download into `dir`
/// (streamed, and started again after a transient error: see [`crate::lake::store::download`]).
pub async fn fetch(source: &SourceFile, dir: &Path) -> Result<PathBuf> {
    match &source.location {
        Location::Local(p) => Ok(p.clone()),
        Location::Remote { store, path, url } => {
            let local = dir.join(&source.name);
            crate::lake::store::download(store.as_ref(), path, &local, url).await?;
            Ok(local)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_hours() {
        assert_eq!(key_of("2015-01-01-15.json.gz").0, "2015-01-01-15");
        assert_eq!(key_of("2015-01-01-05.json").0, "2015-01-01-5", "padded hours normalise");
        assert!(key_of("2015-01-01-15.json.gz").1.is_some());
        assert_eq!(key_of("my sample.json"), ("my_sample".to_string(), None));
        assert!(Hour::parse("2015-01-01-24").is_none());
        assert!(Hour::parse("2015-01-01-1") < Hour::parse("2015-01-01-10"));
        assert_eq!(Hour::parse("2015-01-01-23").unwrap().next().key(), "2015-01-02-0");
    }
}
