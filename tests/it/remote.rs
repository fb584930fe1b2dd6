//! Ingest from remote sources through real servers on loopback: a minimal HTTP file server
//! (GH Archive's own layout: hour files under a URL prefix, no listing) and an S3-compatible
//! server (moto, `pip install 'moto[server]'`).

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};

use object_store::ObjectStoreExt;
use swelake::ingest::{run as ingest, source::Hour};
use swelake::lake::Lake;

use crate::common::{count, gharchive, quiet_ingest, read_lines};

/// Serves files of `root` over HTTP/1.1 until the test process ends; returns the base URL.
fn serve_dir(root: PathBuf) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let root = root.clone();
            std::thread::spawn(move || serve_one(stream, &root));
        }
    });
    format!("http://{addr}/")
}

fn serve_one(mut stream: TcpStream, root: &Path) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    loop {
        let mut request = String::new();
        if reader.read_line(&mut request).unwrap_or(0) == 0 {
            return;
        }
        // Drain the headers.
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                break;
            }
        }
        let path = request.split_whitespace().nth(1).unwrap_or("/").trim_start_matches('/').to_string();
        let head = request.starts_with("HEAD");
        match std::fs::read(root.join(&path)) {
            Ok(body) => {
                let _ = write!(stream, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
                if !head {
                    let _ = stream.write_all(&body);
                }
            }
            Err(_) => {
                let _ = write!(stream, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
            }
        }
    }
}

fn write_hours(dir: &Path) -> Vec<(String, usize)> {
    let lines = read_lines(&gharchive("2015-01-01-15.json.gz"));
    let mut out = Vec::new();
    for (i, chunk) in lines.chunks(300).take(2).enumerate() {
        let name = format!("2015-01-01-{}.json.gz", 15 + i);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        for l in chunk {
            writeln!(gz, "{l}").unwrap();
        }
        std::fs::write(dir.join(&name), gz.finish().unwrap()).unwrap();
        out.push((name, chunk.len()));
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn http_prefix_with_hour_range_and_a_missing_hour() {
    let dir = tempfile::tempdir().unwrap();
    let served = dir.path().join("www");
    std::fs::create_dir(&served).unwrap();
    let hours = write_hours(&served);
    let url = serve_dir(served);
    let lake = Lake::open(dir.path().join("lake").to_str().unwrap()).unwrap();

    // Hours 15 and 16 exist; 17 does not (GH Archive has such gaps).
    let mut opts = quiet_ingest(Path::new(&url));
    opts.source = url.clone();
    opts.from = Hour::parse("2015-01-01-15");
    opts.to = Hour::parse("2015-01-01-17");
    let s = ingest(&lake, &opts).await.unwrap();
    assert_eq!((s.files_ingested, s.files_failed), (2, 1), "{:?}", s.files);
    assert!(!s.ok());
    let failed = s.files.iter().find(|f| f.error.is_some()).unwrap();
    assert_eq!(failed.key, "2015-01-01-17");
    assert_eq!(count(&lake, "SELECT count(*) FROM events").await, (hours[0].1 + hours[1].1) as i64);
    assert_eq!(count(&lake, "SELECT count(*) FROM _job_runs WHERE status = 'failed'").await, 1);

    // A rerun skips what is done and tries the missing hour again.
    let again = ingest(&lake, &opts).await.unwrap();
    assert_eq!((again.files_skipped, again.files_failed), (2, 1));

    // Without a range an HTTP prefix cannot be listed: a clear error.
    let mut bare = quiet_ingest(Path::new(&url));
    bare.source = url;
    let err = ingest(&lake, &bare).await.unwrap_err().to_string();
    assert!(err.contains("--from and --to"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn s3_prefix_is_listed_and_ingested() {
    let (_moto, endpoint) = crate::common::s3_server();
    crate::common::create_bucket(&endpoint, "archive");
    let options: Vec<(String, String)> = [
        ("aws_endpoint", endpoint.as_str()),
        ("aws_allow_http", "true"),
        ("aws_access_key_id", "test"),
        ("aws_secret_access_key", "test"),
        ("aws_region", "us-east-1"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();

    let dir = tempfile::tempdir().unwrap();
    let hours = write_hours(dir.path());
    let url = url::Url::parse("s3://archive/gharchive/").unwrap();
    let (store, _) = object_store::parse_url_opts(&url, options.clone()).unwrap();
    for (name, _) in &hours {
        let bytes = std::fs::read(dir.path().join(name)).unwrap();
        store.put(&object_store::path::Path::from(format!("gharchive/{name}")), bytes.into()).await.unwrap();
    }

    let lake = Lake::open(dir.path().join("lake").to_str().unwrap()).unwrap();
    let mut opts = quiet_ingest(dir.path());
    opts.source = url.to_string();
    opts.storage_options = options;
    let s = ingest(&lake, &opts).await.unwrap();
    assert!(s.ok(), "{:?}", s.files);
    assert_eq!(s.files_ingested, 2);
    assert_eq!(count(&lake, "SELECT count(*) FROM events").await, (hours[0].1 + hours[1].1) as i64);
    assert_eq!(count(&lake, "SELECT count(DISTINCT source_file) FROM events").await, 2);
}

/// Serves `body` as `2015-01-01-15.json.gz` badly at first — a 503, then a connection cut
/// mid-body — then well; `2015-01-01-16.json.gz` is always 403. Counts the requests per path.
fn serve_flaky(body: Vec<u8>) -> (String, std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
    let counter = hits.clone();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request = String::new();
            if reader.read_line(&mut request).unwrap_or(0) == 0 {
                continue;
            }
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                    break;
                }
            }
            let path = request.split_whitespace().nth(1).unwrap_or("/").trim_start_matches('/').to_string();
            let n = {
                let mut m = counter.lock().unwrap();
                let e = m.entry(path.clone()).or_insert(0);
                *e += 1;
                *e
            };
            let close = "Connection: close\r\n";
            match (path.as_str(), n) {
                ("2015-01-01-15.json.gz", 1) => {
                    let _ = write!(stream, "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n{close}\r\n");
                }
                ("2015-01-01-15.json.gz", 2) => {
                    let _ = write!(stream, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n{close}\r\n", body.len());
                    let _ = stream.write_all(&body[..body.len() / 2]);
                }
                ("2015-01-01-15.json.gz", _) => {
                    let _ = write!(stream, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n{close}\r\n", body.len());
                    let _ = stream.write_all(&body);
                }
                _ => {
                    let _ = write!(stream, "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n{close}\r\n");
                }
            }
        }
    });
    (format!("http://{addr}/"), hits)
}

#[tokio::test(flavor = "multi_thread")]
async fn transient_http_errors_are_retried_and_4xx_are_not() {
    let body = std::fs::read(gharchive("2015-01-01-15.json.gz")).unwrap();
    let lines = read_lines(&gharchive("2015-01-01-15.json.gz")).len() as i64;
    let (url, hits) = serve_flaky(body);
    let dir = tempfile::tempdir().unwrap();
    let lake = Lake::open(dir.path().join("lake").to_str().unwrap()).unwrap();
    let mut opts = quiet_ingest(Path::new(&url));
    opts.source = url;
    opts.from = Hour::parse("2015-01-01-15");
    opts.to = Hour::parse("2015-01-01-16");
    let s = ingest(&lake, &opts).await.unwrap();
    // The 503 and the cut body were outlasted; the 403 failed at once, without retries.
    assert_eq!((s.files_ingested, s.files_failed), (1, 1), "{:?}", s.files);
    assert_eq!(
        count(&lake, "SELECT count(*) FROM events").await + count(&lake, "SELECT count(*) FROM events_rejected").await,
        lines
    );
    let hits = hits.lock().unwrap().clone();
    assert!(hits["2015-01-01-15.json.gz"] >= 3, "{hits:?}");
    assert_eq!(hits["2015-01-01-16.json.gz"], 1, "a 4xx is not retried: {hits:?}");
}
