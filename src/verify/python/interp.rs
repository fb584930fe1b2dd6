//! The interpreter of a PR's era: of the interpreters an operator lists (`[verify] pythons`),
//! the newest that the tree accepts (`requires-python`/`python_requires`, and its
//! `Programming Language :: Python :: 3.x` classifiers where it lists minors) and that was
//! released by the PR's merge date; where none was out by then, the oldest the tree accepts.
//! Code for Python 2 alone has no interpreter here.

use std::path::PathBuf;

use super::spec::{python_meets, Spec};

/// An interpreter an environment can be built on.
#[derive(Debug, Clone, PartialEq)]
pub struct Interpreter {
    /// Its own executable (not a shim).
    pub exe: PathBuf,
    /// `3.11.7`.
    pub version: String,
    /// `sys.base_prefix`: mounted read-only into the sandbox.
    pub prefix: PathBuf,
}

impl Interpreter {
    /// `3.11`.
    pub fn minor(&self) -> String {
        minor_of(&self.version)
    }
}

fn minor_of(version: &str) -> String {
    version.splitn(3, '.').take(2).collect::<Vec<_>>().join(".")
}

/// When each minor's first release came out (python.org's release dates).
pub fn released(minor: &str) -> Option<&'static str> {
    Some(match minor {
        "2.7" => "2010-07-03",
        "3.3" => "2012-09-29",
        "3.4" => "2014-03-16",
        "3.5" => "2015-09-13",
        "3.6" => "2016-12-23",
        "3.7" => "2018-06-27",
        "3.8" => "2019-10-14",
        "3.9" => "2020-10-05",
        "3.10" => "2021-10-04",
        "3.11" => "2022-10-24",
        "3.12" => "2023-10-02",
        "3.13" => "2024-10-07",
        "3.14" => "2025-10-07",
        _ => return None,
    })
}

/// Why no interpreter of the list serves a tree.
#[derive(Debug, Clone, PartialEq)]
pub enum NoInterpreter {
    /// The tree is Python 2 code: no Python 3 interpreter runs it.
    Python2(String),
    /// `requires-python` excludes every interpreter listed.
    NotMet(String),
}

/// Whether the tree declares Python 2 alone: `requires-python` that no 3.x meets, or version
/// classifiers that name 2.x and no 3.
fn python2_only(spec: &Spec) -> Option<String> {
    if let Some(rp) = &spec.requires_python {
        let any3 = (0..=20).any(|m| python_meets(&format!("3.{m}.0"), rp));
        if !any3 && python_meets("2.7.18", rp) {
            return Some(format!("requires-python {rp} admits Python 2 only"));
        }
    }
    let has2 = spec.classifiers.iter().any(|c| c == "2" || c.starts_with("2."));
    let has3 = spec.classifiers.iter().any(|c| c == "3" || c.starts_with("3."));
    (has2 && !has3 && spec.requires_python.is_none())
        .then(|| format!("its classifiers name Python {} only", spec.classifiers.join(", ")))
}

/// The interpreter for a tree whose spec is `spec`, merged on `merged_at` (RFC 3339), among
/// `have` (newest first or not: they are ordered here).
pub fn choose<'a>(have: &'a [Interpreter], spec: &Spec, merged_at: &str) -> Result<&'a Interpreter, NoInterpreter> {
    if let Some(why) = python2_only(spec) {
        return Err(NoInterpreter::Python2(format!("Python 2 code ({why}): no Python 2 interpreter is run here")));
    }
    let mut sorted: Vec<&Interpreter> = have.iter().collect();
    sorted.sort_by_key(|i| version_key(&i.version));
    sorted.reverse();
    let meets: Vec<&Interpreter> = sorted
        .iter()
        .copied()
        .filter(|i| spec.requires_python.as_deref().is_none_or(|rp| python_meets(&i.version, rp)))
        .collect();
    if meets.is_empty() {
        let listed: Vec<&str> = sorted.iter().map(|i| i.version.as_str()).collect();
        return Err(NoInterpreter::NotMet(format!(
            "requires-python {} is not met by python {}",
            spec.requires_python.as_deref().unwrap_or(""),
            listed.join(", ")
        )));
    }
    // The minors the classifiers name, where they name any of Python 3.
    let named: Vec<String> = spec.classifiers.iter().filter(|c| c.starts_with("3.")).map(|c| minor_of(c)).collect();
    let classified: Vec<&Interpreter> = meets.iter().copied().filter(|i| named.contains(&i.minor())).collect();
    let pool = if classified.is_empty() { &meets } else { &classified };
    let day = merged_at.get(..10).unwrap_or(merged_at);
    let out_by_then = pool.iter().copied().find(|i| released(&i.minor()).is_none_or(|r| r <= day));
    Ok(out_by_then.unwrap_or_else(|| pool.last().copied().expect("a non-empty pool")))
}

/// A version's numbers, for ordering (`3.10.13` after `3.9.18`).
pub fn version_key(v: &str) -> Vec<u64> {
    v.split('.').map(|x| x.chars().take_while(char::is_ascii_digit).collect::<String>().parse().unwrap_or(0)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(v: &str) -> Interpreter {
        Interpreter { exe: PathBuf::from(format!("/opt/py{v}/bin/python")), version: v.into(), prefix: PathBuf::new() }
    }

    #[test]
    fn the_newest_interpreter_out_by_the_prs_day_that_the_tree_accepts() {
        let have = [py("3.11.7"), py("3.8.18"), py("3.12.3"), py("3.6.15")];
        let spec = Spec::default();
        // A PR of 2020 gets 3.8 (3.11 and 3.12 came later); one of 2024 gets 3.12.
        assert_eq!(choose(&have, &spec, "2020-05-01T00:00:00Z").unwrap().version, "3.8.18");
        assert_eq!(choose(&have, &spec, "2024-05-01T00:00:00Z").unwrap().version, "3.12.3");
        // Before any listed minor was out: the oldest.
        assert_eq!(choose(&have, &spec, "2015-01-01T00:00:00Z").unwrap().version, "3.6.15");
        // requires-python rules interpreters out; classifiers narrow where they name minors.
        let spec = Spec { requires_python: Some(">=3.9".into()), ..Default::default() };
        assert_eq!(choose(&have, &spec, "2020-05-01T00:00:00Z").unwrap().version, "3.11.7");
        let spec = Spec { classifiers: vec!["3".into(), "3.6".into(), "3.7".into()], ..Default::default() };
        assert_eq!(choose(&have, &spec, "2024-05-01T00:00:00Z").unwrap().version, "3.6.15");
        let spec = Spec { requires_python: Some(">=3.13".into()), ..Default::default() };
        assert!(matches!(choose(&have, &spec, "2024-05-01T00:00:00Z"), Err(NoInterpreter::NotMet(_))));
    }

    #[test]
    fn python_2_code_is_said_to_be_so() {
        let have = [py("3.11.7")];
        let spec = Spec { classifiers: vec!["2".into(), "2.6".into(), "2.7".into()], ..Default::default() };
        assert!(matches!(choose(&have, &spec, "2013-01-01T00:00:00Z"), Err(NoInterpreter::Python2(_))));
        let spec = Spec { requires_python: Some(">=2.7, <3".into()), ..Default::default() };
        assert!(matches!(choose(&have, &spec, "2013-01-01T00:00:00Z"), Err(NoInterpreter::Python2(_))));
        // Both 2 and 3 named: a Python 3 interpreter serves it.
        let spec = Spec { classifiers: vec!["2.7".into(), "3.4".into()], ..Default::default() };
        assert_eq!(choose(&have, &spec, "2015-01-01T00:00:00Z").unwrap().version, "3.11.7");
    }
}
