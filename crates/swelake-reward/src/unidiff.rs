//! The file-level split of unified diffs that the reference's `calculate_reward_unidiff`
//! gets from the Python `unidiff` package (1.0.1): `PatchSet(text)` parsed with the same
//! state machine, then rendered per file as `str(hunk).strip()` joined by newlines, with
//! renames keyed by their source path and a `rename from X to Y` header.
//!
//! It is only what the reward needs, not a patch library: patch-info lines, modes and
//! timestamps are recognised (they steer the parser) but not kept.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::OnceLock;

use regex::Regex;

use super::pystr::{py_digit, py_digit_class, py_int, py_strip};

const DEV_NULL: &str = "/dev/null";

/// A `^`-anchored pattern and the literal text every match starts with: lines without it
/// skip the regex engine (most lines a parser sees start with none of them).
struct Anchored {
    prefix: &'static str,
    re: Regex,
}

impl Anchored {
    fn captures<'t>(&self, line: &'t str) -> Option<regex::Captures<'t>> {
        if line.starts_with(self.prefix) {
            self.re.captures(line)
        } else {
            None
        }
    }

    fn is_match(&self, line: &str) -> bool {
        line.starts_with(self.prefix) && self.re.is_match(line)
    }
}

struct Patterns {
    git_header: Anchored,
    git_header_uri: Anchored,
    git_header_no_prefix: Anchored,
    deleted_file: Anchored,
    new_file: Anchored,
    old_mode: Anchored,
    new_mode: Anchored,
    index: Anchored,
    source: Anchored,
    target: Anchored,
    /// The specification of [`hunk_header`], which parses these lines.
    #[cfg(test)]
    hunk_header: Anchored,
    binary: Anchored,
    file_prefix: Regex,
}

/// The `unidiff.constants` regexes. `\d` is spelled as Python's Unicode digit class, and the
/// patterns that end in `$` are matched against the line without its final `\n` (Python's `$`
/// also matches just before a trailing newline).
fn patterns() -> &'static Patterns {
    static P: OnceLock<Patterns> = OnceLock::new();
    P.get_or_init(|| {
        let d = format!("[{}]", py_digit_class());
        let re = |prefix: &'static str, s: &str| Anchored {
            prefix,
            re: Regex::new(&s.replace("\\d", &d)).expect("static unidiff regex"),
        };
        Patterns {
            git_header: re("diff --git ", r#"^diff --git (?P<source>"?a/[^\t\n]+"?) (?P<target>"?b/[^\t\n]+"?)"#),
            git_header_uri: re("diff --git ", r"^diff --git (?P<source>.*://[^\t\n]+) (?P<target>.*://[^\t\n]+)"),
            git_header_no_prefix: re("diff --git ", r"^diff --git (?P<source>[^\t\n]+) (?P<target>[^\t\n]+)"),
            deleted_file: re("deleted file mode ", r"^deleted file mode \d+$"),
            new_file: re("new file mode ", r"^new file mode \d+$"),
            old_mode: re("old mode ", r"^old mode \d+$"),
            new_mode: re("new mode ", r"^new mode \d+$"),
            index: re("index ", r"^index [0-9a-f]+\.\.[0-9a-f]+ \d+$"),
            source: re("--- ", r#"^--- (?P<filename>"?[^\t\n]*"?)(?:\t(?P<timestamp>[^\n]+))?"#),
            target: re("+++ ", r#"^\+\+\+ (?P<filename>"?[^\t\n]*"?)(?:\t(?P<timestamp>[^\n]+))?"#),
            #[cfg(test)]
            hunk_header: re("@@ -", r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@[ ]?(.*)"),
            binary: re(
                "Binary file",
                concat!(
                    r"^Binary files? ",
                    r"(?P<source_filename>[^\t]+?)(?:\t(?P<source_timestamp>[\s0-9:\+-]+))?",
                    r"(?: and (?P<target_filename>[^\t]+?)(?:\t(?P<target_timestamp>[\s0-9:\+-]+))?)? (differ|has changed)"
                ),
            ),
            file_prefix: Regex::new(r"^[abciow12]/").expect("static regex"),
        }
    })
}

/// Why `PatchSet` would raise; the reference turns any of these into "no files".
#[derive(Debug, PartialEq, Eq)]
pub struct ParseError(pub &'static str);

struct Hunk<'t> {
    src_start: u128,
    src_len: u128,
    tgt_start: u128,
    tgt_len: u128,
    section: &'t str,
    /// `str(line)` of each line: type character followed by the value (which keeps its `\n`).
    /// That is the input line itself except for blank lines inside a hunk.
    lines: Vec<Cow<'t, str>>,
}

impl Hunk<'_> {
    /// `str(hunk)` as unidiff renders it, into `s` (cleared first).
    fn render(&self, s: &mut String) {
        use std::fmt::Write as _;
        s.clear();
        let _ = write!(s, "@@ -{},{} +{},{} @@", self.src_start, self.src_len, self.tgt_start, self.tgt_len);
        if !self.section.is_empty() {
            s.push(' ');
            s.push_str(self.section);
        }
        s.push('\n');
        for l in &self.lines {
            s.push_str(l);
        }
    }
}

struct PatchedFile<'t> {
    source: String,
    target: String,
    binary: bool,
    hunks: Vec<Hunk<'t>>,
}

/// Python `s[2:]`, by code points.
fn skip2(s: &str) -> &str {
    match s.char_indices().nth(2) {
        Some((i, _)) => &s[i..],
        None => "",
    }
}

impl PatchedFile<'_> {
    fn new(source: &str, target: &str) -> Self {
        PatchedFile { source: source.to_string(), target: target.to_string(), binary: false, hunks: Vec::new() }
    }

    fn is_rename(&self) -> bool {
        self.source != DEV_NULL && self.target != DEV_NULL && skip2(&self.source) != skip2(&self.target)
    }

    /// `PatchedFile.path`.
    fn path(&self) -> String {
        let mut fp: &str = &self.source;
        if fp == DEV_NULL || (self.is_rename() && self.target != DEV_NULL) {
            fp = &self.target;
        }
        let quoted = fp.starts_with('"') && fp.ends_with('"');
        let mut inner: &str = fp;
        if quoted {
            // Python `fp[1:-1]`; a lone `"` gives "".
            inner = if fp.len() >= 2 { &fp[1..fp.len() - 1] } else { "" };
        }
        if patterns().file_prefix.is_match(inner) {
            inner = &inner[2..];
        }
        if quoted {
            format!("\"{inner}\"")
        } else {
            inner.to_string()
        }
    }
}

/// A run of at least one Python `\d` digit at the start of `s`: (digits, rest).
fn py_digits(s: &str) -> Option<(&str, &str)> {
    let end = s.char_indices().find(|&(_, c)| py_digit(c).is_none()).map_or(s.len(), |(i, _)| i);
    (end > 0).then(|| s.split_at(end))
}

/// The `RE_HUNK_HEADER` match of a line, `^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@[ ]?(.*)`:
/// the four numbers (optional ones `None`) and the section text. Written out because the
/// regex engine's capture pass over a Unicode-digit pattern was a visible share of scoring;
/// digits, `,`, ` ` and `+` are disjoint, so the greedy pattern has exactly one way to match.
fn hunk_header(line: &str) -> Option<([Option<&str>; 4], &str)> {
    fn pair(s: &str) -> Option<(&str, Option<&str>, &str)> {
        let (first, rest) = py_digits(s)?;
        match rest.strip_prefix(',').and_then(py_digits) {
            Some((second, rest)) => Some((first, Some(second), rest)),
            None => Some((first, None, rest)),
        }
    }
    let (src, src_len, rest) = pair(line.strip_prefix("@@ -")?)?;
    let (tgt, tgt_len, rest) = pair(rest.strip_prefix(" +")?)?;
    let rest = rest.strip_prefix(" @@")?;
    let rest = rest.strip_prefix(' ').unwrap_or(rest);
    // `.` stops at the first newline.
    let section = rest.split('\n').next().unwrap_or("");
    Some(([Some(src), src_len, Some(tgt), tgt_len], section))
}

/// `StringIO` line iteration: split after each `\n`, keeping it; only `\n` ends a line.
fn stringio_lines(text: &str) -> Vec<&str> {
    text.split_inclusive('\n').collect()
}

fn without_newline(line: &str) -> &str {
    line.strip_suffix('\n').unwrap_or(line)
}

/// `PatchSet(text)`: the parsed files, or the error unidiff would raise.
fn parse_patchset(text: &str) -> Result<Vec<PatchedFile<'_>>, ParseError> {
    let p = patterns();
    let lines = stringio_lines(text);
    let mut it = lines.into_iter();
    let mut files: Vec<PatchedFile> = Vec::new();
    let mut current: Option<usize> = None;
    let mut in_patch_info = false;
    let mut pending_source: Option<String> = None;

    while let Some(line) = it.next() {
        let git = p
            .git_header
            .captures(line)
            .or_else(|| p.git_header_uri.captures(line))
            .or_else(|| p.git_header_no_prefix.captures(line));
        if let Some(c) = git {
            in_patch_info = true;
            files.push(PatchedFile::new(&c["source"], &c["target"]));
            current = Some(files.len() - 1);
            continue;
        }
        let bare = without_newline(line);
        if p.new_file.is_match(bare) {
            match current {
                Some(f) if in_patch_info => files[f].source = DEV_NULL.to_string(),
                _ => return Err(ParseError("Unexpected new file found")),
            }
            continue;
        }
        if p.deleted_file.is_match(bare) {
            match current {
                Some(f) if in_patch_info => files[f].target = DEV_NULL.to_string(),
                _ => return Err(ParseError("Unexpected deleted file found")),
            }
            continue;
        }
        if current.is_some()
            && in_patch_info
            && (p.old_mode.is_match(bare) || p.new_mode.is_match(bare) || p.index.is_match(bare))
        {
            continue;
        }
        if let Some(c) = p.source.captures(line) {
            pending_source = Some(c["filename"].to_string());
            if current.is_some() && !in_patch_info {
                current = None;
            }
            continue;
        }
        if let Some(c) = p.target.captures(line) {
            let target = &c["filename"];
            match current {
                Some(f) => {
                    if files[f].target != target {
                        return Err(ParseError("Target without source"));
                    }
                }
                None => {
                    let Some(source) = pending_source.take() else {
                        return Err(ParseError("Target without source"));
                    };
                    files.push(PatchedFile::new(&source, target));
                    current = Some(files.len() - 1);
                    in_patch_info = false;
                }
            }
            continue;
        }
        if let Some((numbers, section)) = hunk_header(line) {
            in_patch_info = false;
            let Some(f) = current else {
                return Err(ParseError("Unexpected hunk found"));
            };
            let num = |i: usize, default: u128| -> Result<u128, ParseError> {
                match numbers[i] {
                    Some(m) => py_int(m).ok_or(ParseError("hunk number out of range")),
                    None => Ok(default),
                }
            };
            let hunk = Hunk {
                src_start: num(0, 0)?,
                src_len: num(1, 1)?,
                tgt_start: num(2, 0)?,
                tgt_len: num(3, 1)?,
                section,
                lines: Vec::new(),
            };
            let hunk = parse_hunk(hunk, &mut it)?;
            files[f].hunks.push(hunk);
            continue;
        }
        if line.starts_with("\\ No newline at end of file") {
            let Some(f) = current else {
                return Err(ParseError("Unexpected marker"));
            };
            let Some(h) = files[f].hunks.last_mut() else {
                return Err(ParseError("Unexpected marker"));
            };
            h.lines.push(Cow::Borrowed("\\ No newline at end of file\n"));
            continue;
        }
        if line == "\n" {
            if let Some(f) = current {
                if let Some(h) = files[f].hunks.last_mut() {
                    h.lines.push(Cow::Borrowed("\n"));
                    continue;
                }
            }
        }
        if !in_patch_info {
            current = None;
            in_patch_info = true;
        }
        if let Some(c) = p.binary.captures(line) {
            let source = c["source_filename"].to_string();
            let target = c.name("target_filename").map_or(source.clone(), |m| m.as_str().to_string());
            match current {
                Some(f) => files[f].binary = true,
                None => {
                    let mut pf = PatchedFile::new(&source, &target);
                    pf.binary = true;
                    files.push(pf);
                }
            }
            in_patch_info = false;
            current = None;
            continue;
        }
        if line == "GIT binary patch\n" {
            let Some(f) = current else {
                return Err(ParseError("Unexpected binary patch marker"));
            };
            files[f].binary = true;
            in_patch_info = false;
            current = None;
            continue;
        }
        // Anything else is patch info, which the reward does not use.
    }
    Ok(files)
}

/// `PatchedFile._parse_hunk`: consumes lines from the shared iterator until the header's
/// line counts are met; the completeness check runs only after a line has been read.
fn parse_hunk<'t>(mut hunk: Hunk<'t>, it: &mut impl Iterator<Item = &'t str>) -> Result<Hunk<'t>, ParseError> {
    let mut src = hunk.src_start;
    let mut tgt = hunk.tgt_start;
    let exp_src = hunk.src_start.checked_add(hunk.src_len).ok_or(ParseError("hunk number out of range"))?;
    let exp_tgt = hunk.tgt_start.checked_add(hunk.tgt_len).ok_or(ParseError("hunk number out of range"))?;
    for line in it.by_ref() {
        let first = line.chars().next();
        // `str(line)` is the type character and the value: the line itself, but for blank ones.
        let (kind, rendered): (char, Cow<'t, str>) = match first {
            Some(c @ ('-' | ' ' | '+' | '\\')) => (c, Cow::Borrowed(line)),
            Some('\r' | '\n') => {
                // RE_HUNK_EMPTY_BODY_LINE: an empty type and 1-2 leading CR/LF characters;
                // the rest of such a line is dropped. The empty type counts as context.
                let n = line.bytes().take(2).take_while(|b| *b == b'\r' || *b == b'\n').count();
                (' ', Cow::Owned(format!(" {}", &line[..n])))
            }
            _ => return Err(ParseError("Hunk diff line expected")),
        };
        match kind {
            '+' => tgt += 1,
            '-' => src += 1,
            ' ' => {
                src += 1;
                tgt += 1;
            }
            _ => {}
        }
        if src > exp_src || tgt > exp_tgt {
            return Err(ParseError("Hunk is longer than expected"));
        }
        hunk.lines.push(rendered);
        if src == exp_src && tgt == exp_tgt {
            break;
        }
    }
    if src < exp_src || tgt < exp_tgt {
        return Err(ParseError("Hunk is shorter than expected"));
    }
    Ok(hunk)
}

/// The reference's `get_filelevel_diff`: path → normalised per-file change text. A patch
/// that unidiff cannot parse contributes no files at all, exactly as in the reference.
pub fn filelevel_diff(patch_text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Ok(files) = parse_patchset(patch_text) else {
        return out;
    };
    let mut hunk = String::new();
    for f in &files {
        if f.binary {
            continue;
        }
        let (header, path) = if f.is_rename() {
            let src = f.source.strip_prefix("a/").unwrap_or(&f.source);
            let tgt = f.target.strip_prefix("b/").unwrap_or(&f.target);
            (format!("rename from {src} to {tgt}"), src.to_string())
        } else {
            (String::new(), f.path())
        };
        // `"\n".join([header] + [str(h).strip() for h in hunks]).strip()`
        let mut content = header;
        for h in &f.hunks {
            h.render(&mut hunk);
            content.push('\n');
            content.push_str(py_strip(&hunk));
        }
        if f.hunks.is_empty() {
            content.push('\n');
        }
        out.insert(path, py_strip(&content).to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // Expected outputs were produced by running the reference get_filelevel_diff with
    // unidiff 1.0.1 on these inputs (see bench/reward_baseline.py), not by this code.

    #[test]
    fn git_modify_and_no_newline_marker() {
        let patch = "diff --git a/x.py b/x.py\nindex 1234567..89abcde 100644\n--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@ def f():\n a\n-b\n+c\n\\ No newline at end of file\n";
        let got = filelevel_diff(patch);
        assert_eq!(got.len(), 1);
        assert_eq!(got["x.py"], "@@ -1,2 +1,2 @@ def f():\n a\n-b\n+c\n\\ No newline at end of file");
    }

    #[test]
    fn rename_new_delete_binary() {
        let patch = concat!(
            "diff --git a/old.py b/new.py\nsimilarity index 90%\nrename from old.py\nrename to new.py\n",
            "--- a/old.py\n+++ b/new.py\n@@ -1 +1 @@\n-x\n+y\n",
            "diff --git a/n.txt b/n.txt\nnew file mode 100644\nindex 0000000..e69de29\n--- /dev/null\n+++ b/n.txt\n@@ -0,0 +1 @@\n+hi\n",
            "diff --git a/d.txt b/d.txt\ndeleted file mode 100644\n--- a/d.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-bye\n",
            "diff --git a/img.png b/img.png\nindex 1111111..2222222 100644\nBinary files a/img.png and b/img.png differ\n",
        );
        let got = filelevel_diff(patch);
        let keys: Vec<&str> = got.keys().map(|s| s.as_str()).collect();
        assert_eq!(keys, vec!["d.txt", "n.txt", "old.py"]);
        assert_eq!(got["old.py"], "rename from old.py to new.py\n@@ -1,1 +1,1 @@\n-x\n+y");
        assert_eq!(got["n.txt"], "@@ -0,0 +1,1 @@\n+hi");
        assert_eq!(got["d.txt"], "@@ -1,1 +0,0 @@\n-bye");
    }

    #[test]
    fn malformed_patches_yield_nothing() {
        // Hunk longer than its header says (the target side overflows before the source ends).
        assert!(filelevel_diff("--- a/x\n+++ b/x\n@@ -1,2 +1 @@\n-a\n+b\n+c\n").is_empty());
        // Hunk shorter than its header says.
        assert!(filelevel_diff("--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n-a\n").is_empty());
        // A line after a complete hunk is patch info, not part of the hunk.
        assert_eq!(filelevel_diff("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n+c\n")["x"], "@@ -1,1 +1,1 @@\n-a\n+b");
        // Hunk before any file header.
        assert!(filelevel_diff("@@ -1 +1 @@\n-a\n+b\n").is_empty());
        // Not a diff at all.
        assert!(filelevel_diff("hello\nworld\n").is_empty());
        // A malformed header line is patch info, not a hunk: the file has no hunks.
        assert_eq!(filelevel_diff("--- a/x\n+++ b/x\n@@ --1 +1 @@\n-a\n+b\n")["x"], "");
    }

    /// The hand-written hunk header parser against the reference pattern, on lines built to
    /// stress it: optional counts, non-ASCII digits, missing pieces, trailing text.
    #[test]
    fn hunk_header_parser_is_the_regex() {
        let p = patterns();
        let pieces =
            ["@@ -", "@@", " +", "+", ",", " @@", " ", "1", "23", "\u{663}", "x", "\n", "\r", "é", "-", "@@ -1 +1 @@"];
        let mut rng = swelake_core::rng::Rng::new(0x2545f4914f6cdd1d);
        let mut next = || rng.next_u64();
        let mut matched = 0;
        for round in 0..50_000 {
            let mut line = String::new();
            for _ in 0..1 + next() % 12 {
                line.push_str(pieces[(next() % pieces.len() as u64) as usize]);
            }
            if next().is_multiple_of(2) {
                line = format!("@@ -{line}");
            }
            let want = p.hunk_header.re.captures(&line).map(|c| {
                let nums = [1, 2, 3, 4].map(|i| c.get(i).map(|m| m.as_str()));
                (nums, c.get(5).map_or("", |m| m.as_str()))
            });
            let got = hunk_header(&line);
            assert_eq!(got, want, "round {round}: {line:?}");
            matched += usize::from(got.is_some());
        }
        assert!(matched > 1000, "too few matching lines generated: {matched}");
    }

    /// A prefilter literal that disagreed with its regex would silently drop header lines.
    #[test]
    fn prefilters_pass_the_lines_their_regexes_match() {
        let p = patterns();
        let cases: [(&Anchored, &str); 12] = [
            (&p.git_header, "diff --git a/x.py b/x.py"),
            (&p.git_header_uri, "diff --git s3://b/x s3://b/y"),
            (&p.git_header_no_prefix, "diff --git x.py y.py"),
            (&p.deleted_file, "deleted file mode 100644"),
            (&p.new_file, "new file mode 100644"),
            (&p.old_mode, "old mode 100644"),
            (&p.new_mode, "new mode 100755"),
            (&p.index, "index 1234567..89abcde 100644"),
            (&p.source, "--- a/x.py\t2020-01-01 00:00:00"),
            (&p.target, "+++ b/x.py"),
            (&p.hunk_header, "@@ -1,2 +3 @@ def f():"),
            (&p.binary, "Binary files a/x.png and b/x.png differ"),
        ];
        for (pattern, line) in cases {
            assert!(pattern.re.is_match(line), "regex rejects {line:?}");
            assert!(pattern.is_match(line) && pattern.captures(line).is_some(), "prefilter rejects {line:?}");
            assert!(!pattern.is_match(&format!(" {line}")), "anchored pattern matched mid-line: {line:?}");
        }
    }

    #[test]
    fn empty_line_inside_hunk_becomes_context() {
        let got = filelevel_diff("--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n a\n\n-b\n+c\n");
        assert_eq!(got["x"], "@@ -1,3 +1,3 @@\n a\n \n-b\n+c");
    }
}
