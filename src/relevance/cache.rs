//! The embedding cache and the chunking: which chunks of a file the encoder reads, and
//! their vectors by blob and chunk, loaded from and saved to `blob_embeddings`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use arrow::array::RecordBatch;
use serde::Serialize;

use super::bm25;
use super::encoder;
use super::encoder::Encoder;
use super::rank::Candidate;
use super::{RelevanceConfig, BLOB_EMBEDDINGS};
use crate::lake::rows::to_batch;
use crate::lake::Lake;

/// Embeddings of file chunks by blob and chunk index, loaded from and saved to
/// `blob_embeddings`: a chunk read for one PR is not embedded again for another.
#[derive(Default)]
pub struct EmbeddingCache {
    pub(crate) by_blob: HashMap<String, BTreeMap<u32, Arc<Vec<f32>>>>,
    pub(crate) new: Vec<(String, u32, Arc<Vec<f32>>)>,
    /// Texts embedded in this process, for throughput figures.
    pub embedded_texts: usize,
    pub embed_seconds: f64,
    /// Chunks asked for that were already embedded (in this process or an earlier run).
    pub chunk_hits: usize,
    pub chunk_misses: usize,
    /// Batch texts of similar length together (off: in file order, as before re-ranking).
    pub batch_by_length: bool,
    /// Keep the texts embedded (for benchmarks).
    pub keep_texts: bool,
    pub texts: Vec<String>,
}

/// Texts per encoder call. One: on the CPU a text alone runs 2.3x faster than in a batch of
/// 32 (8.7 against 3.8 chunks/s on one core, 248-token chunks, onnxruntime from Python on the
/// same model: a batch's activations leave the cache), and a vector never depends on which
/// texts shared its call.
pub(crate) const BATCH: usize = 1;

/// Chunks of a file for embedding: about `chars` characters each, cut at line ends, each
/// headed by the path; at most `max` of them.
pub fn chunks(path: &str, content: &str, chars: usize, max: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in content.lines() {
        if cur.len() + line.len() > chars && !cur.is_empty() {
            out.push(format!("{path}\n{cur}"));
            cur.clear();
            if out.len() == max {
                return out;
            }
        }
        let take: String = line.chars().take(chars).collect();
        cur.push_str(&take);
        cur.push('\n');
    }
    if !cur.trim().is_empty() || out.is_empty() {
        out.push(format!("{path}\n{cur}"));
    }
    out.truncate(max);
    out
}

/// The chunks of a file the encoder reads for `query`, with their indexes: all of them when
/// `keep` is 0 or covers them, else the `keep` that BM25 (over the file's own chunks) finds
/// closest to the query, the earlier chunk first on a tie (so a file that shares nothing
/// with the query shows its head).
pub fn selected_chunks(path: &str, content: &str, query: &str, cfg: &RelevanceConfig) -> Vec<(u32, String)> {
    let all = chunks(path, content, cfg.chunk_chars, cfg.max_chunks);
    let keep = cfg.embed_chunks;
    if keep == 0 || all.len() <= keep {
        return all.into_iter().enumerate().map(|(i, t)| (i as u32, t)).collect();
    }
    let scores = bm25::Bm25::new(all.iter().map(String::as_str)).scores(query);
    let mut order: Vec<usize> = (0..all.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    order.truncate(keep);
    order.sort_unstable();
    let mut all: Vec<Option<String>> = all.into_iter().map(Some).collect();
    order.into_iter().map(|i| (i as u32, all[i].take().unwrap_or_default())).collect()
}

impl EmbeddingCache {
    pub async fn load(lake: &Lake, model: &str) -> Result<EmbeddingCache> {
        let mut c = EmbeddingCache { batch_by_length: true, ..Default::default() };
        if !lake.has_table(BLOB_EMBEDDINGS).await? {
            return Ok(c);
        }
        let ctx = lake.session().await?;
        let q = format!(
            "SELECT blob_sha, chunk, vector FROM {BLOB_EMBEDDINGS} WHERE model = '{}'",
            model.replace('\'', "''")
        );
        for (sha, chunk, vector) in crate::query::rows::<(String, i64, Vec<f32>)>(&ctx, &q).await? {
            c.by_blob.entry(sha).or_default().insert(chunk as u32, Arc::new(vector));
        }
        Ok(c)
    }

    /// The best chunk similarity of each of `candidates` to the query (text `query`, vector
    /// `query_vector`), over the chunks [`selected_chunks`] picks for it; chunks not embedded
    /// yet are embedded, batched by length (a batch is padded to its longest text, and file
    /// chunks vary tenfold).
    pub fn similarities(
        &mut self,
        enc: &Encoder,
        candidates: &[&Candidate],
        query: &str,
        query_vector: &[f32],
        cfg: &RelevanceConfig,
    ) -> Result<Vec<f32>> {
        let mut wanted: Vec<Vec<u32>> = Vec::with_capacity(candidates.len());
        let mut todo: Vec<(String, u32, String)> = Vec::new();
        let mut queued: HashSet<(&str, u32)> = HashSet::new();
        for c in candidates {
            let picked = selected_chunks(&c.path, &c.content, query, cfg);
            let have = self.by_blob.get(&c.blob);
            let mut idx = Vec::with_capacity(picked.len());
            for (i, text) in picked {
                if have.is_some_and(|h| h.contains_key(&i)) || queued.contains(&(c.blob.as_str(), i)) {
                    self.chunk_hits += 1;
                } else {
                    self.chunk_misses += 1;
                    queued.insert((c.blob.as_str(), i));
                    todo.push((c.blob.clone(), i, text));
                }
                idx.push(i);
            }
            wanted.push(idx);
        }
        self.embed(enc, todo)?;
        Ok(candidates
            .iter()
            .zip(wanted)
            .map(|(c, idx)| {
                let have = self.by_blob.get(&c.blob);
                idx.iter()
                    .filter_map(|i| have.and_then(|h| h.get(i)))
                    .map(|v| encoder::cosine(v, query_vector))
                    .fold(0.0f32, f32::max)
            })
            .collect())
    }

    fn embed(&mut self, enc: &Encoder, todo: Vec<(String, u32, String)>) -> Result<()> {
        if todo.is_empty() {
            return Ok(());
        }
        let t = Instant::now();
        let mut order: Vec<usize> = (0..todo.len()).collect();
        if self.batch_by_length {
            order.sort_by_key(|&i| todo[i].2.len());
        }
        if self.keep_texts {
            self.texts.extend(todo.iter().map(|t| t.2.clone()));
        }
        let mut vectors: Vec<Vec<f32>> = vec![Vec::new(); todo.len()];
        for batch in order.chunks(BATCH) {
            let refs: Vec<&str> = batch.iter().map(|&i| todo[i].2.as_str()).collect();
            for (&i, v) in batch.iter().zip(enc.embed(&refs)?) {
                vectors[i] = v;
            }
        }
        self.embed_seconds += t.elapsed().as_secs_f64();
        self.embedded_texts += todo.len();
        for ((blob, chunk, _), v) in todo.into_iter().zip(vectors) {
            let v = Arc::new(v);
            self.by_blob.entry(blob.clone()).or_default().insert(chunk, v.clone());
            self.new.push((blob, chunk, v));
        }
        Ok(())
    }

    /// Share of chunk lookups answered from the cache.
    pub fn hit_rate(&self) -> f64 {
        let all = self.chunk_hits + self.chunk_misses;
        if all == 0 {
            0.0
        } else {
            self.chunk_hits as f64 / all as f64
        }
    }

    pub(crate) fn take_new_batch(&mut self, model: &str) -> Result<Option<RecordBatch>> {
        if self.new.is_empty() {
            return Ok(None);
        }
        /// A row of `blob_embeddings`.
        #[derive(Serialize)]
        struct Embedding<'a> {
            blob_sha: &'a str,
            model: &'a str,
            chunk: i64,
            vector: &'a [f32],
        }
        let new: Vec<_> = self.new.drain(..).collect();
        let rows: Vec<Embedding> = new
            .iter()
            .map(|(blob, chunk, v)| Embedding { blob_sha: blob, model, chunk: i64::from(*chunk), vector: v })
            .collect();
        Ok(Some(to_batch(BLOB_EMBEDDINGS, &rows)?))
    }
}

/// What `blob_embeddings.model` records: the encoder, and the chunk size when it is not the
/// one the first lakes were made with (chunk `i` of a blob is other text at another size, so
/// vectors cached at one size are never read at another).
pub fn embedding_space(cfg: &RelevanceConfig) -> String {
    if cfg.chunk_chars == FIRST_CHUNK_CHARS {
        encoder::MODEL_NAME.to_string()
    } else {
        format!("{}/chunk_chars={}", encoder::MODEL_NAME, cfg.chunk_chars)
    }
}

/// The chunk size of the first lakes, whose cached vectors are keyed by the encoder's name
/// alone (`bench relevance` measures the stage as it was with it).
pub const FIRST_CHUNK_CHARS: usize = 1500;
