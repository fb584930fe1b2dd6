//! BM25 over code: the baseline ranker of relevant files, and one feature of ours.
//!
//! Terms come from identifiers split at non-alphanumerics and at camelCase and snake_case
//! boundaries, lower-cased, so `parseHTTPHeader`, `parse_http_header` and `parse http header`
//! share terms. Very short terms and digits-only terms are dropped.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// Terms of `text` for retrieval.
pub fn terms(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for word in text.split(|c: char| !c.is_alphanumeric()) {
        if word.is_empty() {
            continue;
        }
        let chars: Vec<char> = word.chars().collect();
        let mut start = 0;
        for i in 1..=chars.len() {
            let boundary = i == chars.len()
                || (chars[i].is_uppercase() && chars[i - 1].is_lowercase())
                || (chars[i].is_uppercase()
                    && i + 1 < chars.len()
                    && chars[i + 1].is_lowercase()
                    && chars[i - 1].is_uppercase())
                || (chars[i].is_ascii_digit() != chars[i - 1].is_ascii_digit());
            if boundary {
                let t: String = chars[start..i].iter().collect::<String>().to_lowercase();
                if t.chars().count() >= 2 && !t.chars().all(|c| c.is_ascii_digit()) {
                    out.push(t);
                }
                start = i;
            }
        }
    }
    out
}

/// A BM25 index over a fixed set of documents.
pub struct Bm25 {
    k1: f64,
    b: f64,
    doc_tf: Vec<Arc<HashMap<String, u32>>>,
    doc_len: Vec<f64>,
    avg_len: f64,
}

impl Bm25 {
    pub fn new<'a>(docs: impl IntoIterator<Item = &'a str>) -> Bm25 {
        Bm25::from_counts(
            docs.into_iter()
                .map(|d| {
                    let (tf, len) = Bm25::term_counts(d);
                    (Arc::new(tf), len)
                })
                .collect(),
        )
    }

    /// Term frequencies and length of one document.
    pub fn term_counts(doc: &str) -> (HashMap<String, u32>, f64) {
        let mut tf: HashMap<String, u32> = HashMap::new();
        let ts = terms(doc);
        let len = ts.len() as f64;
        for t in ts {
            *tf.entry(t).or_default() += 1;
        }
        (tf, len)
    }

    /// An index over documents already counted (shared between the indexes of many queries).
    pub fn from_counts(docs: Vec<(Arc<HashMap<String, u32>>, f64)>) -> Bm25 {
        let doc_len: Vec<f64> = docs.iter().map(|d| d.1).collect();
        let avg_len = if doc_len.is_empty() { 0.0 } else { doc_len.iter().sum::<f64>() / doc_len.len() as f64 };
        Bm25 { k1: 1.2, b: 0.75, doc_tf: docs.into_iter().map(|d| d.0).collect(), doc_len, avg_len }
    }

    /// The BM25 score of every document for `query`.
    pub fn scores(&self, query: &str) -> Vec<f64> {
        let n = self.doc_tf.len() as f64;
        // The query's terms in a fixed (sorted) order: a document's score is a sum over them,
        // and a sum in hash order would differ in its last bits from run to run.
        let q: BTreeSet<String> = terms(query).into_iter().collect();
        // Document frequencies of the query's terms only: an index serves one or two queries.
        let idf: Vec<f64> = q
            .iter()
            .map(|t| {
                let df = self.doc_tf.iter().filter(|d| d.contains_key(t)).count() as f64;
                ((n - df + 0.5) / (df + 0.5) + 1.0).ln()
            })
            .collect();
        (0..self.doc_tf.len())
            .map(|i| {
                let norm = self.k1 * (1.0 - self.b + self.b * self.doc_len[i] / self.avg_len.max(1.0));
                q.iter()
                    .zip(&idf)
                    .map(|(t, idf)| {
                        let Some(&f) = self.doc_tf[i].get(t) else { return 0.0 };
                        let f = f64::from(f);
                        idf * f * (self.k1 + 1.0) / (f + norm)
                    })
                    .sum()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifier_terms() {
        assert_eq!(terms("parseHTTPHeader"), vec!["parse", "http", "header"]);
        assert_eq!(terms("parse_http_header(x2)"), vec!["parse", "http", "header"]);
        assert_eq!(terms("src/calc/ops.py"), vec!["src", "calc", "ops", "py"]);
    }

    #[test]
    fn ranks_the_matching_document_first() {
        let docs = ["def divide(a, b): return a / b", "def add(a, b): return a + b", "readme about the project"];
        let s = Bm25::new(docs.iter().copied()).scores("divide by zero crashes");
        assert!(s[0] > s[1] && s[0] > s[2], "{s:?}");
        assert_eq!(s[2], 0.0);
    }
}
