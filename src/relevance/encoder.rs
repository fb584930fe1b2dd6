//! The MiniLM text encoder (all-MiniLM-L6-v2, int8 ONNX) run through ONNX Runtime (`ort`,
//! loaded dynamically from the cached PyPI wheel), with its WordPiece tokenizer: texts in,
//! mean-pooled, L2-normalised 384-dimensional embeddings out.

use std::sync::{Mutex, OnceLock};

use anyhow::{anyhow, Context, Result};
use ort::session::Session;
use ort::value::Tensor;

/// Loads ONNX Runtime once per process (ort allows a single environment).
pub fn init_runtime() -> Result<ort::environment::Environment> {
    // ONNX Runtime allows one environment per process and keeps only a weak reference to it:
    // the process holds it here for its whole life.
    static ENV: OnceLock<std::result::Result<ort::environment::Environment, String>> = OnceLock::new();
    ENV.get_or_init(|| {
        let lib = crate::models::onnxruntime_library().map_err(|e| format!("{e:#}"))?;
        let builder = ort::init_from(&lib).map_err(|e| format!("loading ONNX Runtime from {}: {e}", lib.display()))?;
        builder.with_name("swelake").build().map_err(|e| format!("starting ONNX Runtime: {e}"))
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

pub struct Encoder {
    session: Mutex<Session>,
    tokenizer: tokenizers::Tokenizer,
    /// Tokens per text (sentence-transformers' max_seq_length for this model).
    pub max_tokens: usize,
    /// Name recorded with scores.
    pub name: &'static str,
}

pub const MODEL_NAME: &str = "all-MiniLM-L6-v2-int8";

impl Encoder {
    /// Loads the model and tokenizer from the cache (fetching them on first use).
    pub fn load(threads: usize) -> Result<Encoder> {
        let env = init_runtime()?;
        let model = crate::models::fetch(&crate::models::MINILM_MODEL)?;
        let tok = crate::models::fetch(&crate::models::MINILM_TOKENIZER)?;
        let mut tokenizer =
            tokenizers::Tokenizer::from_file(&tok).map_err(|e| anyhow!("loading {}: {e}", tok.display()))?;
        tokenizer
            .with_truncation(Some(tokenizers::TruncationParams { max_length: 256, ..Default::default() }))
            .map_err(|e| anyhow!("tokenizer truncation: {e}"))?;
        tokenizer.with_padding(None);
        let session = Session::builder(&env)
            .map_err(|e| anyhow!("{e}"))?
            .with_intra_threads(threads.max(1))
            .map_err(|e| anyhow!("{e}"))?
            .commit_from_file(&model)
            .with_context(|| format!("loading {}", model.display()))?;
        Ok(Encoder { session: Mutex::new(session), tokenizer, max_tokens: 256, name: MODEL_NAME })
    }

    /// Token ids of `texts` as the encoder sees them (truncated to `max_tokens`).
    pub fn token_ids(&self, texts: &[&str]) -> Result<Vec<Vec<u32>>> {
        let enc = self.tokenizer.encode_batch(texts.to_vec(), true).map_err(|e| anyhow!("tokenizing: {e}"))?;
        Ok(enc.iter().map(|e| e.get_ids().to_vec()).collect())
    }

    /// Embeds `texts` (one batch); each vector has unit length.
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let encodings = self.tokenizer.encode_batch(texts.to_vec(), true).map_err(|e| anyhow!("tokenizing: {e}"))?;
        let len = encodings.iter().map(|e| e.get_ids().len()).max().unwrap_or(1).max(1);
        let n = encodings.len();
        let (mut ids, mut mask, types) = (vec![0i64; n * len], vec![0i64; n * len], vec![0i64; n * len]);
        for (r, e) in encodings.iter().enumerate() {
            for (c, (&id, &m)) in e.get_ids().iter().zip(e.get_attention_mask()).enumerate() {
                ids[r * len + c] = id as i64;
                mask[r * len + c] = m as i64;
            }
        }
        let shape = [n as i64, len as i64];
        let inputs = ort::inputs![
            "input_ids" => Tensor::from_array((shape, ids))?,
            "attention_mask" => Tensor::from_array((shape, mask.clone()))?,
            "token_type_ids" => Tensor::from_array((shape, types))?,
        ];
        let mut session = self.session.lock().map_err(|_| anyhow!("encoder lock poisoned"))?;
        let outputs = session.run(inputs)?;
        let (out_shape, hidden) = outputs["last_hidden_state"].try_extract_tensor::<f32>()?;
        let dim = *out_shape.last().context("output without dimensions")? as usize;
        let mut out = Vec::with_capacity(n);
        for r in 0..n {
            // Mean over the real (unpadded) tokens, then unit length: sentence-transformers'
            // pooling and normalisation for this model.
            let mut v = vec![0f32; dim];
            let mut count = 0f32;
            for c in 0..len {
                if mask[r * len + c] == 1 {
                    let row = &hidden[(r * len + c) * dim..(r * len + c + 1) * dim];
                    v.iter_mut().zip(row).for_each(|(a, b)| *a += b);
                    count += 1.0;
                }
            }
            let norm = v.iter().map(|x| (x / count.max(1.0)).powi(2)).sum::<f32>().sqrt().max(1e-12);
            v.iter_mut().for_each(|x| *x = *x / count.max(1.0) / norm);
            out.push(v);
        }
        Ok(out)
    }
}

pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}
