//! `bench blobs`: blob reads of the snapshot job against `git cat-file --batch` on the same list.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

#[derive(Debug, Clone)]
pub struct BlobsBenchOptions {
    /// A bare or normal git repository to read every blob of. Without it, one is made from
    /// the source files under --corpus.
    pub repo: Option<PathBuf>,
    /// Directory of real files committed into the benchmark repository (default: the
    /// datafusion sources in the cargo registry, else this project's src/).
    pub corpus: Option<PathBuf>,
    /// Working directory.
    pub work: PathBuf,
}

impl Default for BlobsBenchOptions {
    fn default() -> Self {
        BlobsBenchOptions { repo: None, corpus: None, work: PathBuf::from("target/bench-blobs") }
    }
}

pub(super) fn git(args: &[&str], dir: &Path) -> Result<Vec<u8>> {
    let out =
        Command::new("git").args(args).current_dir(dir).output().context("running git (the benchmark's baseline)")?;
    if !out.status.success() {
        bail!("git {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    }
    Ok(out.stdout)
}

/// The default corpus: every crate of the cargo registry whose name starts with `prefix`
/// (real source files, already on any machine that built swelake).
pub(super) fn default_corpus(prefix: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let registry = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .map(|h| h.join("registry/src"));
    if let Some(Ok(indexes)) = registry.map(std::fs::read_dir) {
        for idx in indexes.flatten() {
            if let Ok(crates) = std::fs::read_dir(idx.path()) {
                for c in crates.flatten() {
                    if c.file_name().to_string_lossy().starts_with(prefix) {
                        out.push(c.path());
                    }
                }
            }
        }
    }
    if out.is_empty() {
        out.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    }
    out.sort();
    out
}

/// Blobs/s reading every blob of a repository through swelake's snapshot code, next to
/// `git cat-file --batch` on the same list (the floor).
pub fn blobs(a: &BlobsBenchOptions) -> Result<()> {
    std::fs::create_dir_all(&a.work)?;
    let repo_dir = match &a.repo {
        Some(r) => r.clone(),
        None => {
            let corpus = a.corpus.clone().map(|c| vec![c]).unwrap_or_else(|| default_corpus("datafusion"));
            let dir = a.work.join("repo");
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir)?;
            println!(
                "making a repository from the files of {} director(ies), e.g. {}",
                corpus.len(),
                corpus[0].display()
            );
            git(&["init", "-q"], &dir)?;
            for c in &corpus {
                let name = c.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "corpus".into());
                let copy = Command::new("cp").arg("-r").arg(c).arg(dir.join(name)).status()?;
                if !copy.success() {
                    bail!("copying {}", c.display());
                }
            }
            git(&["add", "-A"], &dir)?;
            git(
                &["-c", "user.name=bench", "-c", "user.email=bench@example.org", "commit", "-q", "-m", "corpus"],
                &dir,
            )?;
            git(&["gc", "-q"], &dir)?;
            dir
        }
    };
    let listing = git(&["rev-list", "--objects", "--all"], &repo_dir)?;
    let oids: Vec<String> = String::from_utf8_lossy(&listing)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    let mut check = Command::new("git")
        .args(["cat-file", "--batch-check=%(objecttype) %(objectname)"])
        .current_dir(&repo_dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    check.stdin.take().context("stdin")?.write_all((oids.join("\n") + "\n").as_bytes())?;
    let out = check.wait_with_output()?;
    let blobs: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("blob ").map(str::to_string))
        .collect();
    let list = std::fs::canonicalize(&a.work)?.join("blobs.txt");
    std::fs::write(&list, blobs.join("\n") + "\n")?;
    println!("{} blobs in {}", blobs.len(), repo_dir.display());

    // Baseline: git cat-file --batch, output discarded.
    let t = Instant::now();
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!("git cat-file --batch < '{}' > /dev/null", list.display()))
        .current_dir(&repo_dir)
        .status()?;
    if !status.success() {
        bail!("git cat-file --batch failed");
    }
    let cat = t.elapsed().as_secs_f64();

    // swelake: open the repository and read every blob as the snapshot job does.
    let t = Instant::now();
    let repo = git2::Repository::open(&repo_dir)?;
    let mut bytes = 0usize;
    for b in &blobs {
        let oid = git2::Oid::from_str(b)?;
        let (content, _binary) = crate::git::read_blob(&repo, oid).map_err(|f| anyhow::anyhow!(f.message))?;
        bytes += content.len();
    }
    let ours = t.elapsed().as_secs_f64();
    let n = blobs.len() as f64;
    println!("\n{:<32} {:>9} {:>12} {:>10}", "", "seconds", "blobs/s", "MB/s");
    println!("{:<32} {cat:>9.3} {:>12.0} {:>10.0}", "git cat-file --batch (floor)", n / cat, bytes as f64 / 1e6 / cat);
    println!("{:<32} {ours:>9.3} {:>12.0} {:>10.0}", "swelake (libgit2)", n / ours, bytes as f64 / 1e6 / ours);
    println!("\nswelake / cat-file: {:.2}x (target >= 0.5x)", cat / ours);
    Ok(())
}
