//! Where untrusted code runs: a PR's tests, a model's patch. Debian's `bubblewrap` gives each
//! run new namespaces (no network, its own process tree), the host's system directories
//! read-only and nothing else of the host (no home, no lake, no caches but the environment it
//! runs in), one writable tree, a private `/tmp`, an empty environment, resource limits, and a
//! kill of the whole process tree at the timeout: when the sandbox's first process dies, the
//! kernel ends every process of its PID namespace, daemons included.
//!
//! Without bubblewrap a run is refused with a clear error; `--sandbox none` runs without it
//! only when asked, with a warning.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// How runs are isolated.
#[derive(Debug, Clone)]
pub struct Sandbox {
    /// `bwrap`'s path, or `None` for `--sandbox none`.
    bwrap: Option<PathBuf>,
    /// Address-space limit per process (MiB).
    pub memory_mb: u64,
    /// Process limit (RLIMIT_NPROC: per user, so it counts the host's processes of the same
    /// user too; the PID namespace is what ends them).
    pub max_processes: u64,
    /// Largest file a run may write (MiB).
    pub max_file_mb: u64,
}

/// How one run ended.
#[derive(Debug, Clone)]
pub struct Exit {
    /// The exit status (`None` when killed by a signal).
    pub code: Option<i32>,
    pub timed_out: bool,
    pub seconds: f64,
}

/// What a run sees of the host besides the system directories.
#[derive(Debug, Clone, Default)]
pub struct Mounts {
    pub read_only: Vec<PathBuf>,
    pub writable: Vec<PathBuf>,
}

/// Files of `/etc` that hold secrets and that a process running as the host's user could read.
const MASKED: &[&str] = &["/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/sudoers"];

impl Sandbox {
    /// `kind` is `bwrap` (found on PATH and tried once) or `none`.
    pub fn new(kind: &str, memory_mb: u64, max_processes: u64) -> Result<Sandbox> {
        let bwrap = match kind {
            "none" => {
                eprintln!(
                    "warning: --sandbox none: the PRs' tests and the models' patches run with this user's rights, \
                     network and files"
                );
                None
            }
            "bwrap" => {
                let path = which("bwrap").context(
                    "no sandbox: `bwrap` (Debian's bubblewrap) is not on PATH. Install it (apt-get install bubblewrap), \
                     or pass --sandbox none to run untrusted tests without one",
                )?;
                let probe = Command::new(&path)
                    .args(["--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "--", "/bin/true"])
                    .stdin(Stdio::null())
                    .output()
                    .with_context(|| format!("running {}", path.display()))?;
                if !probe.status.success() {
                    bail!(
                        "no sandbox: bubblewrap cannot create namespaces here ({}): {}. Allow unprivileged user \
                         namespaces (sysctl kernel.unprivileged_userns_clone=1), or pass --sandbox none",
                        probe.status,
                        String::from_utf8_lossy(&probe.stderr).trim()
                    );
                }
                Some(path)
            }
            other => bail!("unknown sandbox `{other}` (bwrap or none)"),
        };
        Ok(Sandbox { bwrap, memory_mb, max_processes, max_file_mb: 1024 })
    }

    pub fn kind(&self) -> &'static str {
        if self.bwrap.is_some() {
            "bwrap"
        } else {
            "none"
        }
    }

    /// Runs `argv` in `cwd` with exactly `env`, its output (both streams) to `log`, killed with
    /// everything it started after `timeout`.
    pub fn run(
        &self,
        argv: &[String],
        cwd: &Path,
        env: &[(String, String)],
        mounts: &Mounts,
        log: &Path,
        timeout: Duration,
    ) -> Result<Exit> {
        let out = File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        let mut cmd = match &self.bwrap {
            Some(bwrap) => {
                let mut c = Command::new(bwrap);
                c.args(bwrap_args(cwd, env, mounts)).arg("--").args(argv);
                c
            }
            None => {
                let mut c = Command::new(&argv[0]);
                c.args(&argv[1..]).current_dir(cwd).env_clear().envs(env.iter().map(|(k, v)| (k, v)));
                c
            }
        };
        cmd.stdin(Stdio::null()).stdout(out).stderr(err).process_group(0);
        let limits = Limits {
            memory: self.memory_mb << 20,
            processes: self.max_processes,
            file: self.max_file_mb << 20,
            cpu: timeout.as_secs() + 5,
        };
        // SAFETY: between fork and exec only async-signal-safe calls (setrlimit).
        unsafe {
            cmd.pre_exec(move || limits.apply());
        }
        let started = Instant::now();
        let mut child = cmd.spawn().with_context(|| format!("starting {}", argv.join(" ")))?;
        let pgid = child.id() as i32;
        loop {
            if let Some(status) = child.try_wait()? {
                // Whatever the run left behind in its process group goes with it.
                unsafe { libc::kill(-pgid, libc::SIGKILL) };
                return Ok(Exit { code: status.code(), timed_out: false, seconds: started.elapsed().as_secs_f64() });
            }
            if started.elapsed() >= timeout {
                unsafe { libc::kill(-pgid, libc::SIGKILL) };
                let _ = child.kill();
                let _ = child.wait();
                return Ok(Exit { code: None, timed_out: true, seconds: started.elapsed().as_secs_f64() });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// bubblewrap's arguments: new namespaces of every kind (network included), the system
/// directories read-only, `/etc` without its secrets, a private `/tmp`, `/proc` and `/dev` of
/// the sandbox, the given mounts, an empty environment but `env`.
fn bwrap_args(cwd: &Path, env: &[(String, String)], mounts: &Mounts) -> Vec<String> {
    let mut a: Vec<String> =
        ["--unshare-all", "--die-with-parent", "--new-session", "--clearenv"].iter().map(|s| s.to_string()).collect();
    let mut add = |xs: &[&str]| a.extend(xs.iter().map(|s| s.to_string()));
    add(&["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]);
    for dir in ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"] {
        match std::fs::read_link(dir) {
            Ok(target) => add(&["--symlink", &target.to_string_lossy(), dir]),
            Err(_) if Path::new(dir).is_dir() => add(&["--ro-bind", dir, dir]),
            Err(_) => {}
        }
    }
    for f in MASKED {
        if Path::new(f).exists() {
            add(&["--ro-bind", "/dev/null", f]);
        }
    }
    add(&["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]);
    for p in &mounts.read_only {
        let p = p.to_string_lossy();
        add(&["--ro-bind", &p, &p]);
    }
    for p in &mounts.writable {
        let p = p.to_string_lossy();
        add(&["--bind", &p, &p]);
    }
    for (k, v) in env {
        add(&["--setenv", k, v]);
    }
    add(&["--chdir", &cwd.to_string_lossy()]);
    a
}

#[derive(Clone, Copy)]
struct Limits {
    memory: u64,
    processes: u64,
    file: u64,
    cpu: u64,
}

impl Limits {
    fn apply(&self) -> std::io::Result<()> {
        let set = |resource, value: u64| {
            let lim = libc::rlimit { rlim_cur: value as libc::rlim_t, rlim_max: value as libc::rlim_t };
            // SAFETY: a plain system call on a valid struct.
            if unsafe { libc::setrlimit(resource, &lim) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        };
        set(libc::RLIMIT_AS, self.memory)?;
        set(libc::RLIMIT_NPROC, self.processes)?;
        set(libc::RLIMIT_FSIZE, self.file)?;
        set(libc::RLIMIT_CPU, self.cpu)?;
        set(libc::RLIMIT_CORE, 0)
    }
}

/// `name` on PATH.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// The last `lines` lines of a log (at most 64 KiB read), for a verdict's reason.
pub fn tail(log: &Path, lines: usize) -> String {
    let Ok(mut f) = File::open(log) else { return String::new() };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 << 10)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
