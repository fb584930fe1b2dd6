//! git's own rename detection (`diffcore-rename.c`, `diffcore-delta.c`), so that `pr_files`
//! says what `git diff -M` says. libgit2's similarity (its `hashsig`) is another measure, and
//! it calls some heavily edited moves renames where git sees a deletion and an addition.
//!
//! git's order, reproduced here: exact renames first (same blob; the earliest deleted path wins
//! ties, one with the same file name first); then, among what is left, a deleted and an added
//! file whose file name is unique on both sides, at 75% similarity; then every remaining
//! deleted × added pair at 50%, best scores first (the file name breaks ties), each side used
//! once. Similarity is git's: the bytes of the added file that come from the deleted one, in
//! chunks cut at newlines or 64 bytes, over the larger size. Only regular files are renamed
//! inexactly; a symlink or submodule only by an exact match of the same kind.

use std::collections::HashMap;

use git2::{Oid, Repository};

/// git's scale: a score is a fraction of this.
pub const MAX_SCORE: u64 = 60000;
/// `-M`'s default threshold, 50%.
pub const MIN_SCORE: u64 = 30000;
const NUM_CANDIDATE_PER_DST: usize = 4;
/// `diff.renameLimit`'s default: above this many sources or destinations (or their product
/// above its square), git looks only for exact renames.
const RENAME_LIMIT: usize = 1000;
const HASHBASE: u32 = 107927;

/// One side of a deleted or added file.
#[derive(Debug, Clone)]
pub struct Side {
    pub path: Vec<u8>,
    pub oid: Oid,
    pub mode: u32,
}

pub fn is_regular(mode: u32) -> bool {
    mode & 0o170000 == 0o100000
}

fn basename(p: &[u8]) -> &[u8] {
    p.rsplit(|&b| b == b'/').next().unwrap_or(p)
}

/// git's `basename_same`.
fn basename_same(a: &[u8], b: &[u8]) -> bool {
    basename(a) == basename(b)
}

/// The chunk-hash counts of a blob, sorted by hash (`hash_chars`).
fn spanhash(data: &[u8]) -> Vec<(u32, u64)> {
    let is_text = !data[..data.len().min(8000)].contains(&0);
    let mut counts: HashMap<u32, u64> = HashMap::new();
    let (mut accum1, mut accum2, mut n) = (0u32, 0u32, 0u64);
    let mut i = 0;
    while i < data.len() {
        let c = data[i] as u32;
        i += 1;
        // A CR of a CRLF is not counted in text.
        if is_text && c == u32::from(b'\r') && i < data.len() && data[i] == b'\n' {
            continue;
        }
        let old1 = accum1;
        accum1 = (accum1 << 7) ^ (accum2 >> 25);
        accum2 = (accum2 << 7) ^ (old1 >> 25);
        accum1 = accum1.wrapping_add(c);
        n += 1;
        if n < 64 && c != u32::from(b'\n') {
            continue;
        }
        let h = accum1.wrapping_add(accum2.wrapping_mul(0x61)) % HASHBASE;
        *counts.entry(h).or_default() += n;
        n = 0;
        accum1 = 0;
        accum2 = 0;
    }
    if n > 0 {
        let h = accum1.wrapping_add(accum2.wrapping_mul(0x61)) % HASHBASE;
        *counts.entry(h).or_default() += n;
    }
    let mut v: Vec<(u32, u64)> = counts.into_iter().collect();
    v.sort_unstable();
    v
}

/// Bytes of `dst` that `src` has (`diffcore_count_changes`' `src_copied`).
fn copied(src: &[(u32, u64)], dst: &[(u32, u64)]) -> u64 {
    let (mut sc, mut d) = (0u64, 0usize);
    for &(h, src_cnt) in src {
        while d < dst.len() && dst[d].0 < h {
            d += 1;
        }
        let dst_cnt = if d < dst.len() && dst[d].0 == h {
            d += 1;
            dst[d - 1].1
        } else {
            0
        };
        sc += src_cnt.min(dst_cnt);
    }
    sc
}

/// Blob sizes and chunk hashes, each read once.
struct Blobs<'r> {
    repo: &'r Repository,
    sizes: HashMap<Oid, u64>,
    hashes: HashMap<Oid, Vec<(u32, u64)>>,
}

impl Blobs<'_> {
    fn size(&mut self, oid: Oid) -> Result<u64, git2::Error> {
        if let Some(s) = self.sizes.get(&oid) {
            return Ok(*s);
        }
        let (size, _) = self.repo.odb()?.read_header(oid)?;
        self.sizes.insert(oid, size as u64);
        Ok(size as u64)
    }

    fn hash(&mut self, oid: Oid) -> Result<&[(u32, u64)], git2::Error> {
        if !self.hashes.contains_key(&oid) {
            let blob = self.repo.find_blob(oid)?;
            self.hashes.insert(oid, spanhash(blob.content()));
        }
        Ok(&self.hashes[&oid])
    }

    /// git's `estimate_similarity`: 0 when the sizes alone rule a rename at `min_score` out.
    fn similarity(&mut self, src: &Side, dst: &Side, min_score: u64) -> Result<u64, git2::Error> {
        if !is_regular(src.mode) || !is_regular(dst.mode) {
            return Ok(0);
        }
        let (s, d) = (self.size(src.oid)?, self.size(dst.oid)?);
        let (max, base) = (s.max(d), s.min(d));
        if max * (MAX_SCORE - min_score) < (max - base) * MAX_SCORE {
            return Ok(0);
        }
        if d == 0 {
            return Ok(0);
        }
        let sh = self.hash(src.oid)?.to_vec();
        let dh = self.hash(dst.oid)?;
        Ok(copied(&sh, dh) * MAX_SCORE / max)
    }
}

/// A rename: indexes into the deleted and added lists, and git's score (of [`MAX_SCORE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rename {
    pub src: usize,
    pub dst: usize,
    pub score: u64,
}

/// The renames `git diff -M` finds among `deleted` and `added` (each in path order).
pub fn find(repo: &Repository, deleted: &[Side], added: &[Side]) -> Result<Vec<Rename>, git2::Error> {
    let mut out = Vec::new();
    if deleted.is_empty() || added.is_empty() {
        return Ok(out);
    }
    let mut used = vec![false; deleted.len()];
    let mut done = vec![false; added.len()];
    let mut blobs = Blobs { repo, sizes: HashMap::new(), hashes: HashMap::new() };

    // Exact: the same blob (and for a symlink or submodule, the same mode).
    let mut by_oid: HashMap<Oid, Vec<usize>> = HashMap::new();
    for (i, s) in deleted.iter().enumerate() {
        by_oid.entry(s.oid).or_default().push(i);
    }
    for (di, d) in added.iter().enumerate() {
        let Some(cands) = by_oid.get(&d.oid) else { continue };
        let mut best: Option<(usize, u8)> = None;
        for &si in cands {
            let s = &deleted[si];
            if (!is_regular(s.mode) || !is_regular(d.mode)) && s.mode != d.mode {
                continue;
            }
            if used[si] {
                continue;
            }
            let score = 1 + u8::from(basename_same(&s.path, &d.path));
            if best.is_none_or(|(_, b)| score > b) {
                best = Some((si, score));
                if score == 2 {
                    break;
                }
            }
        }
        if let Some((si, _)) = best {
            used[si] = true;
            done[di] = true;
            out.push(Rename { src: si, dst: di, score: MAX_SCORE });
        }
    }

    // Same unique file name on both sides, at a higher bar.
    let min_basename = MIN_SCORE + (MAX_SCORE - MIN_SCORE) / 2;
    let unique = |names: Vec<(usize, &[u8])>| {
        let mut m: HashMap<Vec<u8>, Option<usize>> = HashMap::new();
        for (i, b) in names {
            m.entry(b.to_vec()).and_modify(|v| *v = None).or_insert(Some(i));
        }
        m
    };
    let sources = unique((0..deleted.len()).filter(|&i| !used[i]).map(|i| (i, basename(&deleted[i].path))).collect());
    let dests = unique((0..added.len()).filter(|&i| !done[i]).map(|i| (i, basename(&added[i].path))).collect());
    for si in 0..deleted.len() {
        if used[si] {
            continue;
        }
        let base = basename(&deleted[si].path);
        let (Some(Some(s)), Some(Some(di))) = (sources.get(base), dests.get(base)) else { continue };
        if *s != si || done[*di] {
            continue;
        }
        let score = blobs.similarity(&deleted[si], &added[*di], min_basename)?;
        if score >= min_basename {
            used[si] = true;
            done[*di] = true;
            out.push(Rename { src: si, dst: *di, score });
        }
    }

    // Everything left against everything left, best first.
    let srcs: Vec<usize> = (0..deleted.len()).filter(|&i| !used[i]).collect();
    let dsts: Vec<usize> = (0..added.len()).filter(|&i| !done[i]).collect();
    if srcs.is_empty()
        || dsts.is_empty()
        || srcs.len() > RENAME_LIMIT
        || dsts.len() > RENAME_LIMIT
        || srcs.len() * dsts.len() > RENAME_LIMIT * RENAME_LIMIT
    {
        return Ok(out);
    }
    // (score, same file name, dst, src); `None` for an empty slot.
    type Cand = (u64, bool, usize, usize);
    let better = |a: &Cand, b: &Cand| (a.0, a.1) > (b.0, b.1);
    let mut mx: Vec<Option<Cand>> = Vec::with_capacity(dsts.len() * NUM_CANDIDATE_PER_DST);
    for &di in &dsts {
        let mut top: [Option<Cand>; NUM_CANDIDATE_PER_DST] = [None; NUM_CANDIDATE_PER_DST];
        for &si in &srcs {
            let score = blobs.similarity(&deleted[si], &added[di], MIN_SCORE)?;
            let c = (score, basename_same(&deleted[si].path, &added[di].path), di, si);
            // Replace the worst kept candidate (an empty slot first) when this one is better.
            let worst = (0..NUM_CANDIDATE_PER_DST)
                .min_by(|&a, &b| match (&top[a], &top[b]) {
                    (None, None) => std::cmp::Ordering::Equal,
                    (None, Some(_)) => std::cmp::Ordering::Less,
                    (Some(_), None) => std::cmp::Ordering::Greater,
                    (Some(x), Some(y)) => (x.0, x.1).cmp(&(y.0, y.1)),
                })
                .expect("candidates");
            match &top[worst] {
                None => top[worst] = Some(c),
                Some(w) if better(&c, w) => top[worst] = Some(c),
                _ => {}
            }
        }
        mx.extend(top);
    }
    let mut mx: Vec<Cand> = mx.into_iter().flatten().collect();
    // Stable, as git's: equal candidates keep their order (by destination, then slot).
    mx.sort_by_key(|c| std::cmp::Reverse((c.0, c.1)));
    for (score, _, di, si) in mx {
        if score < MIN_SCORE {
            break;
        }
        if done[di] || used[si] {
            continue;
        }
        done[di] = true;
        used[si] = true;
        out.push(Rename { src: si, dst: di, score });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_end_at_newlines_or_64_bytes_and_crlf_counts_as_lf() {
        let a = spanhash(b"one\ntwo\n");
        assert_eq!(a.iter().map(|x| x.1).sum::<u64>(), 8);
        assert_eq!(spanhash(b"one\r\ntwo\r\n"), a, "text: CR before LF is not counted");
        let long = vec![b'x'; 130];
        let h = spanhash(&long);
        // Two full 64-byte chunks hash alike, and the 2-byte tail on its own.
        assert_eq!(h.iter().map(|x| x.1).sum::<u64>(), 130);
        assert!(h.iter().any(|x| x.1 == 128) && h.iter().any(|x| x.1 == 2));
    }

    #[test]
    fn copied_bytes_take_the_smaller_count_per_chunk() {
        let src = spanhash(b"a\nb\nc\n");
        let dst = spanhash(b"a\nb\nd\na\n");
        assert_eq!(copied(&src, &dst), 4, "a and b, each once from src");
        assert!(basename_same(b"src/x.py", b"lib/x.py") && !basename_same(b"x.py", b"ax.py"));
    }
}
