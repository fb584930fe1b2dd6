//! What git knows about a pull request, through libgit2: a bare mirror per repository (cloned
//! once, fetched when commits are missing), the merge base, the changed files with rename
//! detection and per-file patches, the PR's commits, and blob contents.
//!
//! Mirrors are bare: nothing is ever checked out, so no filters, hooks or submodules run.
//! They live on local disk (a cache directory), whatever store the lake is in.

use std::path::{Path, PathBuf};

pub mod renames;
pub mod shard;

pub use shard::Shard;

use git2::{Delta, DiffOptions, FetchOptions, Oid, Patch, Repository, Sort};

/// Why something could not be read from git; `reason` is a stable code for grouping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitFailure {
    pub reason: &'static str,
    pub message: String,
}

impl GitFailure {
    fn new(reason: &'static str, message: impl Into<String>) -> Self {
        GitFailure { reason, message: message.into() }
    }
}

/// Where a lake's repositories come from and where their mirrors are kept, for every stage
/// that reads git.
#[derive(Debug, Clone)]
pub struct Mirrors {
    /// Where each repository is, with `{repo}` for `owner/name`: `file:///mirrors/{repo}.git`,
    /// `/srv/git/{repo}`, `https://github.com/{repo}.git` (https needs a libgit2 with TLS).
    pub repo_url: String,
    /// Directory of the bare mirrors (one per repository, kept between runs).
    pub cache_dir: PathBuf,
}

impl Mirrors {
    pub fn new(repo_url: impl Into<String>, cache_dir: PathBuf) -> Mirrors {
        Mirrors { repo_url: repo_url.into(), cache_dir }
    }

    /// The URL of `repo` (`owner/name`).
    pub fn url(&self, repo: &str) -> String {
        self.repo_url.replace("{repo}", repo)
    }

    /// The mirror of `repo`, cloned the first time.
    pub fn open(&self, repo: &str) -> Result<Repository, GitFailure> {
        open_mirror(&self.cache_dir, repo, &self.url(repo))
    }

    /// The mirror of `repo`, fetched again (cloned the first time).
    pub fn refresh(&self, repo: &str) -> Result<Repository, GitFailure> {
        refresh_mirror(&self.cache_dir, repo, &self.url(repo))
    }
}

/// Which repositories a git stage works on, and how: one scope for snapshots, prs_from_git
/// and relevance (`swelake run`'s `--repo-url`, `--cache-dir`, `--repos`, `--repos-file`,
/// `--shard`, `--force`).
#[derive(Debug, Clone)]
pub struct Scope {
    /// Where the repositories are and where their mirrors are kept.
    pub mirrors: Mirrors,
    /// Only these repositories (`None`: every repository of the lake).
    pub repos: Option<Vec<String>>,
    /// Only the repositories of this shard (`--shard I/N`): N workers together cover every
    /// repository exactly once.
    pub shard: Option<Shard>,
    /// Redo work that is already done.
    pub force: bool,
    /// Threads: repositories at once (snapshots, prs_from_git), encoder threads (relevance).
    pub threads: usize,
    pub show_progress: bool,
}

impl Scope {
    /// Every repository of `mirrors`, two threads, no progress bars.
    pub fn new(mirrors: Mirrors) -> Scope {
        Scope { mirrors, repos: None, shard: None, force: false, threads: 2, show_progress: false }
    }

    /// Whether `repo` is in scope (named, when repositories are named, and in the shard).
    pub fn includes(&self, repo: &str) -> bool {
        self.repos.as_ref().is_none_or(|r| r.iter().any(|x| x == repo)) && self.shard.is_none_or(|s| s.owns(repo))
    }

    /// What a run over this scope leases: the named repositories, else the shard, else all.
    pub fn lease_keys(&self) -> Vec<String> {
        match (&self.repos, &self.shard) {
            (Some(r), _) => r.clone(),
            (None, Some(s)) => vec![s.lease_key()],
            (None, None) => vec![crate::lake::runs::WHOLE.to_string()],
        }
    }
}

/// The default mirror cache: `$XDG_CACHE_HOME/swelake/mirrors` or `~/.cache/swelake/mirrors`.
pub fn default_cache_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    base.join("swelake").join("mirrors")
}

/// The refs a mirror keeps: branches, tags, and GitHub's pull-request heads and test merges.
const REFSPECS: [&str; 4] = [
    "+refs/heads/*:refs/heads/*",
    "+refs/tags/*:refs/tags/*",
    "+refs/pull/*/head:refs/pull/*/head",
    "+refs/pull/*/merge:refs/pull/*/merge",
];

/// Where the mirror of `repo_name` lives under `cache`.
pub fn mirror_path(cache: &Path, repo_name: &str) -> PathBuf {
    let safe = crate::files::path_segment(repo_name);
    cache.join(format!("{safe}.git"))
}

fn fetch(repo: &Repository, url: &str, extra: &[String]) -> Result<(), git2::Error> {
    let mut remote = repo.remote_anonymous(url)?;
    let mut specs: Vec<String> = REFSPECS.iter().map(|s| s.to_string()).collect();
    specs.extend(extra.iter().cloned());
    let mut opts = FetchOptions::new();
    opts.download_tags(git2::AutotagOption::None);
    remote.fetch(&specs, Some(&mut opts), None)?;
    // The remote's HEAD names its default branch; a bare init points HEAD at `master`, which
    // may not exist. The answer stays readable after the fetch disconnects.
    if let Ok(head) = remote.default_branch() {
        if let Some(name) = head.as_str().ok().filter(|n| n.starts_with("refs/heads/")) {
            if repo.find_reference(name).is_ok() {
                repo.set_head(name)?;
            }
        }
    }
    Ok(())
}

/// Fetches every ref of the mirror of `repo_name` again (new merges, new PR refs); the mirror
/// is cloned the first time.
pub fn refresh_mirror(cache: &Path, repo_name: &str, url: &str) -> Result<Repository, GitFailure> {
    let fresh = !mirror_path(cache, repo_name).join("HEAD").exists();
    let repo = open_mirror(cache, repo_name, url)?;
    if !fresh {
        fetch(&repo, url, &[]).map_err(|e| GitFailure::new("fetch_failed", format!("{url}: {}", e.message())))?;
    }
    Ok(repo)
}

/// The default branch of a mirror and its tip: HEAD when it names a branch that exists, else
/// the first of `main`, `master`, `develop`, `trunk` that does.
pub fn default_branch(repo: &Repository) -> Option<(String, Oid)> {
    let from_head = repo
        .find_reference("HEAD")
        .ok()
        .and_then(|h| h.symbolic_target().ok().flatten().map(str::to_string))
        .filter(|n| repo.find_reference(n).is_ok());
    let name = from_head.or_else(|| {
        ["main", "master", "develop", "trunk"]
            .iter()
            .map(|b| format!("refs/heads/{b}"))
            .find(|n| repo.find_reference(n).is_ok())
    })?;
    let tip = repo.find_reference(&name).ok()?.peel_to_commit().ok()?.id();
    Some((name.trim_start_matches("refs/heads/").to_string(), tip))
}

/// Opens the mirror of `repo_name`, creating it from `url` the first time.
pub fn open_mirror(cache: &Path, repo_name: &str, url: &str) -> Result<Repository, GitFailure> {
    let path = mirror_path(cache, repo_name);
    if path.join("HEAD").exists() {
        return Repository::open_bare(&path)
            .map_err(|e| GitFailure::new("mirror_corrupt", format!("{}: {}", path.display(), e.message())));
    }
    std::fs::create_dir_all(cache).map_err(|e| GitFailure::new("cache_unwritable", e.to_string()))?;
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let repo = Repository::init_bare(&tmp).map_err(|e| GitFailure::new("cache_unwritable", e.message().to_string()))?;
    if let Err(e) = fetch(&repo, url, &[]) {
        drop(repo);
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(GitFailure::new("clone_failed", format!("{url}: {}", e.message())));
    }
    drop(repo);
    // Only a complete first fetch becomes the mirror, so an interrupted clone is redone.
    std::fs::rename(&tmp, &path).map_err(|e| GitFailure::new("cache_unwritable", e.to_string()))?;
    Repository::open_bare(&path).map_err(|e| GitFailure::new("mirror_corrupt", e.message().to_string()))
}

fn has_commit(repo: &Repository, oid: Oid) -> bool {
    repo.find_commit(oid).is_ok()
}

/// Makes sure `shas` are in the mirror, fetching once (all refs, the PRs' refs/pull heads, and
/// the SHAs themselves where the server allows it). Returns the SHAs still missing.
pub fn ensure_commits(repo: &Repository, url: &str, shas: &[Oid], pr_numbers: &[i64]) -> Vec<Oid> {
    let missing: Vec<Oid> = shas.iter().copied().filter(|o| !has_commit(repo, *o)).collect();
    if missing.is_empty() {
        return missing;
    }
    let extra: Vec<String> = pr_numbers.iter().map(|n| format!("+refs/pull/{n}/head:refs/pull/{n}/head")).collect();
    // A remote without these refs is not an error here: what is still missing is reported.
    let _ = fetch(repo, url, &extra);
    let still: Vec<Oid> = missing.into_iter().filter(|o| !has_commit(repo, *o)).collect();
    if !still.is_empty() {
        let wants: Vec<String> = still.iter().map(|o| o.to_string()).collect();
        let _ = repo.remote_anonymous(url).and_then(|mut r| r.fetch(&wants, None, None));
    }
    shas.iter().copied().filter(|o| !has_commit(repo, *o)).collect()
}

/// One changed file of a PR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileChange {
    /// Path after the change (before it, for deletions), as stored by git (bytes).
    pub path: Vec<u8>,
    /// Path before a rename or copy.
    pub old_path: Option<Vec<u8>>,
    /// A, M, D, R, C or T (type change).
    pub status: char,
    pub old_blob: Option<Oid>,
    pub new_blob: Option<Oid>,
    pub old_mode: u32,
    pub new_mode: u32,
    pub additions: usize,
    pub deletions: usize,
    pub is_binary: bool,
    /// `git diff` of the file (header and hunks).
    pub patch: Vec<u8>,
}

fn parse_oid(s: &str) -> Result<Oid, GitFailure> {
    Oid::from_str(s).map_err(|_| GitFailure::new("bad_sha", format!("{s:?} is not a SHA")))
}

pub fn oid(s: &str) -> Result<Oid, GitFailure> {
    parse_oid(s)
}

/// The merge base of `base` and `head` and the files changed between it and `head`, as
/// `git diff -M` reports them: git's own rename decisions ([`renames`]), type changes as `T`,
/// submodule pointers (mode 160000, no blob) included.
pub fn pr_changes(repo: &Repository, base: Oid, head: Oid) -> Result<(Oid, Vec<FileChange>), GitFailure> {
    let mb = repo
        .merge_base(base, head)
        .map_err(|e| GitFailure::new("no_merge_base", format!("{base}..{head}: {}", e.message())))?;
    let tree = |o: Oid| {
        repo.find_commit(o)
            .and_then(|c| c.tree())
            .map_err(|e| GitFailure::new("corrupt_object", format!("{o}: {}", e.message())))
    };
    let (old, new) = (tree(mb)?, tree(head)?);
    let diff_err = |e: git2::Error| GitFailure::new("diff_failed", e.message().to_string());
    let mut opts = DiffOptions::new();
    opts.ignore_submodules(false).include_typechange(true);
    let diff = repo.diff_tree_to_tree(Some(&old), Some(&new), Some(&mut opts)).map_err(diff_err)?;
    let mut changes: Vec<(Vec<u8>, FileChange)> = Vec::with_capacity(diff.deltas().len());
    let (mut deleted, mut added) = (Vec::new(), Vec::new());
    let (mut deleted_at, mut added_at) = (Vec::new(), Vec::new());
    for idx in 0..diff.deltas().len() {
        let delta = diff.get_delta(idx).expect("index within deltas");
        let status = match delta.status() {
            Delta::Added => 'A',
            Delta::Deleted => 'D',
            Delta::Modified => 'M',
            Delta::Typechange => 'T',
            _ => continue,
        };
        let (of, nf) = (delta.old_file(), delta.new_file());
        let side = |f: &git2::DiffFile| renames::Side {
            path: f.path_bytes().unwrap_or_default().to_vec(),
            oid: f.id(),
            mode: u32::from(f.mode()),
        };
        match status {
            'D' => {
                deleted.push(side(&of));
                deleted_at.push(changes.len());
            }
            'A' => {
                added.push(side(&nf));
                added_at.push(changes.len());
            }
            _ => {}
        }
        let patch = Patch::from_diff(&diff, idx).map_err(diff_err)?;
        let change = file_change(status, side(&of), side(&nf), patch, delta.flags().is_binary())?;
        changes.push((change.path.clone(), change));
    }
    let found =
        renames::find(repo, &deleted, &added).map_err(|e| GitFailure::new("diff_failed", e.message().to_string()))?;
    let mut gone = vec![false; changes.len()];
    for r in found {
        let (s, d) = (&deleted[r.src], &added[r.dst]);
        let rename = rename_change(repo, s, d, r.score)?;
        gone[deleted_at[r.src]] = true;
        changes[added_at[r.dst]].1 = rename;
    }
    let mut out: Vec<(Vec<u8>, FileChange)> =
        changes.into_iter().zip(gone).filter(|(_, g)| !g).map(|(c, _)| c).collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok((mb, out.into_iter().map(|(_, c)| c).collect()))
}

const GITLINK: u32 = 0o160000;

/// A change that is not a rename, from libgit2's patch of it.
fn file_change(
    status: char,
    old: renames::Side,
    new: renames::Side,
    patch: Option<Patch>,
    is_binary: bool,
) -> Result<FileChange, GitFailure> {
    let diff_err = |e: git2::Error| GitFailure::new("diff_failed", e.message().to_string());
    // A submodule's "blob" is a commit of another repository: there is no content here.
    let blob = |s: &renames::Side| (!s.oid.is_zero() && s.mode != GITLINK).then_some(s.oid);
    let (additions, deletions, text) = match patch {
        Some(mut p) => {
            let (_, a, d) = p.line_stats().map_err(diff_err)?;
            (a, d, p.to_buf().map_err(diff_err)?.to_vec())
        }
        None => (0, 0, Vec::new()),
    };
    Ok(FileChange {
        path: if status == 'D' { old.path.clone() } else { new.path.clone() },
        old_path: None,
        status,
        old_blob: blob(&old),
        new_blob: blob(&new),
        old_mode: old.mode,
        new_mode: new.mode,
        additions,
        deletions,
        is_binary,
        patch: text,
    })
}

/// A rename, with a patch in `git diff -M`'s form: its header (modes, similarity, rename
/// from/to, index) and the hunks between the two blobs.
fn rename_change(
    repo: &Repository,
    s: &renames::Side,
    d: &renames::Side,
    score: u64,
) -> Result<FileChange, GitFailure> {
    let err = |e: git2::Error| GitFailure::new("diff_failed", e.message().to_string());
    let mut header = Vec::new();
    let (op, np) = (String::from_utf8_lossy(&s.path), String::from_utf8_lossy(&d.path));
    header.extend_from_slice(format!("diff --git a/{op} b/{np}\n").as_bytes());
    if s.mode != d.mode {
        header.extend_from_slice(format!("old mode {:06o}\nnew mode {:06o}\n", s.mode, d.mode).as_bytes());
    }
    header.extend_from_slice(
        format!("similarity index {}%\nrename from {op}\nrename to {np}\n", score * 100 / renames::MAX_SCORE)
            .as_bytes(),
    );
    let (mut additions, mut deletions, mut is_binary) = (0, 0, false);
    if s.oid != d.oid {
        let short = |o: Oid| o.to_string()[..7].to_string();
        let mode = if s.mode == d.mode { format!(" {:06o}", s.mode) } else { String::new() };
        header.extend_from_slice(format!("index {}..{}{mode}\n", short(s.oid), short(d.oid)).as_bytes());
        if s.mode != GITLINK && d.mode != GITLINK {
            let (ob, nb) = (repo.find_blob(s.oid).map_err(err)?, repo.find_blob(d.oid).map_err(err)?);
            let mut p = Patch::from_blobs(&ob, Some(Path::new(op.as_ref())), &nb, Some(Path::new(np.as_ref())), None)
                .map_err(err)?;
            let (_, a, dl) = p.line_stats().map_err(err)?;
            (additions, deletions) = (a, dl);
            is_binary = ob.is_binary() || nb.is_binary();
            let buf = p.to_buf().map_err(err)?.to_vec();
            // libgit2's own header lines give way to git's; its hunks (or "Binary files
            // differ") stay.
            let body_at = ["\n--- ", "\nBinary files "]
                .iter()
                .filter_map(|m| find_bytes(&buf, m.as_bytes()).map(|i| i + 1))
                .min()
                .unwrap_or(buf.len());
            header.extend_from_slice(&buf[body_at..]);
        }
    }
    let blob = |x: &renames::Side| (x.mode != GITLINK).then_some(x.oid);
    Ok(FileChange {
        path: d.path.clone(),
        old_path: Some(s.path.clone()),
        status: 'R',
        old_blob: blob(s),
        new_blob: blob(d),
        old_mode: s.mode,
        new_mode: d.mode,
        additions,
        deletions,
        is_binary,
        patch: header,
    })
}

fn find_bytes(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A commit of a PR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitInfo {
    pub sha: Oid,
    pub author_name: String,
    pub author_email: String,
    /// Seconds since the epoch.
    pub authored_at: i64,
    pub committer_name: String,
    pub committed_at: i64,
    pub message: String,
    pub parents: usize,
}

/// The commits of `head` that `base` does not have, oldest first (what GitHub lists as the
/// PR's commits).
pub fn pr_commits(repo: &Repository, base: Oid, head: Oid) -> Result<Vec<CommitInfo>, GitFailure> {
    let err = |e: git2::Error| GitFailure::new("corrupt_object", e.message().to_string());
    let mut walk = repo.revwalk().map_err(err)?;
    walk.set_sorting(Sort::TOPOLOGICAL | Sort::REVERSE).map_err(err)?;
    walk.push(head).map_err(err)?;
    walk.hide(base).map_err(err)?;
    let mut out = Vec::new();
    for oid in walk {
        let c = repo.find_commit(oid.map_err(err)?).map_err(err)?;
        let (a, cm) = (c.author(), c.committer());
        out.push(CommitInfo {
            sha: c.id(),
            author_name: String::from_utf8_lossy(a.name_bytes()).into_owned(),
            author_email: String::from_utf8_lossy(a.email_bytes()).into_owned(),
            authored_at: a.when().seconds(),
            committer_name: String::from_utf8_lossy(cm.name_bytes()).into_owned(),
            committed_at: cm.when().seconds(),
            message: String::from_utf8_lossy(c.message_bytes()).into_owned(),
            parents: c.parent_count(),
        });
    }
    Ok(out)
}

/// A blob's bytes and git's binary verdict (a NUL in the first 8000 bytes).
pub fn read_blob(repo: &Repository, oid: Oid) -> Result<(Vec<u8>, bool), GitFailure> {
    let b =
        repo.find_blob(oid).map_err(|e| GitFailure::new("corrupt_object", format!("blob {oid}: {}", e.message())))?;
    Ok((b.content().to_vec(), b.is_binary()))
}

/// git's binary verdict for a blob from its first 8000 bytes, streaming them when the object
/// database can (loose objects) and reading the blob otherwise.
pub fn blob_is_binary(repo: &Repository, oid: Oid) -> Result<bool, GitFailure> {
    use std::io::Read;
    let odb = repo.odb().map_err(|e| GitFailure::new("corrupt_object", e.message().to_string()))?;
    if let Ok((mut reader, _, _)) = odb.reader(oid) {
        let mut head = vec![0u8; 8000];
        let mut n = 0;
        while n < head.len() {
            match reader.read(&mut head[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(_) => return read_blob(repo, oid).map(|(_, b)| b),
            }
        }
        return Ok(head[..n].contains(&0));
    }
    read_blob(repo, oid).map(|(_, b)| b)
}

/// Size of a blob without reading it into memory.
pub fn blob_size(repo: &Repository, oid: Oid) -> Result<usize, GitFailure> {
    let odb = repo.odb().map_err(|e| GitFailure::new("corrupt_object", e.message().to_string()))?;
    let (size, _) =
        odb.read_header(oid).map_err(|e| GitFailure::new("corrupt_object", format!("blob {oid}: {}", e.message())))?;
    Ok(size)
}

/// The files (path, blob id, size) of `commit`'s tree, recursively; symlinks and submodules
/// are skipped.
pub fn tree_files(repo: &Repository, commit: Oid) -> Result<Vec<(String, Oid, usize)>, GitFailure> {
    let err = |e: git2::Error| GitFailure::new("corrupt_object", e.message().to_string());
    let tree = repo.find_commit(commit).and_then(|c| c.tree()).map_err(err)?;
    let odb = repo.odb().map_err(err)?;
    let mut out = Vec::new();
    let mut failure = None;
    tree.walk(git2::TreeWalkMode::PreOrder, |root, entry| {
        if entry.kind() == Some(git2::ObjectType::Blob) && entry.filemode() != 0o120000 {
            let path = format!("{root}{}", String::from_utf8_lossy(entry.name_bytes()));
            match odb.read_header(entry.id()) {
                Ok((size, _)) => out.push((path, entry.id(), size)),
                Err(e) => {
                    failure = Some(err(e));
                    return git2::TreeWalkResult::Abort;
                }
            }
        }
        git2::TreeWalkResult::Ok
    })
    .map_err(err)?;
    match failure {
        Some(f) => Err(f),
        None => Ok(out),
    }
}
