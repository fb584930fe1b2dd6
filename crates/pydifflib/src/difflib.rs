//! A port of CPython's `difflib.SequenceMatcher` and `difflib.unified_diff`, exact to the
//! element: the same recursive longest-match algorithm with the same tie-breaking, the same
//! "popular element" purge when `autojunk` is on, and the same grouping of opcodes.
//!
//! It is not a general diff library: a Myers diff (as in `similar`) finds a different set of
//! matching blocks, so its ratios differ from Python's in the last digits or more, and the
//! SWE-RL reward is defined by Python's numbers. Sequences are slices of dense `u32` ids
//! (code points or interned lines); equality of ids is equality of elements.

use rustc_hash::FxHashMap as HashMap;

/// A matching block `(i, j, size)`: `a[i..i+size] == b[j..j+size]`.
pub type Block = (usize, usize, usize);

/// Reusable scratch space for [`Matcher`], so scoring many pairs does not allocate per call.
#[derive(Default)]
pub struct Scratch {
    offsets: Vec<u32>,
    positions: Vec<u32>,
    popular: Vec<bool>,
    /// DP cells `j2len`, two rows: generation in the high 32 bits, run length in the low 32.
    cells: [Vec<u64>; 2],
    generation: u32,
    queue: Vec<(usize, usize, usize, usize)>,
    blocks: Vec<Block>,
    sam: Sam,
    /// The `b` window `sam` was built for, while it can still be reused.
    sam_window: Option<(usize, usize)>,
}

const NONE: u32 = u32::MAX;
const NO_EDGE: u16 = u16::MAX;
/// A window of `b` has at most `2 * len - 1` automaton states; they must fit in a u16.
const SAM_MAX_WINDOW: usize = 32_000;

/// A suffix automaton of a window of `b`, over the window's own (local, dense) alphabet.
///
/// For each position `i` of `a`, walking `a` through it yields the longest suffix of
/// `a[alo..=i]` that occurs in the window and the automaton state holding it; that length is
/// exactly the maximum over `j` of CPython's `j2len` run length at `(i, j)`, and the state's
/// first end position is the smallest such `j`. So the first `i` with the overall maximum and
/// that `j` are CPython's answer, found in O(n + m) instead of O(pairs of equal elements).
#[derive(Default)]
struct Sam {
    /// `HDR` + the window's alphabet size: cells per state.
    stride: usize,
    /// One row per state: its length, suffix link and first end position (relative to
    /// `base`), then its transitions, dense over the local alphabet (lookups dominate and
    /// most windows have a small alphabet: measured faster than edge lists). Keeping a
    /// state's header next to its transitions means the suffix-link walks, which dominate
    /// building and querying and jump between unrelated states, touch one row per state.
    /// Cells are 16-bit, which limits windows to `SAM_MAX_WINDOW` elements.
    rows: Vec<u16>,
    base: usize,
    states: usize,
    last: usize,
    local: Vec<u32>,
    touched: Vec<u32>,
}

const LEN: usize = 0;
const LINK: usize = 1;
const FIRST: usize = 2;
const HDR: usize = 3;

impl Sam {
    fn new_state(&mut self, len: u16, first: u16) -> usize {
        let id = self.states;
        self.states += 1;
        self.rows.resize(self.rows.len() + self.stride, NO_EDGE);
        let row = id * self.stride;
        self.rows[row + LEN] = len;
        self.rows[row + FIRST] = first;
        id
    }

    fn extend(&mut self, c: usize, pos: u16) {
        let st = self.stride;
        let last = self.last;
        let cur = self.new_state(self.rows[last * st + LEN] + 1, pos);
        self.last = cur;
        let mut p = last;
        loop {
            let cell = p * st + HDR + c;
            if self.rows[cell] != NO_EDGE {
                break;
            }
            self.rows[cell] = cur as u16;
            match self.rows[p * st + LINK] {
                NO_EDGE => {
                    self.rows[cur * st + LINK] = 0;
                    return;
                }
                link => p = link as usize,
            }
        }
        let q = self.rows[p * st + HDR + c] as usize;
        if self.rows[p * st + LEN] + 1 == self.rows[q * st + LEN] {
            self.rows[cur * st + LINK] = q as u16;
            return;
        }
        let clone = self.new_state(self.rows[p * st + LEN] + 1, self.rows[q * st + FIRST]);
        self.rows.copy_within(q * st + HDR..(q + 1) * st, clone * st + HDR);
        self.rows[clone * st + LINK] = self.rows[q * st + LINK];
        loop {
            let cell = p * st + HDR + c;
            if self.rows[cell] as usize != q {
                break;
            }
            self.rows[cell] = clone as u16;
            match self.rows[p * st + LINK] {
                NO_EDGE => break,
                link => p = link as usize,
            }
        }
        self.rows[q * st + LINK] = clone as u16;
        self.rows[cur * st + LINK] = clone as u16;
    }

    /// Builds the automaton of `b[blo..bhi]` (`bhi - blo < SAM_MAX_WINDOW`).
    fn build(&mut self, b: &[u32], n_ids: usize, blo: usize, bhi: usize) {
        debug_assert!(bhi - blo < SAM_MAX_WINDOW);
        if self.local.len() < n_ids {
            self.local.resize(n_ids, NONE);
        }
        for &x in &self.touched {
            self.local[x as usize] = NONE;
        }
        self.touched.clear();
        for &x in &b[blo..bhi] {
            if self.local[x as usize] == NONE {
                self.local[x as usize] = self.touched.len() as u32;
                self.touched.push(x);
            }
        }
        self.stride = HDR + self.touched.len();
        self.base = blo;
        self.rows.clear();
        self.rows.reserve(2 * (bhi - blo + 1) * self.stride);
        self.states = 0;
        self.last = self.new_state(0, NO_EDGE);
        for (j, &x) in b[blo..bhi].iter().enumerate() {
            let c = self.local[x as usize] as usize;
            self.extend(c, j as u16);
        }
    }

    /// The longest block of `a[alo..ahi]` and the built window of `b` cut at `bhi` (which may
    /// be before the window's end): first in `a`, then in `b`. Every string of a state has
    /// the same end positions, so "occurs ending before `bhi`" is "first end < `bhi`" per
    /// state, and the usual suffix-link walk still finds the longest such suffix at each step.
    fn longest(&self, a: &[u32], alo: usize, ahi: usize, blo: usize, bhi: usize) -> Block {
        let (mut besti, mut bestj, mut bestsize) = (alo, blo, 0usize);
        let (mut v, mut l) = (0usize, 0usize);
        let st = self.stride;
        let limit = (bhi - self.base) as u16;
        let rows = &self.rows[..];
        for (i, &x) in a.iter().enumerate().take(ahi).skip(alo) {
            let c = self.local.get(x as usize).copied().unwrap_or(NONE);
            if c == NONE {
                v = 0;
                l = 0;
                continue;
            }
            let c = c as usize;
            loop {
                let t = rows[v * st + HDR + c];
                if t != NO_EDGE && rows[t as usize * st + FIRST] < limit {
                    v = t as usize;
                    l += 1;
                    break;
                }
                if v == 0 {
                    l = 0;
                    break;
                }
                v = rows[v * st + LINK] as usize;
                l = rows[v * st + LEN] as usize;
            }
            if l > bestsize {
                bestsize = l;
                besti = i + 1 - l;
                bestj = self.base + rows[v * st + FIRST] as usize + 1 - l;
            }
        }
        (besti, bestj, bestsize)
    }
}

/// `SequenceMatcher(None, a, b, autojunk)` over id sequences whose ids are `< n_ids`.
pub struct Matcher<'s, 'a> {
    a: &'a [u32],
    b: &'a [u32],
    n_ids: usize,
    any_popular: bool,
    /// `b2j` is built: eagerly when autojunk needs the counts, else on the first DP call
    /// (windows answered by the automaton never need it).
    b2j_ready: bool,
    s: &'s mut Scratch,
}

impl<'s, 'a> Matcher<'s, 'a> {
    /// Prepares `b2j` (positions of each element in `b`, ascending) and, with `autojunk` and
    /// `len(b) >= 200`, drops the elements occurring more than `len(b) // 100 + 1` times,
    /// exactly as `SequenceMatcher.__chain_b` does.
    pub fn new(a: &'a [u32], b: &'a [u32], n_ids: usize, autojunk: bool, s: &'s mut Scratch) -> Self {
        // The DP rows are generation-stamped and generations only grow (until they wrap),
        // so rows left by earlier matchers never look current: grow them, never clear them.
        for k in 0..2 {
            if s.cells[k].len() < b.len() + 1 {
                s.cells[k].resize(b.len() + 1, 0);
            }
        }
        let mut m = Matcher { a, b, n_ids, any_popular: false, b2j_ready: false, s };
        if autojunk && b.len() >= 200 {
            m.build_b2j();
            let ntest = (b.len() / 100 + 1) as u32;
            let s = &mut *m.s;
            for id in 0..n_ids {
                if s.offsets[id + 1] - s.offsets[id] > ntest {
                    s.popular[id] = true;
                    m.any_popular = true;
                }
            }
        }
        m
    }

    fn build_b2j(&mut self) {
        let (b, n_ids, s) = (self.b, self.n_ids, &mut *self.s);
        s.offsets.clear();
        s.offsets.resize(n_ids + 1, 0);
        for &x in b {
            s.offsets[x as usize + 1] += 1;
        }
        s.popular.clear();
        s.popular.resize(n_ids, false);
        for id in 0..n_ids {
            s.offsets[id + 1] += s.offsets[id];
        }
        s.positions.clear();
        s.positions.resize(b.len(), 0);
        let mut cursor: Vec<u32> = s.offsets[..n_ids].to_vec();
        for (j, &x) in b.iter().enumerate() {
            let c = &mut cursor[x as usize];
            s.positions[*c as usize] = j as u32;
            *c += 1;
        }
        self.b2j_ready = true;
    }

    /// `find_longest_match(alo, ahi, blo, bhi)`: the longest block, earliest in `a`, then
    /// earliest in `b`, extended over equal (popular) neighbours as CPython does.
    pub fn find_longest_match(&mut self, alo: usize, ahi: usize, blo: usize, bhi: usize) -> Block {
        self.s.sam_window = None;
        self.longest_in(alo, ahi, blo, bhi)
    }

    /// Like `find_longest_match`, reusing the automaton already built for a window that
    /// starts at `blo` and reaches at least `bhi` (the parent of a left child).
    fn longest_in(&mut self, alo: usize, ahi: usize, blo: usize, bhi: usize) -> Block {
        let (la, lb) = (ahi.saturating_sub(alo), bhi.saturating_sub(blo));
        let reusable = matches!(self.s.sam_window, Some((b0, b1)) if b0 == blo && bhi <= b1);
        // The DP visits every pair of equal elements (~a tenth of la*lb for text); building
        // the automaton costs a few hundred bytes of table per element of b, reusing it one
        // step per element of a. The crossover was measured on the parity cases (`swelake
        // bench reward`). Popular elements need the DP, since CPython's b2j omits them.
        let (besti, bestj, bestsize) = if self.any_popular || lb >= SAM_MAX_WINDOW {
            self.longest_dp(alo, ahi, blo, bhi)
        } else if reusable && la > 16 {
            self.s.sam.longest(self.a, alo, ahi, blo, bhi)
        } else if la * lb > 32 * (la + lb) {
            self.s.sam.build(self.b, self.n_ids, blo, bhi);
            self.s.sam_window = Some((blo, bhi));
            self.s.sam.longest(self.a, alo, ahi, blo, bhi)
        } else {
            self.longest_dp(alo, ahi, blo, bhi)
        };
        self.extend_block(besti, bestj, bestsize, (alo, ahi, blo, bhi))
    }

    /// Every block `get_matching_blocks` finds, unsorted. Left children are handled right
    /// away so they can reuse their parent's automaton; right children wait on a stack. The
    /// order does not change the set of blocks: each window's answer depends on it alone.
    fn for_each_block(&mut self, mut visit: impl FnMut(Block)) {
        let (la, lb) = (self.a.len(), self.b.len());
        let mut stack = std::mem::take(&mut self.s.queue);
        stack.clear();
        stack.push((0, la, 0, lb));
        self.s.sam_window = None;
        while let Some((mut alo, mut ahi, mut blo, mut bhi)) = stack.pop() {
            loop {
                let (i, j, k) = self.longest_in(alo, ahi, blo, bhi);
                if k == 0 {
                    break;
                }
                visit((i, j, k));
                if i + k < ahi && j + k < bhi {
                    stack.push((i + k, ahi, j + k, bhi));
                }
                if alo < i && blo < j {
                    (ahi, bhi) = (i, j);
                    let _ = (&mut alo, &mut blo);
                } else {
                    break;
                }
            }
        }
        self.s.queue = stack;
    }

    /// CPython's loop over `b2j`, with `j2len` kept as two generation-stamped rows.
    fn longest_dp(&mut self, alo: usize, ahi: usize, blo: usize, bhi: usize) -> Block {
        if !self.b2j_ready {
            self.build_b2j();
        }
        let (a, s) = (self.a, &mut *self.s);
        let (mut besti, mut bestj, mut bestsize) = (alo, blo, 0usize);
        // Generations separate rows and calls: a run recorded earlier must never look like
        // the previous row. On wrap-around, clear the rows and start over.
        if s.generation as usize + (ahi - alo) + 2 >= u32::MAX as usize {
            s.cells.iter_mut().for_each(|c| c.fill(0));
            s.generation = 0;
        }
        s.generation += 1;
        for (i, &x) in a.iter().enumerate().take(ahi).skip(alo) {
            s.generation += 1;
            let g = s.generation as u64;
            let id = x as usize;
            if id >= s.popular.len() || s.popular[id] {
                continue;
            }
            let cur = (g & 1) as usize;
            let (row_cur, row_prev) = {
                let (c0, c1) = s.cells.split_at_mut(1);
                if cur == 0 {
                    (&mut c0[0], &c1[0])
                } else {
                    (&mut c1[0], &c0[0])
                }
            };
            let occ = &s.positions[s.offsets[id] as usize..s.offsets[id + 1] as usize];
            let start = occ.partition_point(|&j| (j as usize) < blo);
            let want = (g - 1) << 32;
            for &j in &occ[start..] {
                let j = j as usize;
                if j >= bhi {
                    break;
                }
                // j2len[j-1] of the previous row lives at index j (index = position + 1).
                let prev = row_prev[j];
                let k = if prev & 0xffff_ffff_0000_0000 == want { (prev as u32) + 1 } else { 1 };
                row_cur[j + 1] = (g << 32) | k as u64;
                let k = k as usize;
                if k > bestsize {
                    besti = i + 1 - k;
                    bestj = j + 1 - k;
                    bestsize = k;
                }
            }
        }
        (besti, bestj, bestsize)
    }

    /// With no junk function every element is "non-junk": extend over equal elements, which
    /// only changes anything when popular elements were purged from b2j.
    fn extend_block(
        &self,
        mut besti: usize,
        mut bestj: usize,
        mut bestsize: usize,
        r: (usize, usize, usize, usize),
    ) -> Block {
        let (alo, ahi, blo, bhi) = r;
        let (a, b) = (self.a, self.b);
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

    /// The DP answer, for testing the automaton against it.
    #[cfg(test)]
    fn find_longest_match_dp(&mut self, alo: usize, ahi: usize, blo: usize, bhi: usize) -> Block {
        let (i, j, k) = self.longest_dp(alo, ahi, blo, bhi);
        self.extend_block(i, j, k, (alo, ahi, blo, bhi))
    }

    #[cfg(test)]
    fn find_longest_match_sam(&mut self, alo: usize, ahi: usize, blo: usize, bhi: usize) -> Block {
        self.s.sam.build(self.b, self.n_ids, blo, bhi);
        let (i, j, k) = self.s.sam.longest(self.a, alo, ahi, blo, bhi);
        self.extend_block(i, j, k, (alo, ahi, blo, bhi))
    }

    /// The automaton of a longer window starting at `blo`, queried with a cut at `bhi`.
    #[cfg(test)]
    fn find_longest_match_sam_cut(&mut self, alo: usize, ahi: usize, blo: usize, bhi: usize) -> Block {
        self.s.sam.build(self.b, self.n_ids, blo, self.b.len());
        let (i, j, k) = self.s.sam.longest(self.a, alo, ahi, blo, bhi);
        self.extend_block(i, j, k, (alo, ahi, blo, bhi))
    }

    /// `get_matching_blocks()` without the trailing sentinel: sorted, adjacent blocks merged.
    pub fn matching_blocks(&mut self) -> Vec<Block> {
        let mut blocks = std::mem::take(&mut self.s.blocks);
        blocks.clear();
        self.for_each_block(|b| blocks.push(b));
        blocks.sort_unstable();
        let mut merged: Vec<Block> = Vec::with_capacity(blocks.len());
        for &(i, j, k) in &blocks {
            match merged.last_mut() {
                Some(last) if last.0 + last.2 == i && last.1 + last.2 == j => last.2 += k,
                _ => merged.push((i, j, k)),
            }
        }
        self.s.blocks = blocks;
        merged
    }

    /// Sum of matching-block sizes: what `ratio()` needs, without sorting or merging.
    pub fn matches(&mut self) -> usize {
        let mut total = 0;
        self.for_each_block(|(_, _, k)| total += k);
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
        CharInterner { ascii: [u32::MAX; 128], other: HashMap::default(), next: 0 }
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
        if a == b {
            // The first longest match of two equal sequences is all of them, so
            // matches == len(a) and the ratio is 2n / 2n (1.0 for two empty ones too).
            return 1.0;
        }
        self.a.clear();
        self.b.clear();
        let n_ids = if a.is_ascii() && b.is_ascii() {
            // Bytes are code points: use them as ids directly.
            self.a.extend(a.bytes().map(u32::from));
            self.b.extend(b.bytes().map(u32::from));
            128
        } else {
            self.chars.reset();
            for c in b.chars() {
                let id = self.chars.id(c);
                self.b.push(id);
            }
            for c in a.chars() {
                let id = self.chars.id(c);
                self.a.push(id);
            }
            self.chars.next as usize
        };
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
    // CPython: `if group and not (len(group)==1 and group[0][0] == "equal")`.
    if !(group.is_empty() || (group.len() == 1 && group[0].0 == Tag::Equal)) {
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
/// lines (which the SWE-RL reward drops), joined with `\n`. Empty when the inputs are equal.
pub fn unified_diff_text(a: &[&str], b: &[&str], n: usize) -> String {
    let mut ids: HashMap<&str, u32> = HashMap::default();
    ids.reserve(a.len() + b.len());
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
    // unified_diff constructs SequenceMatcher(None, a, b): autojunk stays at its default, True.
    let blocks = SCRATCH.with(|s| Matcher::new(&a_ids, &b_ids, ids.len(), true, &mut s.borrow_mut()).matching_blocks());
    let mut out = String::new();
    let line = |out: &mut String, prefix: char, text: &str| {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push(prefix);
        out.push_str(text);
    };
    for group in grouped_opcodes(opcodes(&blocks, a.len(), b.len()), n) {
        let (first, last) = (group[0], group[group.len() - 1]);
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&format!("@@ -{} +{} @@", format_range(first.1, last.2), format_range(first.3, last.4)));
        for (tag, i1, i2, j1, j2) in group {
            if tag == Tag::Equal {
                a[i1..i2].iter().for_each(|l| line(&mut out, ' ', l));
                continue;
            }
            if matches!(tag, Tag::Replace | Tag::Delete) {
                a[i1..i2].iter().for_each(|l| line(&mut out, '-', l));
            }
            if matches!(tag, Tag::Replace | Tag::Insert) {
                b[j1..j2].iter().for_each(|l| line(&mut out, '+', l));
            }
        }
    }
    out
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// [`unified_diff_text`] as separate lines (for tests and callers that want lines).
pub fn unified_diff_body(a: &[&str], b: &[&str], n: usize) -> Vec<String> {
    let text = unified_diff_text(a, b, n);
    if text.is_empty() {
        Vec::new()
    } else {
        text.split('\n').map(str::to_string).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Expected ratios below were computed with CPython 3.11's difflib by hand, not by this code.
    #[test]
    fn ratio_known_values() {
        assert_eq!(ratio("", ""), 1.0);
        assert_eq!(ratio("same text\n", "same text\n"), 1.0);
        assert_eq!(ratio("é€😀", "é€😀"), 1.0);
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
    fn automaton_agrees_with_the_dp_on_every_window() {
        // Small alphabets make ties and repeats common, which is where tie-breaking matters.
        let mut seed = 0x2545f4914f6cdd1du64;
        let mut rnd = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut s = Scratch::default();
        for round in 0..400 {
            let sigma = 2 + rnd(5);
            let la = 1 + rnd(60) as usize;
            let lb = 1 + rnd(60) as usize;
            let a: Vec<u32> = (0..la).map(|_| rnd(sigma) as u32).collect();
            let b: Vec<u32> = (0..lb).map(|_| rnd(sigma) as u32).collect();
            let mut m = Matcher::new(&a, &b, sigma as usize, false, &mut s);
            for _ in 0..8 {
                let (alo, blo) = (rnd(la as u64) as usize, rnd(lb as u64) as usize);
                let ahi = alo + 1 + rnd((la - alo) as u64) as usize;
                let bhi = blo + 1 + rnd((lb - blo) as u64) as usize;
                let dp = m.find_longest_match_dp(alo, ahi, blo, bhi);
                let sam = m.find_longest_match_sam(alo, ahi, blo, bhi);
                assert_eq!(dp, sam, "round {round}: a={a:?} b={b:?} window=({alo},{ahi},{blo},{bhi})");
                let cut = m.find_longest_match_sam_cut(alo, ahi, blo, bhi);
                assert_eq!(dp, cut, "round {round} (cut): a={a:?} b={b:?} window=({alo},{ahi},{blo},{bhi})");
            }
        }
    }

    /// CPython's get_matching_blocks written plainly with the DP, as the reference for the
    /// optimised traversal (automaton, left-spine reuse, any processing order).
    fn blocks_by_dp(a: &[u32], b: &[u32], n_ids: usize) -> Vec<Block> {
        let mut s = Scratch::default();
        let mut m = Matcher::new(a, b, n_ids, false, &mut s);
        let mut queue = vec![(0, a.len(), 0, b.len())];
        let mut blocks = Vec::new();
        while let Some((alo, ahi, blo, bhi)) = queue.pop() {
            let (i, j, k) = m.find_longest_match_dp(alo, ahi, blo, bhi);
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
        blocks
    }

    #[test]
    fn optimised_blocks_equal_the_plain_dp() {
        let mut seed = 0x853c49e6748fea9bu64;
        let mut rnd = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut s = Scratch::default();
        for round in 0..300 {
            // Long enough to take the automaton path; mutations keep the two similar.
            let sigma = 2 + rnd(20);
            let lb = 50 + rnd(600) as usize;
            let b: Vec<u32> = (0..lb).map(|_| rnd(sigma) as u32).collect();
            let mut a = b.clone();
            for _ in 0..rnd(30) {
                let at = rnd(a.len() as u64) as usize;
                match rnd(3) {
                    0 => a[at] = rnd(sigma) as u32,
                    1 => a.insert(at, rnd(sigma) as u32),
                    _ => {
                        a.remove(at);
                    }
                }
                if a.is_empty() {
                    a.push(0);
                }
            }
            let want = blocks_by_dp(&a, &b, sigma as usize);
            let mut merged_want: Vec<Block> = Vec::new();
            for &(i, j, k) in &want {
                match merged_want.last_mut() {
                    Some(l) if l.0 + l.2 == i && l.1 + l.2 == j => l.2 += k,
                    _ => merged_want.push((i, j, k)),
                }
            }
            let got = Matcher::new(&a, &b, sigma as usize, false, &mut s).matching_blocks();
            assert_eq!(got, merged_want, "round {round}");
            let total: usize = want.iter().map(|x| x.2).sum();
            assert_eq!(Matcher::new(&a, &b, sigma as usize, false, &mut s).matches(), total, "round {round}");
        }
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
