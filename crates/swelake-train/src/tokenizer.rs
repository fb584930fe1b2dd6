//! The policy's tokenizer and ChatML chat template.
//!
//! A GGUF file carries a byte-level BPE (tokens, merges, token types) and a Jinja chat template
//! in its metadata. Rather than interpret Jinja, we recognise ChatML (`<|im_start|>role\n…<|im_end|>`,
//! SmolLM2's and Qwen's format) and refuse other templates with a clear error. The BPE is handed to
//! the `tokenizers` crate as a Hugging Face `tokenizer.json`, which is also how a checkpoint stores it,
//! so a trained model and its tokenizer travel together.
//!
//! Tiny test models use the same machinery with a byte-level vocabulary (256 byte symbols, no
//! merges) plus the ChatML control tokens.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

pub const IM_START: &str = "<|im_start|>";
pub const IM_END: &str = "<|im_end|>";
pub const END_OF_TEXT: &str = "<|endoftext|>";

/// A chat message.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Message {
        Message { role: role.into(), content: content.into() }
    }
}

/// What the chat template needs besides the BPE.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct ChatInfo {
    /// Token that ends an assistant turn (generation stops there).
    eos: String,
    /// System prompt the template inserts when a conversation has none.
    default_system: Option<String>,
}

pub struct ChatTokenizer {
    inner: tokenizers::Tokenizer,
    info: ChatInfo,
    eos_id: u32,
    vocab_size: usize,
}

/// The pre-tokenizer and decoder of GPT-2-style byte-level BPE with digits split one by one
/// (SmolLM2's `tokenizer.json`; llama.cpp's "smollm" pre-tokenizer type is the same regexes).
fn byte_level_parts() -> (Value, Value) {
    (
        json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
        ]}),
        json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}),
    )
}

fn added_token(id: usize, content: &str) -> Value {
    json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
           "normalized": false, "special": true})
}

fn tokenizer_json(vocab: serde_json::Map<String, Value>, merges: Vec<Value>, added: Vec<Value>) -> Value {
    let (pre, dec) = byte_level_parts();
    json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": pre, "post_processor": null, "decoder": dec,
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merges}
    })
}

/// The system prompt a ChatML template inserts when the first message is not a system one:
/// the literal between `<|im_start|>system\n` and `<|im_end|>` in the template source.
fn default_system_of(template: &str) -> Option<String> {
    let start = template
        .find("<|im_start|>system\\n")
        .map(|i| (i, "<|im_start|>system\\n".len()))
        .or_else(|| template.find("<|im_start|>system\n").map(|i| (i, "<|im_start|>system\n".len())))?;
    let rest = &template[start.0 + start.1..];
    let end = rest.find(IM_END)?;
    let lit = &rest[..end];
    // A literal, not a `{{ message['content'] }}` expression.
    (!lit.contains("{{") && !lit.contains('\'') && !lit.is_empty()).then(|| lit.to_string())
}

impl ChatTokenizer {
    fn from_json(doc: &Value, info: ChatInfo) -> Result<ChatTokenizer> {
        let inner: tokenizers::Tokenizer =
            doc.to_string().parse().map_err(|e| anyhow::anyhow!("building the tokenizer: {e}"))?;
        let eos_id = inner.token_to_id(&info.eos).with_context(|| format!("tokenizer has no `{}` token", info.eos))?;
        for t in [IM_START, IM_END] {
            if inner.token_to_id(t).is_none() {
                bail!("tokenizer has no `{t}` token: only ChatML models are supported");
            }
        }
        let vocab_size = inner.get_vocab_size(true);
        Ok(ChatTokenizer { inner, info, eos_id, vocab_size })
    }

    /// The tokenizer of a GGUF file's metadata.
    pub fn from_gguf_metadata(
        md: &std::collections::HashMap<String, candle_core::quantized::gguf_file::Value>,
    ) -> Result<ChatTokenizer> {
        let s = |k: &str| -> Result<String> {
            Ok(md.get(k).with_context(|| format!("GGUF metadata without {k}"))?.to_string()?.clone())
        };
        let model = s("tokenizer.ggml.model")?;
        if model != "gpt2" {
            bail!("GGUF tokenizer model {model:?}: only byte-level BPE (gpt2) is supported");
        }
        let tokens: Vec<String> = md
            .get("tokenizer.ggml.tokens")
            .context("GGUF metadata without tokenizer.ggml.tokens")?
            .to_vec()?
            .iter()
            .map(|v| v.to_string().cloned())
            .collect::<std::result::Result<_, _>>()?;
        let types: Vec<i32> = match md.get("tokenizer.ggml.token_type") {
            Some(v) => v.to_vec()?.iter().map(|t| t.to_i32()).collect::<std::result::Result<_, _>>()?,
            None => vec![1; tokens.len()],
        };
        let merges: Vec<Value> = md
            .get("tokenizer.ggml.merges")
            .context("GGUF metadata without tokenizer.ggml.merges")?
            .to_vec()?
            .iter()
            .map(|v| v.to_string().map(|m| Value::String(m.clone())))
            .collect::<std::result::Result<_, _>>()?;
        let template = s("tokenizer.chat_template").unwrap_or_default();
        if !template.contains(IM_START) {
            bail!("the GGUF chat template is not ChatML; only ChatML models are supported");
        }
        let eos_id = md.get("tokenizer.ggml.eos_token_id").map(|v| v.to_u32()).transpose()?;
        let mut vocab = serde_json::Map::new();
        let mut added = Vec::new();
        for (id, (tok, ty)) in tokens.iter().zip(types.iter().chain(std::iter::repeat(&1))).enumerate() {
            vocab.insert(tok.clone(), json!(id));
            // 3 = control, 4 = user-defined: matched whole, never split by the BPE.
            if *ty == 3 || *ty == 4 {
                added.push(added_token(id, tok));
            }
        }
        // The end of an assistant turn is <|im_end|> in ChatML, whatever the file's eos says.
        let eos = if vocab.contains_key(IM_END) {
            IM_END.to_string()
        } else {
            eos_id.and_then(|i| tokens.get(i as usize).cloned()).context("no end-of-turn token")?
        };
        let info = ChatInfo { eos, default_system: default_system_of(&template) };
        Self::from_json(&tokenizer_json(vocab, merges, added), info)
    }

    /// The tokenizer of a GGUF file, without loading its tensors.
    pub fn from_gguf_file(path: &Path) -> Result<ChatTokenizer> {
        let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let content = candle_core::quantized::gguf_file::Content::read(&mut f)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        Self::from_gguf_metadata(&content.metadata)
    }

    /// A byte-level tokenizer without merges (ids 0..256 are bytes), plus the ChatML tokens:
    /// the vocabulary of tiny test models.
    pub fn bytes() -> Result<ChatTokenizer> {
        let mut alphabet: Vec<char> =
            tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet().into_iter().collect();
        alphabet.sort_unstable();
        let mut vocab = serde_json::Map::new();
        for (i, c) in alphabet.iter().enumerate() {
            vocab.insert(c.to_string(), json!(i));
        }
        let mut added = Vec::new();
        for t in [END_OF_TEXT, IM_START, IM_END] {
            let id = vocab.len();
            vocab.insert(t.to_string(), json!(id));
            added.push(added_token(id, t));
        }
        Self::from_json(&tokenizer_json(vocab, vec![], added), ChatInfo { eos: IM_END.into(), default_system: None })
    }

    /// Writes `tokenizer.json` and `chat.json` into `dir`.
    pub fn save(&self, dir: &Path) -> Result<()> {
        self.inner.save(dir.join("tokenizer.json"), false).map_err(|e| anyhow::anyhow!("saving the tokenizer: {e}"))?;
        std::fs::write(dir.join("chat.json"), serde_json::to_string_pretty(&self.info)?)?;
        Ok(())
    }

    pub fn load(dir: &Path) -> Result<ChatTokenizer> {
        let text = std::fs::read_to_string(dir.join("tokenizer.json"))
            .with_context(|| format!("reading {}", dir.join("tokenizer.json").display()))?;
        let info: ChatInfo = serde_json::from_str(&std::fs::read_to_string(dir.join("chat.json"))?)?;
        Self::from_json(&serde_json::from_str(&text)?, info)
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn eos_id(&self) -> u32 {
        self.eos_id
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, false).map_err(|e| anyhow::anyhow!("tokenizing: {e}"))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`, control tokens dropped.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, true).map_err(|e| anyhow::anyhow!("decoding: {e}"))
    }

    /// The ChatML rendering of `messages`, ending with the assistant header when
    /// `generation_prompt` (the text the model continues).
    pub fn render_chat(&self, messages: &[Message], generation_prompt: bool) -> String {
        let mut s = String::new();
        if let (Some(sys), Some(first)) = (&self.info.default_system, messages.first()) {
            if first.role != "system" {
                s.push_str(&format!("{IM_START}system\n{sys}{IM_END}\n"));
            }
        }
        for m in messages {
            s.push_str(&format!("{IM_START}{}\n{}{IM_END}\n", m.role, m.content));
        }
        if generation_prompt {
            s.push_str(&format!("{IM_START}assistant\n"));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_tokenizer_round_trips_text_and_keeps_control_tokens_whole() {
        let t = ChatTokenizer::bytes().unwrap();
        assert_eq!(t.vocab_size(), 259);
        let text = "héllo <think>x = 42</think>\n";
        let ids = t.encode(text).unwrap();
        assert_eq!(ids.len(), text.len());
        assert_eq!(t.decode(&ids).unwrap(), text);
        let chat = t.render_chat(&[Message::new("user", "hi")], true);
        assert_eq!(chat, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
        let ids = t.encode(&chat).unwrap();
        assert_eq!(ids[0], 257);
        assert_eq!(ids.iter().filter(|&&i| i == t.eos_id()).count(), 1);
        let dir = tempfile::tempdir().unwrap();
        t.save(dir.path()).unwrap();
        assert_eq!(ChatTokenizer::load(dir.path()).unwrap().encode(&chat).unwrap(), ids);
    }

    #[test]
    fn default_system_prompt_is_read_from_a_chatml_template() {
        let tpl = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}";
        assert_eq!(
            default_system_of(tpl).as_deref(),
            Some("You are a helpful AI assistant named SmolLM, trained by Hugging Face")
        );
        assert_eq!(default_system_of("{{'<|im_start|>' + message['role'] + '\n'}}"), None);
    }
}
