//! A port of CPython's `difflib.SequenceMatcher` and `difflib.unified_diff`, exact to the
//! element: the same recursive longest-match algorithm with the same tie-breaking, the same
//! "popular element" purge when `autojunk` is on, and the same grouping of opcodes.
//!
//! It is not a general diff library: a Myers diff (as in `similar`) finds a different set of
//! matching blocks, so its ratios differ from Python's in the last digits or more, and the
//! SWE-RL reward is defined by Python's numbers. Sequences are slices of dense `u32` ids
//! (code points or interned lines); equality of ids is equality of elements.

use std::collections::HashMap;

/// A matching block `(i, j, size)`: `a[i..i+size] == b[j..j+size]`.
pub type Block = (usize, usize, usize);

/// Reusable scratch space for [`Matcher`], so scoring many pairs does not allocate per call.
#[derive(Default)]
pub struct Scratch {
    offsets: Vec<u32>,
    positions: Vec<u32>,
    popular: Vec<bool>,
    len: [Vec<u32>; 2],
    stamp: [Vec<u64>; 2],
    generation: u64,
    queue: Vec<(usize, usize, usize, usize)>,
    blocks: Vec<Block>,
}

/// `SequenceMatcher(None, a, b, autojunk)` over id sequences whose ids are `< n_ids`.
pub struct Matcher<'s, 'a> {
    a: &'a [u32],
    b: &'a [u32],
    s: &'s mut Scratch,
}

impl<'s, 'a> Matcher<'s, 'a> {
    /// Builds `b2j` (positions of each element in `b`, ascending) and, with `autojunk` and
    /// `len(b) >= 200`, drops the elements occurring more than `len(b) // 100 + 1` times,
    /// exactly as `SequenceMatcher.__chain_b` does.
    pub fn new(a: &'a [u32], b: &'a [u32], n_ids: usize, autojunk: bool, s: &'s mut Scratch) -> Self {
        s.offsets.clear();
        s.offsets.resize(n_ids + 1, 0);
        for &x in b {
            s.offsets[x as usize + 1] += 1;
        }
        s.popular.clear();
        s.popular.resize(n_ids, false);
        if autojunk && b.len() >= 200 {
            let ntest = (b.len() / 100 + 1) as u32;
            for id in 0..n_ids {
                if s.offsets[id + 1] > ntest {
                    s.popular[id] = true;
                }
            }
        }
        for id in 0..n_ids {
            s.offsets[id + 1] += s.offsets[id];
        }
        s.positions.clear();
        s.positions.resize(b.len(), 0);
        // Fill with a moving cursor per id; `len[0]` doubles as the cursor array here.
        let cursor = &mut s.len[0];
        cursor.clear();
        cursor.extend_from_slice(&s.offsets[..n_ids]);
        for (j, &x) in b.iter().enumerate() {
            let c = &mut cursor[x as usize];
            s.positions[*c as usize] = j as u32;
            *c += 1;
        }
        for k in 0..2 {
            s.len[k].clear();
            s.len[k].resize(b.len() + 1, 0);
            s.stamp[k].clear();
            s.stamp[k].resize(b.len() + 1, 0);
        }
        Matcher { a, b, s }
    }

    /// `find_longest_match(alo, ahi, blo, bhi)`: the longest block, earliest in `a`, then
    /// earliest in `b`, extended over equal (popular) neighbours as CPython does.
    pub fn find_longest_match(&mut self, alo: usize, ahi: usize, blo: usize, bhi: usize) -> Block {
        let (a, b) = (self.a, self.b);
        let s = &mut *self.s;
        let (mut besti, mut bestj, mut bestsize) = (alo, blo, 0usize);
        // A fresh generation separates this call from the previous one: a length recorded
        // in an earlier call must never look like the previous row of this one.
        s.generation += 1;
        for i in alo..ahi {
            s.generation += 1;
            let g = s.generation;
            let cur = (g & 1) as usize;
            let prev = cur ^ 1;
            let id = a[i] as usize;
            if id >= s.popular.len() || s.popular[id] {
                continue;
            }
            let occ = &s.positions[s.offsets[id] as usize..s.offsets[id + 1] as usize];
            let start = occ.partition_point(|&j| (j as usize) < blo);
            for &j in &occ[start..] {
                let j = j as usize;
                if j >= bhi {
                    break;
                }
                // j2len[j-1] of the previous row, stored at index j (index = position + 1).
                let k = if s.stamp[prev][j] == g - 1 { s.len[prev][j] + 1 } else { 1 };
                s.len[cur][j + 1] = k;
                s.stamp[cur][j + 1] = g;
                let k = k as usize;
                if k > bestsize {
                    besti = i + 1 - k;
                    bestj = j + 1 - k;
                    bestsize = k;
                }
            }
        }
        // With no junk function every element is "non-junk": extend over equal elements,
        // which only changes anything when popular elements were purged from b2j.
        while besti > alo && bestj > blo && a[besti - 1] == b[bestj - 1] {
            besti -= 1;
            bestj -= 1;
            bestsize += 1;
        }
        while besti + bestsize < ahi && bestj + bestsize < bhi && a[besti + bestsize] == b[bestj + bestsize] {
            bestsize += 1;
        }
        (besti, bestj, bestsize)
    }

    /// `get_matching_blocks()` without the trailing sentinel: sorted, adjacent blocks merged.
    pub fn matching_blocks(&mut self) -> Vec<Block> {
        let (la, lb) = (self.a.len(), self.b.len());
        let mut queue = std::mem::take(&mut self.s.queue);
        let mut blocks = std::mem::take(&mut self.s.blocks);
        queue.clear();
        blocks.clear();
        queue.push((0, la, 0, lb));
        while let Some((alo, ahi, blo, bhi)) = queue.pop() {
            let (i, j, k) = self.find_longest_match(alo, ahi, blo, bhi);
            if k > 0 {
                blocks.push((i, j, k));
                if alo < i && blo < j {
                    queue.push((alo, i, blo, j));
                }
                if i + k < ahi && j + k < bhi {
                    queue.push((i + k, ahi, j + k, bhi));
                }
            }
        }
        blocks.sort_unstable();
        let mut merged: Vec<Block> = Vec::with_capacity(blocks.len());
        for &(i, j, k) in &blocks {
            match merged.last_mut() {
                Some(last) if last.0 + last.2 == i && last.1 + last.2 == j => last.2 += k,
                _ => merged.push((i, j, k)),
            }
        }
        self.s.queue = queue;
        self.s.blocks = blocks;
        merged
    }

    /// Sum of matching-block sizes: what `ratio()` needs, without sorting or merging.
    pub fn matches(&mut self) -> usize {
        let (la, lb) = (self.a.len(), self.b.len());
        let mut queue = std::mem::take(&mut self.s.queue);
        queue.clear();
        queue.push((0, la, 0, lb));
        let mut total = 0;
        while let Some((alo, ahi, blo, bhi)) = queue.pop() {
            let (i, j, k) = self.find_longest_match(alo, ahi, blo, bhi);
            if k > 0 {
                total += k;
                if alo < i && blo < j {
                    queue.push((alo, i, blo, j));
                }
                if i + k < ahi && j + k < bhi {
                    queue.push((i + k, ahi, j + k, bhi));
                }
            }
        }
        self.s.queue = queue;
        total
    }
}

/// Python's `_calculate_ratio`: `2.0 * matches / length`, or 1.0 for two empty sequences.
fn calculate_ratio(matches: usize, length: usize) -> f64 {
    if length > 0 {
        2.0 * matches as f64 / length as f64
    } else {
        1.0
    }
}

/// Maps code points to dense ids shared by both strings (ASCII by table, the rest hashed).
pub struct CharInterner {
    ascii: [u32; 128],
    other: HashMap<u32, u32>,
    next: u32,
}

impl Default for CharInterner {
    fn default() -> Self {
        CharInterner { ascii: [u32::MAX; 128], other: HashMap::new(), next: 0 }
    }
}

impl CharInterner {
    fn reset(&mut self) {
        self.ascii = [u32::MAX; 128];
        self.other.clear();
        self.next = 0;
    }

    fn id(&mut self, c: char) -> u32 {
        let cp = c as u32;
        if cp < 128 {
            let slot = &mut self.ascii[cp as usize];
            if *slot == u32::MAX {
                *slot = self.next;
                self.next += 1;
            }
            *slot
        } else {
            let next = &mut self.next;
            *self.other.entry(cp).or_insert_with(|| {
                *next += 1;
                *next - 1
            })
        }
    }
}

/// Everything needed to compute ratios of many string pairs without reallocating.
#[derive(Default)]
pub struct RatioCtx {
    scratch: Scratch,
    chars: CharInterner,
    a: Vec<u32>,
    b: Vec<u32>,
}

impl RatioCtx {
    /// `difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()` on code points.
    pub fn ratio(&mut self, a: &str, b: &str) -> f64 {
        self.chars.reset();
        self.a.clear();
        self.b.clear();
        for c in b.chars() {
            let id = self.chars.id(c);
            self.b.push(id);
        }
        for c in a.chars() {
            let id = self.chars.id(c);
            self.a.push(id);
        }
        let n_ids = self.chars.next as usize;
        let mut m = Matcher::new(&self.a, &self.b, n_ids, false, &mut self.scratch);
        let matches = m.matches();
        calculate_ratio(matches, self.a.len() + self.b.len())
    }
}

/// One-off convenience around [`RatioCtx::ratio`].
pub fn ratio(a: &str, b: &str) -> f64 {
    RatioCtx::default().ratio(a, b)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tag {
    Equal,
    Replace,
    Delete,
    Insert,
}

type Opcode = (Tag, usize, usize, usize, usize);

fn opcodes(blocks: &[Block], la: usize, lb: usize) -> Vec<Opcode> {
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::new();
    for &(ai, bj, size) in blocks.iter().chain(std::iter::once(&(la, lb, 0))) {
        let tag = if i < ai && j < bj {
            Some(Tag::Replace)
        } else if i < ai {
            Some(Tag::Delete)
        } else if j < bj {
            Some(Tag::Insert)
        } else {
            None
        };
        if let Some(tag) = tag {
            out.push((tag, i, ai, j, bj));
        }
        i = ai + size;
        j = bj + size;
        if size > 0 {
            out.push((Tag::Equal, ai, i, bj, j));
        }
    }
    out
}

/// `get_grouped_opcodes(n)`.
fn grouped_opcodes(mut codes: Vec<Opcode>, n: usize) -> Vec<Vec<Opcode>> {
    if codes.is_empty() {
        codes.push((Tag::Equal, 0, 1, 0, 1));
    }
    if let Some(first) = codes.first_mut() {
        if first.0 == Tag::Equal {
            let (t, i1, i2, j1, j2) = *first;
            *first = (t, i1.max(i2.saturating_sub(n)), i2, j1.max(j2.saturating_sub(n)), j2);
        }
    }
    if let Some(last) = codes.last_mut() {
        if last.0 == Tag::Equal {
            let (t, i1, i2, j1, j2) = *last;
            *last = (t, i1, i2.min(i1 + n), j1, j2.min(j1 + n));
        }
    }
    let nn = n + n;
    let mut groups = Vec::new();
    let mut group = Vec::new();
    for (tag, mut i1, i2, mut j1, j2) in codes {
        if tag == Tag::Equal && i2 - i1 > nn {
            group.push((tag, i1, i2.min(i1 + n), j1, j2.min(j1 + n)));
            groups.push(std::mem::take(&mut group));
            i1 = i1.max(i2.saturating_sub(n));
            j1 = j1.max(j2.saturating_sub(n));
        }
        group.push((tag, i1, i2, j1, j2));
    }
    if !group.is_empty() && !(group.len() == 1 && group[0].0 == Tag::Equal) {
        groups.push(group);
    }
    groups
}

/// `difflib._format_range_unified`.
fn format_range(start: usize, stop: usize) -> String {
    let mut beginning = start + 1;
    let length = stop - start;
    if length == 1 {
        return beginning.to_string();
    }
    if length == 0 {
        beginning -= 1;
    }
    format!("{beginning},{length}")
}

/// The lines of `difflib.unified_diff(a, b, n=n, lineterm="")` after its two file-header
/// lines (which the SWE-RL reward drops). Empty when the inputs are equal.
pub fn unified_diff_body(a: &[&str], b: &[&str], n: usize) -> Vec<String> {
    let mut ids: HashMap<&str, u32> = HashMap::with_capacity(a.len() + b.len());
    let mut a_ids = Vec::with_capacity(a.len());
    let mut b_ids = Vec::with_capacity(b.len());
    for &l in b {
        let next = ids.len() as u32;
        b_ids.push(*ids.entry(l).or_insert(next));
    }
    for &l in a {
        let next = ids.len() as u32;
        a_ids.push(*ids.entry(l).or_insert(next));
    }
    let mut scratch = Scratch::default();
    // unified_diff constructs SequenceMatcher(None, a, b): autojunk stays at its default, True.
    let blocks = Matcher::new(&a_ids, &b_ids, ids.len(), true, &mut scratch).matching_blocks();
    let mut out = Vec::new();
    for group in grouped_opcodes(opcodes(&blocks, a.len(), b.len()), n) {
        let (first, last) = (group[0], group[group.len() - 1]);
        out.push(format!("@@ -{} +{} @@", format_range(first.1, last.2), format_range(first.3, last.4)));
        for (tag, i1, i2, j1, j2) in group {
            if tag == Tag::Equal {
                out.extend(a[i1..i2].iter().map(|l| format!(" {l}")));
                continue;
            }
            if matches!(tag, Tag::Replace | Tag::Delete) {
                out.extend(a[i1..i2].iter().map(|l| format!("-{l}")));
            }
            if matches!(tag, Tag::Replace | Tag::Insert) {
                out.extend(b[j1..j2].iter().map(|l| format!("+{l}")));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // Expected ratios below were computed with CPython 3.11's difflib by hand, not by this code.
    #[test]
    fn ratio_known_values() {
        assert_eq!(ratio("", ""), 1.0);
        assert_eq!(ratio("abc", ""), 0.0);
        assert_eq!(ratio("abcd", "bcde"), 0.75);
        // SequenceMatcher(None, "private Thread currentThread;",
        //   "private volatile Thread currentThread;", autojunk=False).ratio()
        let r = ratio("private Thread currentThread;", "private volatile Thread currentThread;");
        assert!((r - 0.8656716417910447).abs() < 1e-15, "{r}");
        // Not symmetric: the tie-breaking of find_longest_match depends on the order.
        // SequenceMatcher(None, "ccbcaa", "aaacca", autojunk=False).ratio() == 0.5, swapped 1/3
        assert_eq!(ratio("ccbcaa", "aaacca"), 0.5);
        assert!((ratio("aaacca", "ccbcaa") - 1.0 / 3.0).abs() < 1e-15);
    }

    #[test]
    fn code_points_not_bytes() {
        // 'é' is two bytes but one element: 2*1/(1+1) == 1.0 and "aé" vs "é": 2*1/3.
        assert_eq!(ratio("é", "é"), 1.0);
        assert!((ratio("aé", "é") - 2.0 / 3.0).abs() < 1e-15);
    }

    #[test]
    fn longest_match_tie_breaking() {
        // SequenceMatcher(None, " abcd", "abcd abcd").find_longest_match(0, 5, 0, 9)
        // == Match(a=0, b=4, size=5)
        let to_ids = |s: &str| s.bytes().map(u32::from).collect::<Vec<_>>();
        let (a, b) = (to_ids(" abcd"), to_ids("abcd abcd"));
        let mut s = Scratch::default();
        let mut m = Matcher::new(&a, &b, 256, false, &mut s);
        assert_eq!(m.find_longest_match(0, 5, 0, 9), (0, 4, 5));
    }

    #[test]
    fn unified_diff_shapes() {
        let a = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"];
        let b = ["a", "b", "c", "d", "E", "f", "g", "h", "i", "j", "k"];
        // list(difflib.unified_diff(a, b, lineterm="", n=3))[2:]
        let want = vec!["@@ -2,9 +2,10 @@", " b", " c", " d", "-e", "+E", " f", " g", " h", " i", " j", "+k"];
        assert_eq!(unified_diff_body(&a, &b, 3), want);
        assert!(unified_diff_body(&a, &a, 3).is_empty());
        // Insertion into an empty file: "@@ -0,0 +1,2 @@"
        assert_eq!(unified_diff_body(&[], &["x", "y"], 3), vec!["@@ -0,0 +1,2 @@", "+x", "+y"]);
    }

    #[test]
    fn autojunk_popular_lines_extend() {
        // 300 identical lines in b make "x" popular (ntest = 4), so b2j has no entry for it and
        // the match is found only by the extension loop: Python reports one 300-line block.
        let a: Vec<&str> = vec!["x"; 300];
        let b: Vec<&str> = vec!["x"; 300];
        assert!(unified_diff_body(&a, &b, 3).is_empty());
        let mut b2 = b.clone();
        b2.push("y");
        assert_eq!(unified_diff_body(&a, &b2, 3), vec!["@@ -298,3 +298,4 @@", " x", " x", " x", "+y"]);
    }
}
