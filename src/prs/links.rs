//! Finding the issues a pull request says it resolves, in its title, body or commit messages.
//!
//! SWE-bench's rule is a closing keyword (close/closes/closed, fix/fixes/fixed,
//! resolve/resolves/resolved) followed by `#N`, after removing HTML comments. Real PRs also
//! write `Fixes: #12`, `fixes owner/repo#12`, `fixes https://github.com/owner/repo/issues/12`,
//! `resolves #12, #13`, `closes GH-12`; all of those count here, every referenced issue is kept
//! (in order, once), and a reference to the PR's own number is dropped. Text inside HTML
//! comments, fenced code blocks and inline code spans does not count, nor does a keyword that
//! is only the tail of a longer word (`prefixes #1`) or a number glued to letters (`#12abc`).

use std::sync::OnceLock;

use regex::Regex;

/// One resolved-issue reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssueRef {
    /// `owner/name` of the issue's repository.
    pub repo: String,
    pub number: i64,
    /// The closing keyword as written, lower-cased (`fixes`, `closes`, ...).
    pub keyword: String,
}

fn patterns() -> &'static (Regex, Regex, Regex, Regex) {
    static P: OnceLock<(Regex, Regex, Regex, Regex)> = OnceLock::new();
    P.get_or_init(|| {
        let ignored = Regex::new(r"(?s)<!--.*?-->|```.*?(?:```|\z)|~~~.*?(?:~~~|\z)|`[^`\n]*`").expect("static regex");
        // A keyword at a word start, then `:`/spaces, then the first reference.
        let keyword = Regex::new(r"(?i)(?:^|[^\w/-])(close[sd]?|fix(?:e[sd])?|resolve[sd]?)(?:\s*:\s*|\s+)")
            .expect("static regex");
        // One reference: #N, GH-N, owner/repo#N, or an issue URL.
        let reference = Regex::new(
            r"^(?:https?://github\.com/(?P<url_repo>[\w.-]+/[\w.-]+)/issues/(?P<url_num>\d+)|(?P<repo>[\w.-]+/[\w.-]+)#(?P<repo_num>\d+)|(?i:gh)-(?P<gh_num>\d+)|#(?P<num>\d+))",
        )
        .expect("static regex");
        // What may join two references of one list: `, `, ` and `, ` & `, `, and `.
        let joiner = Regex::new(r"^(?:\s*,\s*(?:and\s+)?|\s+and\s+|\s*&\s*|\s+)").expect("static regex");
        (ignored, keyword, reference, joiner)
    })
}

/// Parses one reference at the start of `s`; returns it and its length.
fn reference_at(s: &str, own_repo: &str) -> Option<(String, i64, usize)> {
    let (_, _, reference, _) = patterns();
    let c = reference.captures(s)?;
    let end = c.get(0)?.end();
    // `#12abc` or `#12_` is not a reference to issue 12.
    if s[end..].chars().next().is_some_and(|ch| ch.is_alphanumeric() || ch == '_') {
        return None;
    }
    let (repo, num) = if let Some(n) = c.name("url_num") {
        (c["url_repo"].to_string(), n.as_str())
    } else if let Some(n) = c.name("repo_num") {
        (c["repo"].to_string(), n.as_str())
    } else if let Some(n) = c.name("gh_num") {
        (own_repo.to_string(), n.as_str())
    } else {
        (own_repo.to_string(), c.name("num")?.as_str())
    };
    let number: i64 = num.parse().ok()?;
    Some((repo, number, end))
}

/// The issues `text` says it resolves, for a PR `own_number` of `own_repo`.
pub fn resolving_refs(text: &str, own_repo: &str, own_number: Option<i64>) -> Vec<IssueRef> {
    let (ignored, keyword, _, joiner) = patterns();
    // Replace ignored spans with a space so words on both sides stay apart.
    let cleaned = ignored.replace_all(text, " ");
    let mut out: Vec<IssueRef> = Vec::new();
    let mut push = |repo: String, number: i64, kw: &str| {
        if number <= 0 {
            return;
        }
        if repo.eq_ignore_ascii_case(own_repo) && Some(number) == own_number {
            return;
        }
        if !out.iter().any(|r| r.repo.eq_ignore_ascii_case(&repo) && r.number == number) {
            out.push(IssueRef { repo, number, keyword: kw.to_ascii_lowercase() });
        }
    };
    for c in keyword.captures_iter(&cleaned) {
        let kw = c.get(1).map_or("", |m| m.as_str());
        let mut rest = &cleaned[c.get(0).map_or(0, |m| m.end())..];
        let Some((repo, number, len)) = reference_at(rest, own_repo) else {
            continue;
        };
        push(repo, number, kw);
        rest = &rest[len..];
        // A list: `#12, #13 and #14`.
        while let Some(j) = joiner.find(rest) {
            let after = &rest[j.end()..];
            match reference_at(after, own_repo) {
                Some((repo, number, len)) => {
                    push(repo, number, kw);
                    rest = &after[len..];
                }
                None => break,
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nums(text: &str) -> Vec<(String, i64)> {
        resolving_refs(text, "o/r", Some(99)).into_iter().map(|r| (r.repo, r.number)).collect()
    }

    fn own(n: i64) -> (String, i64) {
        ("o/r".to_string(), n)
    }

    #[test]
    fn forms_that_link() {
        let cases: Vec<(&str, Vec<(String, i64)>)> = vec![
            ("Fixes #12", vec![own(12)]),
            ("fixes: #12", vec![own(12)]),
            ("Fixes:#12", vec![own(12)]),
            ("closes #1, #2 and #3", vec![own(1), own(2), own(3)]),
            ("resolves #12, #13", vec![own(12), own(13)]),
            ("This fixes other/lib#7.", vec![("other/lib".into(), 7)]),
            ("Resolved https://github.com/a/b/issues/5", vec![("a/b".into(), 5)]),
            ("closes GH-12", vec![own(12)]),
            ("FIXED #4\nand also fix #5", vec![own(4), own(5)]),
            ("(fixes #8)", vec![own(8)]),
            ("fix #1, fix #1", vec![own(1)]),
        ];
        for (text, want) in cases {
            assert_eq!(nums(text), want, "{text:?}");
        }
        assert_eq!(resolving_refs("Closes #3", "o/r", None)[0].keyword, "closes");
    }

    #[test]
    fn near_misses_do_not_link() {
        for text in [
            "prefix #12",
            "prefixes #12",
            "fixes #12abc",
            "see #12",
            "fixes",
            "fixes #",
            "<!-- fixes #12 -->",
            "```\nfixes #12\n```",
            "run `fixes #12` in the shell",
            "fixes #99",
            "unfixed #3",
            "fixes issue 12",
            "http://example.com/fixes/#12",
        ] {
            assert!(nums(text).is_empty(), "{text:?} -> {:?}", nums(text));
        }
    }

    #[test]
    fn comment_removal_keeps_words_apart() {
        assert_eq!(nums("fix<!-- x -->es #3"), Vec::<(String, i64)>::new());
        assert_eq!(nums("<!-- template -->Fixes #3"), vec![own(3)]);
    }
}
