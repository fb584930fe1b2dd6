//! The curation config file (`config/curation.toml`): documented defaults, with a user's file
//! layered over them. A user's file names only what it changes; every other value is the
//! default, and a key the defaults do not have is an error that names it (a typo never
//! silently becomes "use the default").
//!
//! Each stage owns the type of its section (`[filters]`, `[relevance]`, `[seed]`) and reads it
//! from here; the job runner puts the sections together.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::de::DeserializeOwned;
use toml::{Table, Value};

/// The built-in defaults, with a comment for every setting.
pub const DEFAULTS: &str = include_str!("../config/curation.toml");

/// The defaults parsed, once.
fn defaults() -> &'static Table {
    static T: std::sync::OnceLock<Table> = std::sync::OnceLock::new();
    T.get_or_init(|| DEFAULTS.parse::<Table>().expect("the built-in config/curation.toml parses"))
}

/// Section `name` of the built-in defaults.
pub fn default_section<T: DeserializeOwned>(name: &str) -> T {
    let v = defaults().get(name).cloned().unwrap_or_else(|| panic!("the built-in config has no [{name}]"));
    v.try_into().unwrap_or_else(|e| panic!("the built-in [{name}] does not parse: {e}"))
}

/// The defaults with `user` (the text of a config file) layered over them: tables merge key by
/// key, any other value (numbers, strings, lists) replaces the default. `origin` names the
/// file in errors.
pub fn layered(user: &str, origin: &str) -> Result<Table> {
    let user: Table = user.parse().with_context(|| format!("parsing {origin}"))?;
    let mut merged = defaults().clone();
    merge(&mut merged, user, "", origin)?;
    Ok(merged)
}

/// The defaults, or the file at `path` layered over them.
pub fn load(path: Option<&Path>) -> Result<Table> {
    match path {
        None => Ok(defaults().clone()),
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            layered(&text, &p.display().to_string())
        }
    }
}

/// Section `name` of a merged config as its stage's type.
pub fn section<T: DeserializeOwned>(config: &Table, name: &str) -> Result<T> {
    let v = config.get(name).cloned().with_context(|| format!("the config has no [{name}] section"))?;
    v.try_into().with_context(|| format!("in [{name}]"))
}

fn merge(into: &mut Table, from: Table, prefix: &str, origin: &str) -> Result<()> {
    for (key, value) in from {
        let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
        match (into.get_mut(&key), value) {
            (None, _) => {
                let known: Vec<&str> = into.keys().map(|k| k.as_str()).collect();
                bail!("{origin}: unknown key `{path}` (known here: {})", known.join(", "));
            }
            (Some(Value::Table(have)), Value::Table(want)) => merge(have, want, &path, origin)?,
            (Some(Value::Table(_)), other) => {
                bail!("{origin}: `{path}` must be a table of settings, not {}", other.type_str())
            }
            (Some(have), want) => {
                if std::mem::discriminant(have) != std::mem::discriminant(&want)
                    && !matches!((&*have, &want), (Value::Float(_), Value::Integer(_)))
                {
                    bail!("{origin}: `{path}` must be {} (like the default), not {}", have.type_str(), want.type_str());
                }
                *have = want;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_overridden_value_keeps_every_other_default() {
        let merged = layered("[seed]\nmax_prompt_tokens = 9000\n", "user.toml").unwrap();
        assert_eq!(merged["seed"]["max_prompt_tokens"].as_integer(), Some(9000));
        let d = defaults();
        assert_eq!(merged["seed"]["rows_per_shard"], d["seed"]["rows_per_shard"]);
        assert_eq!(merged["filters"], d["filters"]);
        assert_eq!(merged["relevance"]["weights"], d["relevance"]["weights"]);
    }

    #[test]
    fn nested_tables_merge_key_by_key() {
        let merged = layered("[relevance.weights]\ncochange = 2.5\n", "user.toml").unwrap();
        let w = &merged["relevance"]["weights"];
        assert_eq!(w["cochange"].as_float(), Some(2.5));
        assert_eq!(w["bm25"], defaults()["relevance"]["weights"]["bm25"]);
    }

    #[test]
    fn unknown_keys_and_wrong_types_are_named() {
        let e = layered("[filters]\nmax_file = 3\n", "mine.toml").unwrap_err().to_string();
        assert!(e.contains("mine.toml: unknown key `filters.max_file`") && e.contains("max_files"), "{e}");
        let e = layered("[sed]\nx = 1\n", "mine.toml").unwrap_err().to_string();
        assert!(e.contains("unknown key `sed`"), "{e}");
        let e = layered("[filters]\nmax_files = \"many\"\n", "mine.toml").unwrap_err().to_string();
        assert!(e.contains("`filters.max_files` must be integer"), "{e}");
        // An integer where the default is a float is a float.
        let merged = layered("[seed]\ntest_fraction = 0\n", "mine.toml").unwrap();
        assert_eq!(merged["seed"]["test_fraction"].as_integer(), Some(0));
    }
}
