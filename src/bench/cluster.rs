//! What the benchmarks start on loopback and stop when dropped: moto's S3 server, and a
//! Ballista scheduler with executors (this binary's `ballista` subcommands).

use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

/// A moto server started by the benchmark, stopped when dropped.
pub(super) struct LocalS3(std::process::Child);

impl Drop for LocalS3 {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(super) fn start_moto() -> Result<(LocalS3, String)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let child = Command::new("moto_server")
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("starting moto_server")?;
    let guard = LocalS3(child);
    let deadline = Instant::now() + std::time::Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!("moto_server did not start");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    Ok((guard, format!("http://127.0.0.1:{port}")))
}

/// Creates a bucket on an S3-compatible endpoint that takes unsigned requests (moto, MinIO
/// in anonymous mode).
pub(super) fn create_bucket(endpoint: &str, bucket: &str) -> Result<()> {
    let addr = endpoint.trim_start_matches("http://").trim_end_matches('/');
    let mut s = std::net::TcpStream::connect(addr).with_context(|| format!("connecting to {endpoint}"))?;
    write!(s, "PUT /{bucket} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")?;
    let mut response = String::new();
    s.read_to_string(&mut response)?;
    if !(response.starts_with("HTTP/1.1 200") || response.contains("BucketAlreadyOwnedByYou")) {
        bail!("creating bucket {bucket}: {}", response.lines().next().unwrap_or(""));
    }
    Ok(())
}

/// Scheduler and executors on loopback, killed on drop.
pub(super) struct LoopbackCluster(pub(super) Vec<std::process::Child>, pub(super) String);

impl Drop for LoopbackCluster {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub(super) fn free_port() -> Result<u16> {
    loop {
        let a = std::net::TcpListener::bind("127.0.0.1:0")?;
        let p = a.local_addr()?.port();
        if p < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", p + 1)).is_ok() {
            return Ok(p);
        }
    }
}

pub(super) fn wait_port(port: u16) -> Result<()> {
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!("nothing listened on 127.0.0.1:{port} within 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    Ok(())
}

pub(super) fn start_loopback(exe: &Path, executors: usize, work: &Path) -> Result<LoopbackCluster> {
    let quiet = || std::process::Stdio::null();
    let port = free_port()?;
    let mut c = LoopbackCluster(Vec::new(), format!("df://127.0.0.1:{port}"));
    c.0.push(
        Command::new(exe)
            .args(["-q", "ballista", "scheduler", "--bind", &format!("127.0.0.1:{port}")])
            .stdout(quiet())
            .stderr(quiet())
            .spawn()?,
    );
    wait_port(port)?;
    for i in 0..executors {
        let p = free_port()?;
        c.0.push(
            Command::new(exe)
                .args(["-q", "ballista", "executor", "--scheduler", &format!("127.0.0.1:{port}")])
                .args(["--bind", &format!("127.0.0.1:{p}"), "--concurrent-tasks", "1"])
                .arg("--work-dir")
                .arg(work.join(format!("executor-{i}")))
                .stdout(quiet())
                .stderr(quiet())
                .spawn()?,
        );
        wait_port(p)?;
    }
    Ok(c)
}
