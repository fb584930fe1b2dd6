//! A Llama-family causal language model written only with differentiable candle operations,
//! so that every parameter receives a gradient. (candle's fused kernels — `rms_norm`,
//! `softmax_last_dim`, `rope*`, sdpa — record no gradient and raise no error; a model built
//! on them trains nothing upstream of them; a test checks every parameter's gradient against
//! finite differences.)
//!
//! RMSNorm is `x / sqrt(mean(x²) + eps) * w`; attention is grouped-query with a causal
//! softmax; the MLP is SwiGLU; the output head is tied to the embedding. RoPE rotates adjacent
//! pairs of each head's features, which is the layout of the Q/K weights in GGUF files
//! (llama.cpp permutes Hugging Face's half-split layout into it), so GGUF weights load
//! unchanged. On the CPU these four run as fused kernels with their own backward
//! (`crate::kernels`); elsewhere as the composed expressions, which the kernels are tested
//! against.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor, Var, D};

use crate::kernels;

/// Model dimensions.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Config {
    pub vocab: usize,
    pub dim: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub hidden: usize,
    pub rope_theta: f64,
    pub eps: f64,
    pub max_seq: usize,
}

impl Config {
    pub fn head_dim(&self) -> usize {
        self.dim / self.heads
    }

    /// A small configuration for tests and quick experiments.
    pub fn tiny(vocab: usize) -> Config {
        Config {
            vocab,
            dim: 64,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            hidden: 128,
            rope_theta: 10_000.0,
            eps: 1e-5,
            max_seq: 512,
        }
    }

    fn check(&self) -> Result<()> {
        if !self.dim.is_multiple_of(self.heads)
            || !self.heads.is_multiple_of(self.kv_heads)
            || !self.head_dim().is_multiple_of(2)
        {
            bail!("inconsistent model config {self:?}");
        }
        Ok(())
    }
}

/// One transformer block's parameters.
pub struct Block {
    pub attn_norm: Var,
    pub wq: Var,
    pub wk: Var,
    pub wv: Var,
    pub wo: Var,
    pub ffn_norm: Var,
    pub w_gate: Var,
    pub w_up: Var,
    pub w_down: Var,
}

pub struct Model {
    pub cfg: Config,
    pub embed: Var,
    pub blocks: Vec<Block>,
    pub norm: Var,
    cos: Tensor,
    sin: Tensor,
    pub device: Device,
    pub dtype: DType,
}

/// Keys and values of the positions seen so far, per layer (generation only).
#[derive(Default)]
pub struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
}

impl KvCache {
    pub fn len(&self) -> usize {
        self.layers.first().and_then(|l| l.as_ref()).map_or(0, |(k, _)| k.dim(2).unwrap_or(0))
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies a one-row cache to `n` rows (a prompt prefilled once, then sampled n ways).
    pub fn repeat_rows(&mut self, n: usize) -> Result<()> {
        for (k, v) in self.layers.iter_mut().flatten() {
            *k = k.repeat((n, 1, 1, 1))?;
            *v = v.repeat((n, 1, 1, 1))?;
        }
        Ok(())
    }
}

fn rope_tables(cfg: &Config, device: &Device, dtype: DType) -> Result<(Tensor, Tensor)> {
    let half = cfg.head_dim() / 2;
    let mut cos = Vec::with_capacity(cfg.max_seq * half);
    let mut sin = Vec::with_capacity(cfg.max_seq * half);
    for pos in 0..cfg.max_seq {
        for i in 0..half {
            let freq = cfg.rope_theta.powf(-2.0 * i as f64 / cfg.head_dim() as f64);
            let a = pos as f64 * freq;
            cos.push(a.cos());
            sin.push(a.sin());
        }
    }
    Ok((
        Tensor::from_vec(cos, (cfg.max_seq, half), device)?.to_dtype(dtype)?,
        Tensor::from_vec(sin, (cfg.max_seq, half), device)?.to_dtype(dtype)?,
    ))
}

impl Model {
    /// Random initial weights (normal, std 0.02; norms at 1), reproducible from `seed`.
    pub fn random(cfg: Config, seed: u64, device: &Device, dtype: DType) -> Result<Model> {
        cfg.check()?;
        let mut rng = swelake_core::rng::Rng::new(seed);
        let mut w = |rows: usize, cols: usize| -> Result<Var> {
            let v: Vec<f64> = (0..rows * cols).map(|_| rng.normal(0.02)).collect();
            Ok(Var::from_tensor(&Tensor::from_vec(v, (rows, cols), device)?.to_dtype(dtype)?)?)
        };
        let ones = |n: usize| -> Result<Var> { Ok(Var::from_tensor(&Tensor::ones(n, dtype, device)?)?) };
        let (d, hd) = (cfg.dim, cfg.head_dim());
        let embed = w(cfg.vocab, d)?;
        let mut blocks = Vec::new();
        for _ in 0..cfg.layers {
            blocks.push(Block {
                attn_norm: ones(d)?,
                wq: w(cfg.heads * hd, d)?,
                wk: w(cfg.kv_heads * hd, d)?,
                wv: w(cfg.kv_heads * hd, d)?,
                wo: w(d, cfg.heads * hd)?,
                ffn_norm: ones(d)?,
                w_gate: w(cfg.hidden, d)?,
                w_up: w(cfg.hidden, d)?,
                w_down: w(d, cfg.hidden)?,
            });
        }
        let norm = ones(d)?;
        let (cos, sin) = rope_tables(&cfg, device, dtype)?;
        Ok(Model { cfg, embed, blocks, norm, cos, sin, device: device.clone(), dtype })
    }

    /// Every parameter with its name (the names of the safetensors files).
    pub fn named_vars(&self) -> Vec<(String, &Var)> {
        let mut out = vec![("embed".to_string(), &self.embed)];
        for (i, b) in self.blocks.iter().enumerate() {
            for (n, v) in [
                ("attn_norm", &b.attn_norm),
                ("wq", &b.wq),
                ("wk", &b.wk),
                ("wv", &b.wv),
                ("wo", &b.wo),
                ("ffn_norm", &b.ffn_norm),
                ("w_gate", &b.w_gate),
                ("w_up", &b.w_up),
                ("w_down", &b.w_down),
            ] {
                out.push((format!("blocks.{i}.{n}"), v));
            }
        }
        out.push(("norm".to_string(), &self.norm));
        out
    }

    /// An independent copy (the frozen reference policy).
    pub fn deep_clone(&self) -> Result<Model> {
        let copy = |v: &Var| -> Result<Var> { Ok(Var::from_tensor(&v.as_tensor().copy()?)?) };
        let blocks = self
            .blocks
            .iter()
            .map(|b| {
                Ok(Block {
                    attn_norm: copy(&b.attn_norm)?,
                    wq: copy(&b.wq)?,
                    wk: copy(&b.wk)?,
                    wv: copy(&b.wv)?,
                    wo: copy(&b.wo)?,
                    ffn_norm: copy(&b.ffn_norm)?,
                    w_gate: copy(&b.w_gate)?,
                    w_up: copy(&b.w_up)?,
                    w_down: copy(&b.w_down)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Model {
            cfg: self.cfg.clone(),
            embed: copy(&self.embed)?,
            blocks,
            norm: copy(&self.norm)?,
            cos: self.cos.clone(),
            sin: self.sin.clone(),
            device: self.device.clone(),
            dtype: self.dtype,
        })
    }

    pub fn vars(&self) -> Vec<Var> {
        self.named_vars().into_iter().map(|(_, v)| v.clone()).collect()
    }

    pub fn parameter_count(&self) -> usize {
        self.named_vars().iter().map(|(_, v)| v.elem_count()).sum()
    }

    /// Saves the weights (and the config, as metadata) as safetensors.
    pub fn save(&self, path: &Path) -> Result<()> {
        let tensors: HashMap<String, Tensor> =
            self.named_vars().into_iter().map(|(n, v)| (n, v.as_tensor().clone())).collect();
        let tmp = path.with_extension("tmp");
        candle_core::safetensors::save(&tensors, &tmp)?;
        std::fs::rename(&tmp, path)?;
        std::fs::write(path.with_extension("config.json"), serde_json::to_string_pretty(&self.cfg)?)?;
        Ok(())
    }

    /// Loads weights saved by [`Model::save`].
    pub fn load(path: &Path, device: &Device, dtype: DType) -> Result<Model> {
        let cfg: Config = serde_json::from_str(
            &std::fs::read_to_string(path.with_extension("config.json")).context("reading the model config")?,
        )?;
        let mut tensors = candle_core::safetensors::load(path, device)?;
        let mut m = Model::random(cfg, 0, device, dtype)?;
        for (name, var) in m.named_vars() {
            let t = tensors.remove(&name).with_context(|| format!("{}: no tensor `{name}`", path.display()))?;
            var.set(&t.to_dtype(dtype)?)?;
        }
        m.sync_tables()?;
        Ok(m)
    }

    fn sync_tables(&mut self) -> Result<()> {
        let (cos, sin) = rope_tables(&self.cfg, &self.device, self.dtype)?;
        self.cos = cos;
        self.sin = sin;
        Ok(())
    }

    /// Loads a llama GGUF file (SmolLM2 and friends), dequantised to `dtype`.
    pub fn from_gguf(
        path: &Path,
        device: &Device,
        dtype: DType,
        max_seq: usize,
    ) -> Result<(Model, super::tokenizer::ChatTokenizer)> {
        use candle_core::quantized::gguf_file;
        let mut file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let content = gguf_file::Content::read(&mut file).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let md = &content.metadata;
        let get_u = |k: &str| -> Result<usize> {
            Ok(md.get(k).with_context(|| format!("GGUF metadata without {k}"))?.to_u32()? as usize)
        };
        let arch = md.get("general.architecture").map(|v| v.to_string().cloned()).transpose()?.unwrap_or_default();
        if arch != "llama" {
            bail!("{}: architecture {arch:?}, only llama is supported", path.display());
        }
        let heads = get_u("llama.attention.head_count")?;
        let cfg = Config {
            vocab: md.get("tokenizer.ggml.tokens").context("GGUF without tokens")?.to_vec()?.len(),
            dim: get_u("llama.embedding_length")?,
            layers: get_u("llama.block_count")?,
            heads,
            kv_heads: get_u("llama.attention.head_count_kv").unwrap_or(heads),
            hidden: get_u("llama.feed_forward_length")?,
            rope_theta: md.get("llama.rope.freq_base").map(|v| v.to_f32()).transpose()?.unwrap_or(10_000.0) as f64,
            eps: md.get("llama.attention.layer_norm_rms_epsilon").map(|v| v.to_f32()).transpose()?.unwrap_or(1e-5)
                as f64,
            max_seq,
        };
        cfg.check()?;
        let mut load = |name: &str| -> Result<Var> {
            let q = content.tensor(&mut file, name, device).with_context(|| format!("tensor {name}"))?;
            Ok(Var::from_tensor(&q.dequantize(device)?.to_dtype(dtype)?)?)
        };
        let embed = load("token_embd.weight")?;
        let mut blocks = Vec::with_capacity(cfg.layers);
        for i in 0..cfg.layers {
            let p = |n: &str| format!("blk.{i}.{n}.weight");
            blocks.push(Block {
                attn_norm: load(&p("attn_norm"))?,
                wq: load(&p("attn_q"))?,
                wk: load(&p("attn_k"))?,
                wv: load(&p("attn_v"))?,
                wo: load(&p("attn_output"))?,
                ffn_norm: load(&p("ffn_norm"))?,
                w_gate: load(&p("ffn_gate"))?,
                w_up: load(&p("ffn_up"))?,
                w_down: load(&p("ffn_down"))?,
            });
        }
        let norm = load("output_norm.weight")?;
        if content.tensor_infos.contains_key("output.weight") {
            bail!("{}: a separate output head is not supported (this model ties it to the embedding)", path.display());
        }
        let tokenizer = super::tokenizer::ChatTokenizer::from_gguf_metadata(md)?;
        let (cos, sin) = rope_tables(&cfg, device, dtype)?;
        Ok((Model { cfg, embed, blocks, norm, cos, sin, device: device.clone(), dtype }, tokenizer))
    }

    fn rms_norm(&self, x: &Tensor, w: &Var) -> Result<Tensor> {
        kernels::rms_norm(x, w.as_tensor(), self.cfg.eps)
    }

    fn attention(
        &self,
        blk: &Block,
        x: &Tensor,
        start: usize,
        cache: Option<&mut Option<(Tensor, Tensor)>>,
    ) -> Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        let (h, kvh, hd) = (self.cfg.heads, self.cfg.kv_heads, self.cfg.head_dim());
        let rope = || Some(kernels::Rotary { cos: &self.cos, sin: &self.sin, start });
        let q = kernels::split_heads(&linear(x, &blk.wq)?, h, rope())?;
        let mut k = kernels::split_heads(&linear(x, &blk.wk)?, kvh, rope())?;
        let mut v = kernels::split_heads(&linear(x, &blk.wv)?, kvh, None)?;
        if let Some(c) = cache {
            if let Some((pk, pv)) = c.as_ref() {
                k = Tensor::cat(&[pk, &k], 2)?;
                v = Tensor::cat(&[pv, &v], 2)?;
            }
            *c = Some((k.clone(), v.clone()));
        }
        // Grouped-query attention without copying keys and values per query head: the `rep`
        // query heads that share a key/value head are stacked as rep·T rows against it.
        let rep = h / kvh;
        let q = q.reshape((b, kvh, rep * t, hd))?;
        let out = kernels::attention(&q, &k, &v, t, start, 1.0 / (hd as f64).sqrt())?;
        let out = kernels::merge_heads(&out, b, h, t)?;
        linear(&out, &blk.wo)
    }

    fn mlp(&self, blk: &Block, x: &Tensor) -> Result<Tensor> {
        let gate = linear(x, &blk.w_gate)?;
        let up = linear(x, &blk.w_up)?;
        let act = kernels::swiglu(&gate, &up)?;
        linear(&act, &blk.w_down)
    }

    /// Logits [B, T, vocab] of `tokens` [B, T] (u32) at positions start..start+T.
    pub fn forward(&self, tokens: &Tensor, start: usize, cache: Option<&mut KvCache>) -> Result<Tensor> {
        self.head(&self.hidden(tokens, start, cache)?)
    }

    /// Logits of final hidden states [.., dim] (the tied output head). Kept apart from
    /// [`Model::hidden`] so that training computes logits only where there are completion
    /// tokens: with a 49k vocabulary the head's output dwarfs everything else.
    pub fn head(&self, hidden: &Tensor) -> Result<Tensor> {
        linear(hidden, &self.embed)
    }

    /// Final (normalised) hidden states [B, T, dim] of `tokens` [B, T].
    pub fn hidden(&self, tokens: &Tensor, start: usize, mut cache: Option<&mut KvCache>) -> Result<Tensor> {
        let (b, t) = tokens.dims2()?;
        if start + t > self.cfg.max_seq {
            bail!("sequence of {} tokens is longer than the model's max_seq {}", start + t, self.cfg.max_seq);
        }
        let mut x = self.embed.as_tensor().index_select(&tokens.flatten_all()?, 0)?.reshape((b, t, self.cfg.dim))?;
        if let Some(c) = cache.as_deref_mut() {
            c.layers.resize(self.blocks.len(), None);
        }
        for (i, blk) in self.blocks.iter().enumerate() {
            let slot = cache.as_deref_mut().map(|c| &mut c.layers[i]);
            let a = self.attention(blk, &self.rms_norm(&x, &blk.attn_norm)?, start, slot)?;
            x = (x + a)?;
            let m = self.mlp(blk, &self.rms_norm(&x, &blk.ffn_norm)?)?;
            x = (x + m)?;
        }
        self.rms_norm(&x, &self.norm)
    }
}

fn linear(x: &Tensor, w: &Var) -> Result<Tensor> {
    kernels::linear(x, w.as_tensor())
}

/// `log_softmax` along the last dimension, from differentiable operations.
pub fn log_softmax(logits: &Tensor) -> Result<Tensor> {
    let max = logits.max_keepdim(D::Minus1)?.detach();
    let shifted = logits.broadcast_sub(&max)?;
    let lse = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    Ok(shifted.broadcast_sub(&lse)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Model {
        let mut cfg = Config::tiny(13);
        cfg.dim = 8;
        cfg.hidden = 12;
        cfg.heads = 2;
        cfg.kv_heads = 1;
        cfg.max_seq = 16;
        Model::random(cfg, 7, &Device::Cpu, DType::F64).unwrap()
    }

    fn loss(m: &Model, tokens: &Tensor) -> Result<Tensor> {
        let lp = log_softmax(&m.forward(tokens, 0, None)?)?;
        // A fixed arbitrary weighting of every log-probability, so every output matters.
        let w = Tensor::arange(0f64, lp.elem_count() as f64, &Device::Cpu)?.reshape(lp.shape())?;
        Ok(((w * 0.37)?.sin()? * lp)?.sum_all()?)
    }

    /// The fused CPU kernels and the composed expressions other devices run give the same
    /// logits (also through the KV cache) and the same gradient for every parameter.
    #[test]
    fn fused_kernels_and_composed_expressions_agree() {
        let m = tiny();
        let tokens = Tensor::new(&[[1u32, 5, 2, 9, 3, 8], [4, 4, 11, 0, 7, 12]], &Device::Cpu).unwrap();
        let run = || {
            let grads = loss(&m, &tokens).unwrap().backward().unwrap();
            let mut cache = KvCache::default();
            m.forward(&tokens.narrow(1, 0, 4).unwrap(), 0, Some(&mut cache)).unwrap();
            let cached = m.forward(&tokens.narrow(1, 4, 2).unwrap(), 4, Some(&mut cache)).unwrap();
            let mut out = vec![m.forward(&tokens, 0, None).unwrap(), cached];
            out.extend(m.named_vars().iter().map(|(_, v)| grads.get(v.as_tensor()).unwrap().clone()));
            out
        };
        let fused = run();
        let composed = crate::kernels::composed(run);
        for (i, (a, b)) in fused.iter().zip(&composed).enumerate() {
            let d = (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f64>().unwrap();
            let scale = b.abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f64>().unwrap();
            assert!(d <= 1e-12 * (1.0 + scale), "output {i}: fused and composed differ by {d}");
        }
    }

    /// Every parameter tensor's analytic gradient agrees with central finite differences.
    #[test]
    fn finite_difference_gradient_check_on_every_parameter() {
        let m = tiny();
        let tokens = Tensor::new(&[[1u32, 5, 2, 9, 3], [4, 4, 11, 0, 7]], &Device::Cpu).unwrap();
        let grads = loss(&m, &tokens).unwrap().backward().unwrap();
        let eps = 1e-6;
        for (name, var) in m.named_vars() {
            let g = grads.get(var.as_tensor()).unwrap_or_else(|| panic!("{name} received no gradient"));
            let g: Vec<f64> = g.flatten_all().unwrap().to_vec1().unwrap();
            let base: Vec<f64> = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
            // A few coordinates per tensor keep the test fast; they differ per tensor.
            let n = base.len();
            for idx in [0, n / 3, n / 2, n - 1] {
                let set = |delta: f64| {
                    let mut v = base.clone();
                    v[idx] += delta;
                    var.set(&Tensor::from_vec(v, var.shape(), &Device::Cpu).unwrap()).unwrap();
                    loss(&m, &tokens).unwrap().to_scalar::<f64>().unwrap()
                };
                let numeric = (set(eps) - set(-eps)) / (2.0 * eps);
                var.set(&Tensor::from_vec(base.clone(), var.shape(), &Device::Cpu).unwrap()).unwrap();
                let tol = 1e-5 * (1.0 + numeric.abs());
                assert!((g[idx] - numeric).abs() < tol, "{name}[{idx}]: analytic {} numeric {numeric}", g[idx]);
            }
            assert!(g.iter().any(|x| x.abs() > 0.0), "{name}: gradient is all zero");
        }
    }

    #[test]
    fn cache_gives_the_same_logits() {
        let m = tiny();
        let tokens = Tensor::new(&[[1u32, 5, 2, 9, 3, 8]], &Device::Cpu).unwrap();
        let full = m.forward(&tokens, 0, None).unwrap();
        let mut cache = KvCache::default();
        let a = m.forward(&tokens.narrow(1, 0, 4).unwrap(), 0, Some(&mut cache)).unwrap();
        let b = m.forward(&tokens.narrow(1, 4, 2).unwrap(), 4, Some(&mut cache)).unwrap();
        let joined = Tensor::cat(&[a, b], 1).unwrap();
        let diff = (full - joined).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f64>().unwrap();
        assert!(diff < 1e-10, "{diff}");
        assert_eq!(cache.len(), 6);
    }

    #[test]
    fn causal_masking() {
        let m = tiny();
        let a = m.forward(&Tensor::new(&[[1u32, 5, 2, 9]], &Device::Cpu).unwrap(), 0, None).unwrap();
        let b = m.forward(&Tensor::new(&[[1u32, 5, 2, 4]], &Device::Cpu).unwrap(), 0, None).unwrap();
        let diff = (a.narrow(1, 0, 3).unwrap() - b.narrow(1, 0, 3).unwrap()).unwrap().abs().unwrap().max_all().unwrap();
        assert!(diff.to_scalar::<f64>().unwrap() < 1e-12, "a later token changed earlier logits");
    }

    #[test]
    fn save_and_load_round_trip() {
        let m = tiny();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.safetensors");
        m.save(&p).unwrap();
        let l = Model::load(&p, &Device::Cpu, DType::F64).unwrap();
        let t = Tensor::new(&[[3u32, 1, 4]], &Device::Cpu).unwrap();
        let d = (m.forward(&t, 0, None).unwrap() - l.forward(&t, 0, None).unwrap())
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap();
        assert_eq!(d.to_scalar::<f64>().unwrap(), 0.0);
    }
}
