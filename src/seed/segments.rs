//! Code segments for prompts whose whole files do not fit the budget: SWE-RL's repair prompt
//! shows "code segments, each from a relevant file", not whole files.
//!
//! A changed file keeps the lines of every hunk of its patch (with the patch's own context
//! lines, so a correct SEARCH block can always be written), widened to the enclosing
//! definition (the `def`/`fn`/`class` block, found by indentation, unless it is too long), with
//! the header line of every scope around it (a method's class) and the file's first lines.
//! A relevant file keeps the windows that share the most words with the problem statement.
//! Segments that are close are merged; an elision line stands for what is left out.

use std::collections::HashSet;
use std::sync::LazyLock;

use regex::Regex;

/// Lines of context around each region, and the gap under which two regions merge.
const PAD: usize = 2;
const MERGE_GAP: usize = 4;
/// A definition longer than this is not shown whole: its header and the hunk's surroundings.
const MAX_BLOCK: usize = 120;
/// The first lines of a file (imports, module docstring) shown with the segments.
const HEAD_LINES: usize = 8;
/// A relevant file's windows: their length and how many are shown.
const WINDOW: usize = 30;
const WINDOWS: usize = 2;

static DEF: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"^\s*(?:(?:pub(?:\([^)]*\))?|async|static|export|default|private|public|protected|internal|override|final|abstract|unsafe|const|extern(?:\s+"[^"]*")?|inline|virtual)\s+)*(?:def|class|fn|func|function|impl|struct|enum|trait|interface|mod|module|object|type|record)\b"#,
    )
    .expect("valid regex")
});

/// The lines of `content` without their `\n` (a `\r` stays: a CRLF file's lines are shown as
/// they are).
fn split_lines(content: &str) -> Vec<&str> {
    let mut v: Vec<&str> = content.split('\n').collect();
    if content.ends_with('\n') {
        v.pop();
    }
    v
}

/// The elision line for the (1-based, inclusive) lines `from..=to`.
pub fn elision(from: usize, to: usize) -> String {
    format!("... (lines {from}-{to} not shown) ...")
}

/// The old-side line ranges (0-based, half-open) of the hunks of a unified `patch`.
pub fn hunk_ranges(patch: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for l in patch.lines() {
        let Some(rest) = l.strip_prefix("@@ -") else { continue };
        let old = rest.split(' ').next().unwrap_or("");
        let mut it = old.split(',');
        let start: usize = it.next().and_then(|s| s.parse().ok()).unwrap_or(0);
        let len: usize = it.next().and_then(|s| s.parse().ok()).unwrap_or(1);
        // `-a,0` inserts after line a (1-based): show that line.
        let (s, e) = if len == 0 { (start.saturating_sub(1), start + 1) } else { (start - 1, start - 1 + len) };
        out.push((s, e.max(s + 1)));
    }
    out
}

fn indent(line: &str) -> Option<usize> {
    if line.trim().is_empty() {
        return None;
    }
    Some(line.chars().take_while(|c| c.is_whitespace()).map(|c| if c == '\t' { 4 } else { 1 }).sum())
}

/// The indentation a region is at: of its first non-blank line (or of the next one).
fn region_indent(lines: &[&str], s: usize) -> usize {
    lines[s.min(lines.len())..].iter().find_map(|l| indent(l)).unwrap_or(0)
}

/// The scope headers around line `s`, innermost first: each earlier line indented less than
/// the one before.
fn headers(lines: &[&str], s: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut cur = region_indent(lines, s);
    let mut k = s.min(lines.len());
    while cur > 0 && k > 0 {
        k -= 1;
        if let Some(i) = indent(lines[k]) {
            if i < cur {
                out.push(k);
                cur = i;
            }
        }
    }
    out
}

/// Where the block that starts at `h` ends (exclusive): the next line indented no deeper, and
/// that line too when it closes the block (`}`, `end`).
fn block_end(lines: &[&str], h: usize) -> usize {
    let base = indent(lines[h]).unwrap_or(0);
    for (k, l) in lines.iter().enumerate().skip(h + 1) {
        if let Some(i) = indent(l) {
            if i <= base {
                let t = l.trim_start();
                let closes = t.starts_with('}') || t.starts_with(')') || t.starts_with(']') || t == "end";
                return if closes { k + 1 } else { k };
            }
        }
    }
    lines.len()
}

fn merge(mut ranges: Vec<(usize, usize)>, n: usize) -> Vec<(usize, usize)> {
    ranges.retain(|r| r.0 < n);
    ranges.sort();
    let mut out: Vec<(usize, usize)> = Vec::new();
    for (s, e) in ranges {
        let e = e.min(n);
        match out.last_mut() {
            Some(last) if s <= last.1 + MERGE_GAP => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// `ranges` of `content` with elision lines between them (and where the file goes on).
fn render(lines: &[&str], ranges: &[(usize, usize)]) -> String {
    let mut out = Vec::new();
    let mut at = 0;
    for &(s, e) in ranges {
        if s > at {
            out.push(elision(at + 1, s));
        }
        out.extend(lines[s..e].iter().map(|l| l.to_string()));
        at = e;
    }
    if at < lines.len() {
        out.push(elision(at + 1, lines.len()));
    }
    out.join("\n")
}

/// The regions of a changed file to show for the hunks of its `patch`.
pub fn changed_regions(content: &str, patch: &str) -> Vec<(usize, usize)> {
    let lines = split_lines(content);
    let n = lines.len();
    let mut ranges = vec![(0, HEAD_LINES.min(n))];
    for (s, e) in hunk_ranges(patch) {
        let (s, e) = (s.min(n), e.min(n));
        ranges.push((s.saturating_sub(PAD), (e + PAD).min(n)));
        let hs = headers(&lines, s);
        for &h in &hs {
            ranges.push((h, h + 1));
        }
        if let Some(&d) = hs.iter().find(|&&h| DEF.is_match(lines[h])) {
            let end = block_end(&lines, d);
            if end - d <= MAX_BLOCK {
                ranges.push((d, end.max(e)));
            }
        }
    }
    merge(ranges, n)
}

/// The regions of an unchanged (relevant) file that share the most words with `query`.
pub fn relevant_regions(content: &str, query: &HashSet<String>) -> Vec<(usize, usize)> {
    let lines = split_lines(content);
    let n = lines.len();
    let mut scored: Vec<(usize, usize)> = Vec::new();
    let mut s = 0;
    while s < n {
        let words: HashSet<String> = words(&lines[s..(s + WINDOW).min(n)].join("\n"));
        scored.push((words.intersection(query).count(), s));
        s += WINDOW / 2;
    }
    scored.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut ranges = vec![(0, HEAD_LINES.min(n))];
    for &(_, s) in scored.iter().take(WINDOWS) {
        ranges.push((s, (s + WINDOW).min(n)));
        for h in headers(&lines, s) {
            ranges.push((h, h + 1));
        }
    }
    merge(ranges, n)
}

/// Identifier-like words of a text, lower-cased, for matching a file with the problem.
pub fn words(text: &str) -> HashSet<String> {
    text.split(|c: char| !c.is_alphanumeric() && c != '_').filter(|w| w.len() >= 3).map(|w| w.to_lowercase()).collect()
}

/// `content` cut to `ranges`.
pub fn cut(content: &str, ranges: &[(usize, usize)]) -> String {
    let lines = split_lines(content);
    render(&lines, ranges)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hunk_in_a_method_keeps_the_def_and_class_lines_and_its_own_lines() {
        let mut src = String::from("import os\n\n");
        for i in 0..40 {
            src.push_str(&format!("def helper_{i}():\n    return {i}\n\n"));
        }
        src.push_str("class Parser:\n    \"\"\"Parses.\"\"\"\n\n");
        for i in 0..10 {
            src.push_str(&format!("    def other_{i}(self):\n        return {i}\n\n"));
        }
        let def_line = src.lines().count() + 1;
        src.push_str("    def parse(self, text):\n");
        for i in 0..30 {
            src.push_str(&format!("        step_{i} = text[{i}]\n"));
        }
        src.push_str("        return step_0\n\n\ndef tail():\n    pass\n");
        // A hunk 20 lines into the method: lines 21-27 of it.
        let at = def_line + 20;
        let patch = format!("@@ -{at},7 +{at},7 @@\n");
        let ranges = changed_regions(&src, &patch);
        let shown = cut(&src, &ranges);
        let lines: Vec<&str> = src.lines().collect();
        assert!(shown.contains("class Parser:"), "{shown}");
        assert!(shown.contains("    def parse(self, text):"));
        assert!(shown.contains(&lines[at - 1..at + 6].join("\n")), "the hunk's lines, verbatim");
        assert!(!shown.contains("def helper_20"), "far code is left out");
        assert!(shown.contains("... (lines "), "{shown}");
        // A ±N-line window would not reach the def line 20 lines up.
        assert!(at - def_line > PAD + MERGE_GAP);
    }

    #[test]
    fn hunk_headers_give_old_line_ranges() {
        assert_eq!(
            hunk_ranges("@@ -3,4 +3,5 @@ def f\n x\n@@ -10 +11 @@\n@@ -7,0 +8,2 @@\n"),
            vec![(2, 6), (9, 10), (6, 8)]
        );
    }

    #[test]
    fn relevant_files_show_the_windows_that_match_the_problem() {
        let mut src = String::new();
        for i in 0..200 {
            src.push_str(&format!("x_{i} = {i}\n"));
        }
        src.push_str("def render_template(name):\n    return load(name)\n");
        let q = words("render_template fails for missing names");
        let shown = cut(&src, &relevant_regions(&src, &q));
        assert!(shown.contains("def render_template(name):"), "{shown}");
        assert!(shown.lines().count() < 80);
    }
}
