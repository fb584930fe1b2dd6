//! Scoring reward cases in bulk: JSON lines in, JSON lines out, in input order, on a
//! bounded thread pool, never more than one chunk of lines in memory.
//!
//! Input lines are
//! `{"id","kind":"search_replace","context":{path:content},"oracle":{path:new},"output":"…"}`,
//! `{"id","kind":"unidiff","oracle_patches":[…],"pred_patches":[…]}`, or
//! `{"id","kind":"general","context":{…},"oracle":{…},"pred":{…}}` (predicted new contents).
//! Each output line carries the same `id`, `reward`, `format_error` and per-file
//! `similarities`; a line that cannot be scored gets `"reward": null` and an `error`, and the
//! batch goes on.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};

use anyhow::Context as _;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use super::{general_reward, search_replace_reward, unidiff_reward, FileSimilarity, Reward};

/// One reward case.
#[derive(Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Case {
    SearchReplace { context: BTreeMap<String, String>, oracle: BTreeMap<String, String>, output: String },
    Unidiff { oracle_patches: Vec<String>, pred_patches: Vec<String> },
    General { context: BTreeMap<String, String>, oracle: BTreeMap<String, String>, pred: BTreeMap<String, String> },
}

impl Case {
    pub fn score(&self) -> Result<Reward, String> {
        match self {
            Case::SearchReplace { context, oracle, output } => {
                search_replace_reward(context, oracle, output).map_err(|e| e.to_string())
            }
            Case::Unidiff { oracle_patches, pred_patches } => Ok(unidiff_reward(oracle_patches, pred_patches)),
            Case::General { context, oracle, pred } => general_reward(context, oracle, pred).map_err(|e| e.to_string()),
        }
    }
}

/// A whole input line, read in one pass (an internally tagged enum would buffer the line).
#[derive(Deserialize)]
struct CaseLine<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    context: Option<BTreeMap<String, String>>,
    #[serde(default)]
    oracle: Option<BTreeMap<String, String>>,
    #[serde(default)]
    output: Option<String>,
    #[serde(default)]
    oracle_patches: Option<Vec<String>>,
    #[serde(default)]
    pred_patches: Option<Vec<String>>,
    #[serde(default)]
    pred: Option<BTreeMap<String, String>>,
}

fn required<T>(v: Option<T>, field: &str, kind: &str) -> Result<T, String> {
    v.ok_or_else(|| format!("invalid case: kind {kind:?} needs `{field}`"))
}

impl CaseLine<'_> {
    fn into_case(self) -> Result<Case, String> {
        let kind = self.kind.ok_or("invalid case: missing `kind`")?;
        Ok(match kind.as_str() {
            "search_replace" => Case::SearchReplace {
                context: required(self.context, "context", &kind)?,
                oracle: required(self.oracle, "oracle", &kind)?,
                output: required(self.output, "output", &kind)?,
            },
            "unidiff" => Case::Unidiff {
                oracle_patches: required(self.oracle_patches, "oracle_patches", &kind)?,
                pred_patches: required(self.pred_patches, "pred_patches", &kind)?,
            },
            "general" => Case::General {
                context: required(self.context, "context", &kind)?,
                oracle: required(self.oracle, "oracle", &kind)?,
                pred: required(self.pred, "pred", &kind)?,
            },
            other => return Err(format!("invalid case: unknown kind {other:?} (search_replace, unidiff, general)")),
        })
    }
}

#[derive(Serialize)]
struct Scored<'a> {
    id: &'a RawValue,
    reward: f64,
    format_error: Option<String>,
    similarities: Vec<FileSimilarity>,
}

#[derive(Serialize)]
struct Failed<'a> {
    id: &'a RawValue,
    line: usize,
    reward: Option<f64>,
    error: String,
}

/// Scores one input line into one output line (without the newline). Errors are data.
pub fn score_line(line: &str, line_number: usize) -> (String, bool) {
    let null = RawValue::NULL;
    let fail = |id: &RawValue, error: String| {
        let f = Failed { id, line: line_number, reward: None, error };
        (serde_json::to_string(&f).expect("plain data serialises"), false)
    };
    let parsed: CaseLine = match serde_json::from_str(line) {
        Ok(c) => c,
        Err(e) => {
            // Recover the id for the error line if the line is JSON at all.
            let id = serde_json::from_str::<Value>(line).ok().and_then(|v| v.get("id").cloned());
            let id_raw = id.map(|v| v.to_string()).unwrap_or_else(|| "null".to_string());
            let id_raw = RawValue::from_string(id_raw).expect("serialised JSON is valid");
            let what = if serde_json::from_str::<Value>(line).is_ok() { "invalid case" } else { "invalid JSON" };
            return fail(&id_raw, format!("{what}: {e}"));
        }
    };
    let id = parsed.id.unwrap_or(null);
    match parsed.into_case().and_then(|c| c.score()) {
        Ok(r) => {
            let s = Scored { id, reward: r.reward, format_error: r.format_error, similarities: r.similarities };
            (serde_json::to_string(&s).expect("plain data serialises"), true)
        }
        Err(e) => fail(id, e),
    }
}

/// [`score_line`] for a line as read: bytes that are not UTF-8 get an error row.
pub fn score_bytes(line: &[u8], line_number: usize) -> (String, bool) {
    match std::str::from_utf8(line) {
        Ok(text) => score_line(text, line_number),
        Err(e) => {
            let f =
                Failed { id: RawValue::NULL, line: line_number, reward: None, error: format!("invalid UTF-8: {e}") };
            (serde_json::to_string(&f).expect("plain data serialises"), false)
        }
    }
}

/// Totals of a batch run.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BatchSummary {
    pub lines: usize,
    pub scored: usize,
    pub errors: usize,
}

/// Lines read before they are scored: enough for every thread to have work, few enough
/// (~1.5 MB of cases) that they are still in cache when scored (4096 measured ~3% slower
/// per thread in `swelake bench reward`).
const CHUNK_LINES: usize = 256;

/// Scores every non-blank line of `input` into `output` using `pool`.
pub fn score_stream(
    input: impl BufRead,
    mut output: impl Write,
    pool: &rayon::ThreadPool,
) -> anyhow::Result<BatchSummary> {
    let mut summary = BatchSummary::default();
    let mut input = input;
    // One buffer holds a whole chunk of lines (kept between chunks): no allocation per line.
    // Bytes, not a String: a line that is not UTF-8 becomes an error row, not the batch's end.
    let mut block: Vec<u8> = Vec::new();
    let mut chunk: Vec<(usize, std::ops::Range<usize>)> = Vec::with_capacity(CHUNK_LINES);
    let mut line_number = 0usize;
    loop {
        chunk.clear();
        block.clear();
        loop {
            line_number += 1;
            let start = block.len();
            let n = input.read_until(b'\n', &mut block).with_context(|| format!("reading input line {line_number}"))?;
            if n == 0 {
                break;
            }
            let mut end = block.len();
            if block[start..end].trim_ascii().is_empty() {
                block.truncate(start);
                continue;
            }
            if block[start..end].ends_with(b"\n") {
                end -= 1;
                if block[start..end].ends_with(b"\r") {
                    end -= 1;
                }
            }
            chunk.push((line_number, start..end));
            if chunk.len() == CHUNK_LINES {
                break;
            }
        }
        if chunk.is_empty() {
            break;
        }
        let results: Vec<(String, bool)> =
            pool.install(|| chunk.par_iter().map(|(n, r)| score_bytes(&block[r.clone()], *n)).collect());
        for (value, ok) in results {
            summary.lines += 1;
            if ok {
                summary.scored += 1;
            } else {
                summary.errors += 1;
            }
            output.write_all(value.as_bytes())?;
            output.write_all(b"\n")?;
        }
    }
    output.flush()?;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_lines_become_error_rows_and_order_is_kept() {
        let input = concat!(
            "{\"id\":\"a\",\"kind\":\"unidiff\",\"oracle_patches\":[],\"pred_patches\":[]}\n",
            "not json\n",
            "\n",
            "{\"id\":\"c\",\"kind\":\"nope\"}\n",
            "{\"id\":\"d\",\"kind\":\"search_replace\",\"context\":{},\"oracle\":{},\"output\":\"x\"}\n",
        );
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let mut out = Vec::new();
        let s = score_stream(input.as_bytes(), &mut out, &pool).unwrap();
        assert_eq!(s, BatchSummary { lines: 4, scored: 2, errors: 2 });
        let rows: Vec<Value> =
            String::from_utf8(out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(rows[0]["id"], "a");
        assert_eq!(rows[0]["reward"], 1.0);
        assert_eq!(rows[1]["line"], 2);
        assert!(rows[1]["error"].as_str().unwrap().starts_with("invalid JSON"));
        assert_eq!(rows[2]["id"], "c");
        assert!(rows[2]["reward"].is_null());
        assert_eq!(rows[3]["reward"], -1.0);
        assert_eq!(rows[3]["format_error"], "count of <think> is not 1");
    }

    #[test]
    fn a_line_that_is_not_utf8_is_an_error_row_and_the_batch_goes_on() {
        let mut input = b"{\"id\":\"a\",\"kind\":\"unidiff\",\"oracle_patches\":[],\"pred_patches\":[]}\n".to_vec();
        input.extend_from_slice(
            b"{\"id\":\"b\",\"kind\":\"unidiff\",\"oracle_patches\":[\"\xff\xfe\"],\"pred_patches\":[]}\r\n",
        );
        input.extend_from_slice(b"{\"id\":\"c\",\"kind\":\"unidiff\",\"oracle_patches\":[],\"pred_patches\":[]}");
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let mut out = Vec::new();
        let s = score_stream(&input[..], &mut out, &pool).unwrap();
        assert_eq!(s, BatchSummary { lines: 3, scored: 2, errors: 1 });
        let rows: Vec<Value> =
            String::from_utf8(out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0]["id"], "a");
        assert_eq!(rows[1]["line"], 2);
        assert!(rows[1]["reward"].is_null());
        assert!(rows[1]["error"].as_str().unwrap().starts_with("invalid UTF-8"), "{}", rows[1]);
        assert_eq!(rows[2]["id"], "c");
        assert_eq!(rows[2]["reward"], 1.0);
    }
}
