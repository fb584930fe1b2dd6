//! A Rust tree's environment: its dependency graph — the committed `Cargo.lock` at the merge
//! base, else resolved once by cargo for the PR (crates.io has no publish-date cut-off such as
//! uv's `--exclude-newer`: resolved on the day it was first asked, MSRV-aware, recorded) — and
//! the sources of every crate in it, vendored by `cargo vendor` outside the sandbox (it
//! downloads and unpacks; no `build.rs` or proc macro runs) into one directory shared by every
//! environment. The environment's key is the graph's hash; its target directory (one per key,
//! reused by every PR of that graph) is written by one run at a time.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use super::run::CargoTest;
use super::CrateSpec;
use crate::verify::sandbox::{self, Mounts, Sandbox};
use crate::verify::toolchain::{build_once, key_of, lock_file, Env, EnvRow, Tools};

/// The host's cargo and rustc (the toolchain rustup or the system installed; a
/// `rust-toolchain` file of a tree is not followed).
#[derive(Debug, Clone)]
pub struct RustTools {
    pub cargo: PathBuf,
    pub rustc: PathBuf,
    /// The toolchain's directory (mounted read-only into the sandbox).
    pub sysroot: PathBuf,
    /// `rustc 1.95.0 (… 2026-…)`.
    pub version: String,
}

impl RustTools {
    /// cargo and rustc on PATH, or why not. Through rustup's proxies they are resolved to the
    /// toolchain's own binaries, so a run needs neither rustup nor its home.
    pub fn probe() -> std::result::Result<RustTools, String> {
        let cargo_on_path = sandbox::which("cargo").ok_or("cargo is not installed here (no `cargo` on PATH)")?;
        let rustc_on_path = sandbox::which("rustc").ok_or("rustc is not installed here (no `rustc` on PATH)")?;
        let ask = |args: &[&str]| -> std::result::Result<String, String> {
            let out = Command::new(&rustc_on_path)
                .args(args)
                .current_dir("/")
                .stdin(Stdio::null())
                .output()
                .map_err(|e| format!("rustc does not run: {e}"))?;
            let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if !out.status.success() || text.is_empty() {
                return Err(format!(
                    "rustc {} failed: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            Ok(text)
        };
        let sysroot = PathBuf::from(ask(&["--print", "sysroot"])?);
        let version = ask(&["-V"])?;
        let own = |name: &str, fallback: &Path| {
            let p = sysroot.join("bin").join(name);
            if p.is_file() {
                p
            } else {
                std::fs::canonicalize(fallback).unwrap_or(fallback.to_path_buf())
            }
        };
        Ok(RustTools { cargo: own("cargo", &cargo_on_path), rustc: own("rustc", &rustc_on_path), sysroot, version })
    }

    /// `1.95.0`.
    pub fn release(&self) -> &str {
        self.version.split_whitespace().nth(1).unwrap_or("")
    }

    /// cargo outside the sandbox, for `cargo vendor`: only what it needs (the user's proxies,
    /// PATH for git) and a home of the verify directory's, never the user's credentials.
    fn cargo(&self, home: &Path, cwd: &Path) -> Command {
        let mut c = Command::new(&self.cargo);
        c.env_clear().current_dir(cwd).stdin(Stdio::null());
        for k in ["PATH", "HOME", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"] {
            if let Some(v) = std::env::var_os(k) {
                c.env(k, v);
            }
        }
        c.env("CARGO_HOME", home)
            .env("RUSTC", &self.rustc)
            .env("CARGO_TERM_COLOR", "never")
            .env("CARGO_TERM_PROGRESS_WHEN", "never")
            // Without a lock, the newest versions whose `rust-version` the workspace's own
            // allows: what the PR's day could build.
            .env("CARGO_RESOLVER_INCOMPATIBLE_RUST_VERSIONS", "fallback");
        c
    }
}

/// A tree's resolved graph: the lock a run puts in the tree, cargo's source configuration for
/// the vendored sources, and the day it was resolved (when no lock was committed).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Resolution {
    lock: String,
    config: String,
    resolved_on: Option<String>,
}

/// The environment of `spec`, vendored or taken from the cache; `Err(row)` says why not.
pub fn prepare(
    repo: &str,
    spec: &CrateSpec,
    as_of: &str,
    rust: &RustTools,
    tools: &Tools,
    sandbox: &Sandbox,
) -> std::result::Result<Env, Box<EnvRow>> {
    let started = Instant::now();
    let mut row = EnvRow::new(repo, "rust", rust.version.clone(), &spec.files, spec.requirements.clone(), as_of);
    row.relaxed.push(format!("lints capped at warn: rustc {} denies lints the PR's day did not have", rust.release()));
    if let Some((file, channel)) = &spec.toolchain_file {
        row.relaxed.push(format!("{file} asks for {channel}: the host's rustc {} is used", rust.release()));
    }
    let root = tools.root.join("rust");
    let res = match resolve(rust, spec, &root) {
        Ok(r) => r,
        Err(e) => return row.failed(&format!("{e:#}")),
    };
    match (&spec.lock, &res.resolved_on) {
        (Some(committed), _) => {
            row.resolved_as_of = "Cargo.lock (committed)".into();
            if lock_packages(committed) != lock_packages(&res.lock) {
                row.relaxed.push("the committed Cargo.lock does not match the manifests: cargo updated it".into());
            }
        }
        (None, day) => {
            let day = day.clone().unwrap_or_default();
            row.relaxed.push(format!(
                "no Cargo.lock committed: resolved on {day} (crates.io has no publish-date cut-off), the newest \
                 versions the workspace's rust-version allows"
            ));
            row.resolved_as_of = day;
        }
    }
    row.packages = lock_packages(&res.lock);
    let key = key_of(&format!("rust\n{}\n{}", rust.version, row.packages.join("\n")));
    let dir = root.join("env").join(&key);
    let vendor = root.join("vendor");
    let built = build_once(
        &dir,
        || {
            std::fs::write(dir.join("config.toml"), &res.config)?;
            Ok(())
        },
        || probe(rust, sandbox, &dir, &vendor),
    );
    match built {
        Ok(fresh) => {
            row.env_key = key.clone();
            row.status = "ready".into();
            row.seconds = if fresh { started.elapsed().as_secs_f64() } else { 0.0 };
            let runner = CargoTest {
                rust: rust.clone(),
                env_dir: dir.clone(),
                vendor,
                target: root.join("target").join(&key),
                lock: Arc::new(res.lock),
                members: spec.members.clone(),
                target_mb: tools.cfg.rust_target_mb,
            };
            Ok(Env { key, dir, row, runner: Arc::new(runner) })
        }
        Err(e) => row.failed(&format!("{e:#}")),
    }
}

/// `name==version` of every crate of a lock that comes from a registry or git (the tree's own
/// packages left out: a PR bumping its own version keeps its environment), sorted.
pub fn lock_packages(lock: &str) -> Vec<String> {
    let Ok(doc) = lock.parse::<toml::Table>() else { return Vec::new() };
    let mut out: BTreeSet<String> = BTreeSet::new();
    for p in doc.get("package").and_then(|v| v.as_array()).into_iter().flatten() {
        let field = |k: &str| p.get(k).and_then(|v| v.as_str()).unwrap_or_default();
        let source = field("source");
        if source.is_empty() {
            continue;
        }
        let from = if source.starts_with("registry+") { String::new() } else { format!(" ({source})") };
        out.insert(format!("{}=={}{from}", field("name"), field("version")));
    }
    out.into_iter().collect()
}

/// The graph of `spec`, cached by its manifests and lock (a rerun asks crates.io nothing): a
/// skeleton of the tree — its manifests, its lock, an empty file for each target — given to
/// `cargo vendor`, which resolves what the lock leaves open and unpacks every crate into the
/// shared vendor directory.
fn resolve(rust: &RustTools, spec: &CrateSpec, root: &Path) -> Result<Resolution> {
    let mut question = format!("rust\n{}\n", rust.version);
    for (path, text) in &spec.manifests {
        question.push_str(&format!("{path}\n{text}\n"));
    }
    question.push_str(&format!("{:?}\n{:?}\n", spec.declared_targets, spec.lock));
    let key = key_of(&question);
    let locks = root.join("locks");
    let cached = locks.join(format!("{key}.json"));
    let _guard = lock_file(&locks.join(format!("{key}.lock")))?;
    if let Some(r) = std::fs::read(&cached).ok().and_then(|b| serde_json::from_slice::<Resolution>(&b).ok()) {
        return Ok(r);
    }
    let skel = root.join("skel").join(&key);
    let _ = std::fs::remove_dir_all(&skel);
    let write = |rel: &str, text: &str| -> Result<()> {
        let p = skel.join(rel);
        std::fs::create_dir_all(p.parent().expect("under the skeleton"))?;
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))
    };
    for (path, text) in &spec.manifests {
        // The skeleton is a workspace of its own: cargo looks for one in the directories above,
        // and the verify directory may sit in another project's tree.
        let own = path == "Cargo.toml" && text.parse::<toml::Table>().is_ok_and(|d| !d.contains_key("workspace"));
        if own {
            write(path, &format!("{text}\n[workspace]\n"))?;
        } else {
            write(path, text)?;
        }
    }
    for t in &spec.declared_targets {
        write(t, "")?;
    }
    for m in &spec.members {
        let entry = if m.lib.is_some() { "src/lib.rs" } else { "src/main.rs" };
        let rel = if m.dir.is_empty() { entry.to_string() } else { format!("{}/{entry}", m.dir) };
        if !skel.join(&rel).exists() {
            write(&rel, "")?;
        }
    }
    if let Some(lock) = &spec.lock {
        write("Cargo.lock", lock)?;
    }
    // cargo vendor rewrites every crate's directory it vendors, even one already there: it
    // vendors into a staging directory of its own, and crates new to the shared directory are
    // moved in whole (a rename), so a run reading a crate never sees it half written.
    let vendor = root.join("vendor");
    let staging = root.join("vendor-staging").join(&key);
    let _ = std::fs::remove_dir_all(&staging);
    let out = rust
        .cargo(&root.join("cargo-home"), &skel)
        .args(["vendor", "--versioned-dirs", "--manifest-path"])
        .arg(skel.join("Cargo.toml"))
        .arg(&staging)
        .output()
        .context("starting cargo vendor")?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let first = err.lines().find(|l| l.trim_start().starts_with("error")).unwrap_or("").trim().to_string();
        let tail: Vec<&str> = err.lines().rev().take(6).collect::<Vec<_>>().into_iter().rev().collect();
        bail!("cargo vendor: {first} / {}", tail.join(" / "));
    }
    let lock = std::fs::read_to_string(skel.join("Cargo.lock")).context("cargo vendor wrote no Cargo.lock")?;
    std::fs::create_dir_all(&vendor)?;
    // Crates keep their archives' modes (fnv 1.0.7's files are 0640): the sandbox's uids read
    // every file. A graph without dependencies leaves no staging directory at all.
    if staging.exists() {
        readable_by_all(&staging).context("opening the vendored crates to the sandbox")?;
    }
    if let Ok(entries) = std::fs::read_dir(&staging) {
        for e in entries.filter_map(|e| e.ok()) {
            let to = vendor.join(e.file_name());
            // `name-version` of a registry is the same bytes wherever it was vendored.
            // Another worker may move the same crate in first: what is there stays.
            if std::fs::symlink_metadata(&to).is_err() {
                if let Err(err) = std::fs::rename(e.path(), &to) {
                    if std::fs::symlink_metadata(&to).is_err() {
                        return Err(err)
                            .with_context(|| format!("moving {} into the vendor directory", e.path().display()));
                    }
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&staging);
    let config = String::from_utf8_lossy(&out.stdout).replace(&*staging.to_string_lossy(), &vendor.to_string_lossy());
    let resolved_on = spec.lock.is_none().then(|| chrono::Utc::now().format("%Y-%m-%d").to_string());
    let r = Resolution { lock, config, resolved_on };
    let part = cached.with_extension(format!("json.{}.tmp", std::process::id()));
    std::fs::write(&part, serde_json::to_vec(&r)?)?;
    std::fs::rename(&part, &cached)?;
    let _ = std::fs::remove_dir_all(&skel);
    Ok(r)
}

/// Adds read (and, for directories and executables, search) permission for everyone under
/// `dir`, links left alone.
fn readable_by_all(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let meta = e.path().symlink_metadata()?;
        if meta.file_type().is_symlink() {
            continue;
        }
        let mode = meta.permissions().mode();
        let want = if meta.is_dir() || mode & 0o100 != 0 { mode | 0o555 } else { mode | 0o444 };
        if want != mode {
            std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(want))?;
        }
        if meta.is_dir() {
            readable_by_all(&e.path())?;
        }
    }
    Ok(())
}

/// The sandbox's mounts for a run of cargo in an environment.
pub(super) fn mounts(rust: &RustTools, env_dir: &Path, vendor: &Path) -> Vec<PathBuf> {
    vec![rust.sysroot.clone(), env_dir.to_path_buf(), vendor.to_path_buf()]
}

/// The environment a run of cargo gets (no host variable reaches it).
pub(super) fn cargo_env(rust: &RustTools, home: &Path, target: &Path) -> Vec<(String, String)> {
    let s = |p: &Path| p.to_string_lossy().to_string();
    vec![
        ("PATH".into(), format!("{}:/usr/local/bin:/usr/bin:/bin", rust.sysroot.join("bin").display())),
        ("HOME".into(), "/tmp".into()),
        ("CARGO_HOME".into(), s(home)),
        ("CARGO_TARGET_DIR".into(), s(target)),
        ("RUSTC".into(), s(&rust.rustc)),
        ("RUSTDOC".into(), s(&rust.sysroot.join("bin/rustdoc"))),
        ("CARGO_NET_OFFLINE".into(), "true".into()),
        // A lint today's rustc denies that the PR's did not have (or its `#![deny(warnings)]`
        // meeting today's warnings) is not what its tests are about.
        ("RUSTFLAGS".into(), "--cap-lints=warn".into()),
        ("CARGO_TERM_COLOR".into(), "never".into()),
        ("CARGO_TERM_PROGRESS_WHEN".into(), "never".into()),
        ("RUST_BACKTRACE".into(), "0".into()),
        ("LANG".into(), "C.UTF-8".into()),
        ("TZ".into(), "UTC".into()),
    ]
}

/// cargo starts in the sandbox with the environment's mounts.
fn probe(rust: &RustTools, sandbox: &Sandbox, dir: &Path, vendor: &Path) -> Result<()> {
    std::fs::create_dir_all(vendor)?;
    let scratch = tempfile::Builder::new().prefix("probe-").tempdir_in(dir.parent().expect("under env"))?;
    let home = scratch.path().join("home");
    std::fs::create_dir_all(&home)?;
    let log = scratch.path().join("probe.log");
    let m = Mounts {
        read_only: mounts(rust, dir, vendor),
        writable: vec![scratch.path().to_path_buf()],
        ..Default::default()
    };
    let argv = vec![rust.cargo.to_string_lossy().to_string(), "-V".into()];
    let exit = sandbox.run(
        &argv,
        scratch.path(),
        &cargo_env(rust, &home, &scratch.path().join("target")),
        &m,
        &log,
        std::time::Duration::from_secs(60),
    )?;
    if exit.code != Some(0) {
        bail!("cargo does not start in the sandbox: {}", sandbox::tail(&log, 5));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_locks_registry_and_git_crates_not_the_trees_own() {
        let lock = "version = 3\n\n[[package]]\nname = \"calc\"\nversion = \"0.3.0\"\ndependencies = [\"itoa\"]\n\n\
                    [[package]]\nname = \"itoa\"\nversion = \"1.0.11\"\nsource = \"registry+https://github.com/rust-lang/crates.io-index\"\n\
                    checksum = \"49f1f14873335454500d59611f1cf4a4b0f786f9ac11f4312a78e4cf2566695b\"\n\n\
                    [[package]]\nname = \"tiny\"\nversion = \"0.1.0\"\nsource = \"git+https://example.com/tiny#abc\"\n";
        assert_eq!(super::lock_packages(lock), ["itoa==1.0.11", "tiny==0.1.0 (git+https://example.com/tiny#abc)"]);
        assert!(super::lock_packages("not toml [").is_empty());
    }
}
