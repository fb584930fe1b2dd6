//! Synthetic stretches of GH Archive made from real hour files: many copies of every real
//! event per hour under renamed repositories, fresh ids and times, so that days of archive-sized
//! input exist offline. What the benchmarks (`bench jobs`, `bench backfill`) and the scale tests
//! run on; the demo's own small world is [`crate::samples`].

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// How [`synthesize_hours`] builds a synthetic stretch of GH Archive from real hour files.
#[derive(Debug, Clone)]
pub struct SynthOptions {
    /// Real hour files whose events are copied (`.json` or `.json.gz`).
    pub sources: Vec<PathBuf>,
    /// The first hour written, `YYYY-MM-DD-H`.
    pub first_hour: String,
    pub hours: usize,
    /// Copies of every source event per hour, each under renamed repositories.
    pub copies: usize,
    /// Hours already generated before `first_hour` by earlier calls (a backfill made a day at
    /// a time): names, ids and the carried-over copies continue from where those left off.
    pub hours_before: usize,
}

/// Writes `hours` consecutive gzipped hour files into `dir`, each holding `copies` copies of
/// every source event with the repositories renamed per copy (`owner/name` →
/// `owner/name-gK`, in every field and text that names them), fresh event ids, and the
/// event's time moved into that hour (minutes and seconds kept). Half of an hour's copies
/// reuse the previous hour's names, so a PR opened in one hour is merged or commented on in
/// the next, as in the real archive. Hours are written in parallel. Returns the files written.
pub fn synthesize_hours(o: &SynthOptions, dir: &Path) -> Result<Vec<PathBuf>> {
    use std::io::Read;
    let first = chrono::NaiveDateTime::parse_from_str(&format!("{}:00:00", o.first_hour), "%Y-%m-%d-%H:%M:%S")
        .with_context(|| format!("hour `{}`: expected YYYY-MM-DD-H", o.first_hour))?;
    let mut lines: Vec<(String, String)> = Vec::new();
    // Repository ids get a copy's offset too: the PR jobs join pushes to PRs by repository id,
    // and copies that shared ids would each see every other copy's pushes.
    let mut repo_ids: std::collections::HashSet<u64> = std::collections::HashSet::new();
    for src in &o.sources {
        let raw = std::fs::read(src).with_context(|| format!("reading {}", src.display()))?;
        let mut text = String::new();
        if src.extension().is_some_and(|e| e == "gz") {
            flate2::read::MultiGzDecoder::new(&raw[..])
                .read_to_string(&mut text)
                .with_context(|| format!("decompressing {}", src.display()))?;
        } else {
            text = String::from_utf8(raw).with_context(|| format!("{} is not UTF-8", src.display()))?;
        }
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            #[derive(serde::Deserialize)]
            struct Repo {
                name: String,
                #[serde(default)]
                id: Option<u64>,
            }
            #[derive(serde::Deserialize)]
            struct Head {
                repo: Repo,
            }
            // Lines that do not parse are copied as they are: the ingest rejects them, as
            // it would in the real archive.
            let (repo, id) = serde_json::from_str::<Head>(line).map(|h| (h.repo.name, h.repo.id)).unwrap_or_default();
            repo_ids.extend(id);
            lines.push((repo, line.to_string()));
        }
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let half = (o.copies / 2).max(1);
    use rayon::prelude::*;
    (0..o.hours)
        .into_par_iter()
        .map(|k| {
            let t = first + chrono::Duration::hours(k as i64);
            // The hour's index in the whole generated stretch: names and ids follow it.
            let h = o.hours_before + k;
            let stamp = t.format("%Y-%m-%dT%H").to_string();
            let path = dir.join(format!("{}-{}.json.gz", t.format("%Y-%m-%d"), chrono::Timelike::hour(&t)));
            let file = std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
            let mut gz = flate2::write::GzEncoder::new(std::io::BufWriter::new(file), flate2::Compression::fast());
            for c in 0..o.copies {
                let group = h * half + c;
                for (i, (repo, line)) in lines.iter().enumerate() {
                    let mut l = if repo.is_empty() {
                        line.clone()
                    } else {
                        rename_repo(line, repo, &format!("{repo}-g{group}"))
                    };
                    l = reid_repos(&l, &repo_ids, group as u64 * 10_000_000_000);
                    l = retime(&l, &stamp);
                    l = reid(&l, &format!("{}{:06}{:07}", h + 1, c, i));
                    gz.write_all(l.as_bytes())?;
                    gz.write_all(b"\n")?;
                }
            }
            gz.finish()?.flush()?;
            Ok(path)
        })
        .collect()
}

/// `line` with every whole occurrence of `from` (not followed by a name character) replaced.
fn rename_repo(line: &str, from: &str, to: &str) -> String {
    let mut out = String::with_capacity(line.len() + 64);
    let mut rest = line;
    while let Some(i) = rest.find(from) {
        let after = &rest[i + from.len()..];
        let whole = !after.chars().next().is_some_and(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            || after.starts_with(".git");
        out.push_str(&rest[..i]);
        out.push_str(if whole { to } else { from });
        rest = after;
    }
    out.push_str(rest);
    out
}

/// The event's own time (the line's last `"created_at":"YYYY-MM-DDTHH…`, after the payload)
/// moved to the hour `stamp`; the payload's times stay as they were.
fn retime(line: &str, stamp: &str) -> String {
    let key = "\"created_at\":\"";
    match line.rfind(key) {
        Some(i) if line.len() >= i + key.len() + 13 && line.as_bytes()[i + key.len() + 10] == b'T' => {
            let v = i + key.len();
            format!("{}{stamp}{}", &line[..v], &line[v + 13..])
        }
        _ => line.to_string(),
    }
}

/// Every `"id":N` whose N is one of `ids` (a repository's) moved by `offset`.
fn reid_repos(line: &str, ids: &std::collections::HashSet<u64>, offset: u64) -> String {
    if offset == 0 {
        return line.to_string();
    }
    let key = "\"id\":";
    let mut out = String::with_capacity(line.len() + 32);
    let mut rest = line;
    while let Some(i) = rest.find(key) {
        let v = i + key.len();
        out.push_str(&rest[..v]);
        let digits = rest[v..].bytes().take_while(u8::is_ascii_digit).count();
        match rest[v..v + digits].parse::<u64>() {
            Ok(n) if digits > 0 && ids.contains(&n) => out.push_str(&(n + offset).to_string()),
            _ => out.push_str(&rest[v..v + digits]),
        }
        rest = &rest[v + digits..];
    }
    out.push_str(rest);
    out
}

/// The event's own id (the line's first `"id":"…"`) replaced by `id`.
fn reid(line: &str, id: &str) -> String {
    let key = "\"id\":\"";
    match line.find(key) {
        Some(i) => {
            let v = i + key.len();
            match line[v..].find('"') {
                Some(end) => format!("{}{id}{}", &line[..v], &line[v + end..]),
                None => line.to_string(),
            }
        }
        None => line.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renames_whole_names_retimes_the_event_and_gives_fresh_ids() {
        let line = r#"{"id":"2489651045","repo":{"name":"a/b","url":"https://api.github.com/repos/a/b"},"payload":{"body":"see a/b#3 and a/bc, git@x:a/b.git","pull_request":{"created_at":"2014-12-30T01:02:03Z"}},"created_at":"2015-01-01T15:04:05Z"}"#;
        let out = reid(&retime(&rename_repo(line, "a/b", "a/b-g7"), "2025-03-01T22"), "1000000000001");
        assert_eq!(
            out,
            r#"{"id":"1000000000001","repo":{"name":"a/b-g7","url":"https://api.github.com/repos/a/b-g7"},"payload":{"body":"see a/b-g7#3 and a/bc, git@x:a/b-g7.git","pull_request":{"created_at":"2014-12-30T01:02:03Z"}},"created_at":"2025-03-01T22:04:05Z"}"#
        );
    }

    #[test]
    fn half_the_copies_carry_over_to_the_next_hour() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("2015-01-01-15.json");
        std::fs::write(
            &src,
            "{\"id\":\"1\",\"repo\":{\"name\":\"o/r\"},\"created_at\":\"2015-01-01T15:00:00Z\"}\nnot json\n",
        )
        .unwrap();
        let o = SynthOptions {
            sources: vec![src],
            first_hour: "2025-12-31-23".into(),
            hours: 2,
            copies: 4,
            hours_before: 0,
        };
        let files = synthesize_hours(&o, &dir.path().join("out")).unwrap();
        let names: Vec<String> = files.iter().map(|f| f.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(names, ["2025-12-31-23.json.gz", "2026-01-01-0.json.gz"]);
        let repos = |f: &Path| -> Vec<String> {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(std::fs::File::open(f).unwrap()), &mut s)
                .unwrap();
            assert_eq!(s.lines().filter(|l| *l == "not json").count(), 4, "bad lines are copied as they are");
            s.lines()
                .filter_map(|l| l.split("\"name\":\"").nth(1).map(|r| r.split('"').next().unwrap().to_string()))
                .collect()
        };
        assert_eq!(repos(&files[0]), ["o/r-g0", "o/r-g1", "o/r-g2", "o/r-g3"]);
        assert_eq!(repos(&files[1]), ["o/r-g2", "o/r-g3", "o/r-g4", "o/r-g5"]);
        // The next day, made by a second call, carries over from this one's last hour.
        let next = SynthOptions { first_hour: "2026-01-01-1".into(), hours: 1, hours_before: 2, ..o };
        let files = synthesize_hours(&next, &dir.path().join("next")).unwrap();
        assert_eq!(repos(&files[0]), ["o/r-g4", "o/r-g5", "o/r-g6", "o/r-g7"]);
        assert_eq!(
            reid_repos("{\"id\":42,\"x\":{\"id\":420}}", &[42].into(), 30_000_000_000),
            "{\"id\":30000000042,\"x\":{\"id\":420}}"
        );
    }
}
