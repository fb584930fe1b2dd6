//! Scratch trees: a commit's files written out of the mirror, with some paths replaced by
//! their content at another commit, and a `.git` of its own whose one commit is the base — so
//! nothing after the base (the fix among it) is readable from inside the sandbox, not even with
//! `git log --all`.

use std::path::{Component, Path};

use anyhow::{bail, Context, Result};
use git2::{Oid, Repository};

/// Writes the tree of `commit` into `dir` (which must be empty or absent).
pub fn write_commit(repo: &Repository, commit: Oid, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let tree = repo.find_commit(commit).and_then(|c| c.tree()).with_context(|| format!("reading commit {commit}"))?;
    let mut failure: Option<anyhow::Error> = None;
    tree.walk(git2::TreeWalkMode::PreOrder, |root, entry| {
        if entry.kind() != Some(git2::ObjectType::Blob) {
            return git2::TreeWalkResult::Ok;
        }
        let rel = format!("{root}{}", String::from_utf8_lossy(entry.name_bytes()));
        match write_blob(repo, dir, &rel, entry.id(), entry.filemode() as u32) {
            Ok(()) => git2::TreeWalkResult::Ok,
            Err(e) => {
                failure = Some(e);
                git2::TreeWalkResult::Abort
            }
        }
    })?;
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Replaces `path` in `dir` by its content at `commit` (removes it when absent there).
pub fn overlay(repo: &Repository, dir: &Path, commit: Oid, path: &str) -> Result<()> {
    let target = safe_path(dir, path)?;
    let tree = repo.find_commit(commit).and_then(|c| c.tree())?;
    match tree.get_path(Path::new(path)) {
        Ok(entry) if entry.kind() == Some(git2::ObjectType::Blob) => {
            if target.symlink_metadata().is_ok() {
                std::fs::remove_file(&target).ok();
            }
            write_blob(repo, dir, path, entry.id(), entry.filemode() as u32)
        }
        Ok(_) => Ok(()),
        Err(_) => {
            if target.symlink_metadata().is_ok() {
                std::fs::remove_file(&target).with_context(|| format!("removing {path}"))?;
            }
            Ok(())
        }
    }
}

/// `dir/rel`, refused when `rel` climbs out of `dir` or passes through a symbolic link (a
/// tree's link must not carry a later write outside the scratch tree).
fn safe_path(dir: &Path, rel: &str) -> Result<std::path::PathBuf> {
    let p = Path::new(rel);
    if p.components().any(|c| !matches!(c, Component::Normal(_))) {
        bail!("the path {rel:?} leaves the tree");
    }
    let mut cur = dir.to_path_buf();
    let parts: Vec<_> = p.components().collect();
    for c in &parts[..parts.len().saturating_sub(1)] {
        cur.push(c);
        if cur.symlink_metadata().map(|m| m.file_type().is_symlink()).unwrap_or(false) {
            bail!("the path {rel:?} passes through a symbolic link");
        }
    }
    Ok(dir.join(p))
}

fn write_blob(repo: &Repository, dir: &Path, rel: &str, id: Oid, mode: u32) -> Result<()> {
    let target = safe_path(dir, rel)?;
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    let blob = repo.find_blob(id).with_context(|| format!("reading {rel}"))?;
    if mode == 0o120000 {
        let link = String::from_utf8_lossy(blob.content()).to_string();
        std::os::unix::fs::symlink(link, &target).with_context(|| format!("linking {rel}"))?;
        return Ok(());
    }
    std::fs::write(&target, blob.content()).with_context(|| format!("writing {rel}"))?;
    if mode == 0o100755 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(())
}

/// A `.git` in `dir` with one commit of its files as they are now, by a fixed author at a
/// fixed time (the same bits on every run), on branch `main`.
pub fn init_git(dir: &Path, message: &str) -> Result<()> {
    let repo = Repository::init(dir)?;
    let mut index = repo.index()?;
    index.add_all(["*"].iter(), git2::IndexAddOption::DEFAULT, None)?;
    index.write()?;
    let tree = repo.find_tree(index.write_tree()?)?;
    let sig = git2::Signature::new("swelake", "swelake@localhost", &git2::Time::new(0, 0))?;
    let oid = repo.commit(None, &sig, &sig, message, &tree, &[])?;
    repo.reference("refs/heads/main", oid, true, "base")?;
    repo.set_head("refs/heads/main")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_leave_the_tree_or_cross_a_link_are_refused() {
        let d = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc", d.path().join("out")).unwrap();
        assert!(safe_path(d.path(), "../x").is_err());
        assert!(safe_path(d.path(), "/etc/passwd").is_err());
        assert!(safe_path(d.path(), "out/passwd").unwrap_err().to_string().contains("symbolic link"));
        assert_eq!(safe_path(d.path(), "a/b.py").unwrap(), d.path().join("a/b.py"));
    }
}
