//! The user's guide is the README and `docs/`: every doc is linked from the README, every
//! relative link points at a file, and every `swelake …` command a doc shows exists, with its
//! flags, in the command line's `--help`.

use std::collections::BTreeSet;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The README, CHANGELOG and every doc, with their paths.
fn guides() -> Vec<(PathBuf, String)> {
    let mut out = vec![root().join("README.md"), root().join("CHANGELOG.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    out.extend(docs);
    out.into_iter().map(|p| (p.clone(), std::fs::read_to_string(&p).unwrap())).collect()
}

/// Every markdown link target `(target)` after `](`.
fn links(text: &str) -> Vec<&str> {
    text.match_indices("](").filter_map(|(i, _)| text[i + 2..].split(')').next()).collect()
}

#[test]
fn every_doc_is_linked_from_the_readme_and_every_link_resolves() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let linked: BTreeSet<&str> = links(&readme).into_iter().collect();
    let mut problems = Vec::new();
    for (path, text) in guides() {
        let name = path.strip_prefix(root()).unwrap().to_string_lossy().into_owned();
        if name.starts_with("docs/") && name != "docs/README.md" && !linked.contains(name.as_str()) {
            problems.push(format!("{name} is not linked from the README"));
        }
        for target in links(&text) {
            if target.starts_with("http") || target.starts_with('#') {
                continue;
            }
            let file = target.split('#').next().unwrap();
            if !path.parent().unwrap().join(file).exists() {
                problems.push(format!("{name}: the link ({target}) points at nothing"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The long flags of `cmd` and of its global arguments.
fn flags(cmd: &clap::Command, global: &clap::Command) -> BTreeSet<String> {
    cmd.get_arguments()
        .chain(global.get_arguments())
        .filter_map(|a| a.get_long().map(str::to_string))
        .chain(["help".to_string()])
        .collect()
}

/// Each `swelake SUB [SUBSUB] …` (or `cargo run -- SUB …`) invocation of a text: the words and
/// flags up to the end of its line or code span.
fn invocations(text: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut in_block = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        for prefix in ["swelake ", "cargo run -- "] {
            for (i, _) in line.match_indices(prefix) {
                // A command is code: a line of a code block, or an inline span that starts with
                // it (prose says "swelake keeps…", and `swelake_reward` is not the binary).
                let before = line[..i].chars().last();
                let code = if in_block { before.is_none_or(|c| " `($".contains(c)) } else { before == Some('`') };
                if !code {
                    continue;
                }
                let rest = line[i + prefix.len()..].split('`').next().unwrap();
                let words: Vec<String> = rest
                    .split_whitespace()
                    .take_while(|w| !w.starts_with('#') && *w != "|" && *w != "&&")
                    .map(|w| w.trim_matches(|c| matches!(c, ',' | ';' | ')' | '(' | '[' | ']')).to_string())
                    .collect();
                if words.first().is_some_and(|w| w.chars().all(|c| c.is_ascii_lowercase() || c == '-')) {
                    out.push(words);
                }
            }
        }
    }
    out
}

#[test]
fn every_command_the_docs_show_is_in_the_help() {
    let cli = swelake::cli::command();
    let mut problems = Vec::new();
    let mut seen = 0;
    for (path, text) in guides() {
        let name = path.strip_prefix(root()).unwrap().display().to_string();
        for words in invocations(&text) {
            let Some(sub) = cli.find_subcommand(&words[0]) else {
                problems.push(format!("{name}: `swelake {}` is not a command", words.join(" ")));
                continue;
            };
            seen += 1;
            let mut cmd = sub;
            let mut rest = &words[1..];
            if cmd.has_subcommands() {
                match rest.first().and_then(|w| cmd.find_subcommand(w)) {
                    Some(s) => {
                        cmd = s;
                        rest = &rest[1..];
                    }
                    None => {
                        problems.push(format!("{name}: `swelake {}` names no subcommand", words.join(" ")));
                        continue;
                    }
                }
            }
            let known = flags(cmd, &cli);
            for w in rest {
                let Some(flag) = w.strip_prefix("--") else { continue };
                let flag = flag.split('=').next().unwrap().trim_end_matches(']');
                if !flag.is_empty() && !known.contains(flag) {
                    problems.push(format!("{name}: `swelake {}`: no flag --{flag}", words.join(" ")));
                }
            }
        }
    }
    assert!(seen > 40, "only {seen} commands found in the docs");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
