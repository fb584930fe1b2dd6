//! Where untrusted code runs: a PR's tests, a model's patch, and the build code of the
//! packages an environment installs. Debian's `bubblewrap` gives each run new namespaces (no
//! network but for environment builds, its own process tree), the host's system directories
//! read-only and nothing else of the host (no home, no lake, no caches but the environment it
//! runs in), only the files of `/etc` that interpreters and test runners read ([`ETC`]), one
//! writable tree, a private `/tmp`, an empty environment, resource limits, and a kill of the
//! whole process tree at the timeout: when the sandbox's first process dies, the kernel ends
//! every process of its PID namespace, daemons included.
//!
//! Run as root, bubblewrap keeps every capability, and root reads every file of the host and
//! is not held by RLIMIT_NPROC. So a run as root drops to a uid of its own that owns nothing on
//! the host (`setpriv`, no capabilities, no new privileges), one uid per run at a time, so the
//! process limit counts that run alone; its writable tree is handed to that uid first. A whole
//! run is bounded by a cgroup of its own (v2, else v1: total memory and processes) where the
//! host lets this process make one; [`Sandbox::bounds`] says which bounds are in force.
//!
//! Without bubblewrap a run is refused with a clear error; `--sandbox none` runs without it
//! only when asked, with a warning.

use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// The files and directories of the host's `/etc` a run sees (read-only, where they exist):
/// name resolution, certificates, the dynamic loader, alternatives, time zone, MIME types,
/// services. Nothing else of `/etc` is there; `passwd` and `group` are the sandbox's own (the
/// run's uid and root), so no host account is listed. `/etc/ssl` is not shared whole: its
/// `private/` holds keys.
pub const ETC: &[&str] = &[
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/resolv.conf",
    "/etc/nsswitch.conf",
    "/etc/gai.conf",
    "/etc/ssl/certs",
    "/etc/ssl/openssl.cnf",
    "/etc/ca-certificates",
    "/etc/ca-certificates.conf",
    "/etc/pki/tls/certs",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/mime.types",
    "/etc/protocols",
    "/etc/services",
    "/etc/os-release",
    "/etc/debian_version",
    "/etc/locale.alias",
];

/// The first uid (and gid) of the sandbox's own when run as root: environment builds run as
/// this one, test runs as the next ones, a uid each run at a time. Far above any account or
/// subordinate-uid range, so it owns nothing on the host but what a run was handed.
pub const SANDBOX_UID: u32 = 1_900_000_000;
/// How many runs may hold a uid of their own at once.
const SLOTS: u32 = 64;

/// How runs are isolated.
#[derive(Debug, Clone)]
pub struct Sandbox {
    /// `bwrap`'s path, or `None` for `--sandbox none`.
    bwrap: Option<PathBuf>,
    /// Address-space limit per process (MiB).
    pub memory_mb: u64,
    /// Process limit of a run: RLIMIT_NPROC of its own uid, and its cgroup's `pids` limit.
    pub max_processes: u64,
    /// Memory of a whole run, every process together (MiB): its cgroup's limit.
    pub run_memory_mb: u64,
    /// Largest file a run may write (MiB).
    pub max_file_mb: u64,
    /// `setpriv` when this process is root: runs drop to a uid of their own with it.
    setpriv: Option<PathBuf>,
    /// Where runs' cgroups are made, when the host lets this process make them.
    cgroups: Option<Arc<Cgroups>>,
    /// The sandbox's own `passwd` and `group`.
    etc: Arc<tempfile::TempDir>,
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
    /// Handed to the run's uid (the whole tree) before it starts.
    pub writable: Vec<PathBuf>,
    /// Writable and written only by the sandbox's build uid between runs (uv's cache): handed
    /// over whole only when its top is not that uid's yet.
    pub kept: Vec<PathBuf>,
}

/// Options of one run besides its command.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions {
    /// The network of the host (environment builds reach the registry); else none.
    pub network: bool,
    /// As the build uid (which keeps [`Mounts::kept`]) instead of a uid of the run's own.
    pub build: bool,
}

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
        let root = is_root();
        let setpriv = if root && bwrap.is_some() {
            Some(which("setpriv").context(
                "no sandbox: running as root, a run must drop to a uid of its own, and `setpriv` (util-linux) is not \
                 on PATH. Install util-linux, or run swelake as an unprivileged user",
            )?)
        } else {
            None
        };
        let cgroups = if bwrap.is_some() { Cgroups::find().map(Arc::new) } else { None };
        Ok(Sandbox {
            bwrap,
            memory_mb,
            max_processes,
            run_memory_mb: memory_mb.saturating_mul(2),
            max_file_mb: 1024,
            setpriv,
            cgroups,
            etc: Arc::new(own_etc()?),
        })
    }

    /// The same sandbox with a whole run's memory bound (`[verify] run_memory_mb`).
    pub fn with_run_memory(mut self, mb: u64) -> Sandbox {
        self.run_memory_mb = mb;
        self
    }

    pub fn kind(&self) -> &'static str {
        if self.bwrap.is_some() {
            "bwrap"
        } else {
            "none"
        }
    }

    /// Which bounds hold a run, in a line for the log and `status`.
    pub fn bounds(&self) -> String {
        if self.bwrap.is_none() {
            return format!(
                "no sandbox: this user's rights; per process {} MiB of address space, {} processes",
                self.memory_mb, self.max_processes
            );
        }
        let who = if self.setpriv.is_some() {
            format!("as uids {SANDBOX_UID}+ of their own (not root)")
        } else {
            format!("as this user (uid {})", unsafe { libc::geteuid() })
        };
        let whole = match &self.cgroups {
            Some(c) => format!(
                "a run in all: {} MiB and {} processes (cgroup {})",
                self.run_memory_mb,
                self.max_processes,
                c.describe()
            ),
            None => format!(
                "a run in all: {} processes (RLIMIT_NPROC of its uid); no cgroup could be made here, so memory is \
                 bounded per process only",
                self.max_processes
            ),
        };
        format!("bwrap {who}; per process {} MiB of address space; {whole}", self.memory_mb)
    }

    /// Runs `argv` in `cwd` with exactly `env`, its output (both streams) to `log`, killed with
    /// everything it started after `timeout`; no network.
    pub fn run(
        &self,
        argv: &[String],
        cwd: &Path,
        env: &[(String, String)],
        mounts: &Mounts,
        log: &Path,
        timeout: Duration,
    ) -> Result<Exit> {
        self.run_with(argv, cwd, env, mounts, log, timeout, RunOptions::default())
    }

    /// [`Sandbox::run`] with the network or as the build uid.
    #[allow(clippy::too_many_arguments)]
    pub fn run_with(
        &self,
        argv: &[String],
        cwd: &Path,
        env: &[(String, String)],
        mounts: &Mounts,
        log: &Path,
        timeout: Duration,
        opts: RunOptions,
    ) -> Result<Exit> {
        // The log may sit in a tree an earlier run wrote: a link there must not make root
        // create a file elsewhere.
        if let Some(within) = mounts.writable.iter().chain(&mounts.kept).find(|m| log.starts_with(m)) {
            no_links(log.parent().unwrap_or(within), within)?;
        }
        let out = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(log)
            .with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        // The uid is held until the run and everything it started are gone.
        let slot = match (&self.setpriv, opts.build) {
            (Some(_), false) => Some(Slot::take()?),
            _ => None,
        };
        let uid = match (&self.setpriv, &slot) {
            (None, _) => None,
            (Some(_), Some(s)) => Some(SANDBOX_UID + 1 + s.0),
            (Some(_), None) => Some(SANDBOX_UID),
        };
        if let Some(uid) = uid {
            for p in &mounts.writable {
                hand_over(p, uid).with_context(|| format!("handing {} to the sandbox's uid {uid}", p.display()))?;
            }
            for p in &mounts.kept {
                std::fs::create_dir_all(p)?;
                let owner = std::fs::symlink_metadata(p)?.uid();
                if owner != uid {
                    hand_over(p, uid).with_context(|| format!("handing {} to the sandbox's uid {uid}", p.display()))?;
                }
            }
        }
        let cgroup = match &self.cgroups {
            Some(c) => Some(c.make(self.run_memory_mb << 20, self.max_processes)?),
            None => None,
        };
        let mut cmd = match &self.bwrap {
            Some(bwrap) => {
                let mut c = Command::new(bwrap);
                c.args(bwrap_args(cwd, env, mounts, self.etc.path(), uid.is_some(), opts.network)).arg("--");
                if let (Some(setpriv), Some(uid)) = (&self.setpriv, uid) {
                    c.arg(setpriv).args([
                        format!("--reuid={uid}"),
                        format!("--regid={uid}"),
                        "--clear-groups".into(),
                        "--inh-caps=-all".into(),
                        "--bounding-set=-all".into(),
                        "--no-new-privs".into(),
                        "--".into(),
                    ]);
                }
                c.args(argv);
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
        let join: Vec<CString> = cgroup.as_ref().map(|c| c.procs.clone()).unwrap_or_default();
        // SAFETY: between fork and exec only async-signal-safe calls (setrlimit, open, write,
        // close) on memory prepared before the fork.
        unsafe {
            cmd.pre_exec(move || {
                for path in &join {
                    join_cgroup(path)?;
                }
                limits.apply()
            });
        }
        let started = Instant::now();
        let mut child = cmd.spawn().with_context(|| format!("starting {}", argv.join(" ")))?;
        let pgid = child.id() as i32;
        let exit = loop {
            if let Some(status) = child.try_wait()? {
                break Exit { code: status.code(), timed_out: false, seconds: started.elapsed().as_secs_f64() };
            }
            if started.elapsed() >= timeout {
                unsafe { libc::kill(-pgid, libc::SIGKILL) };
                let _ = child.kill();
                let _ = child.wait();
                break Exit { code: None, timed_out: true, seconds: started.elapsed().as_secs_f64() };
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // Whatever the run left behind in its process group or its cgroup goes with it.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        if let Some(c) = cgroup {
            c.remove();
        }
        drop(slot);
        Ok(exit)
    }
}

/// Whether this process runs as root.
fn is_root() -> bool {
    // SAFETY: a plain system call.
    unsafe { libc::geteuid() == 0 }
}

/// The sandbox's `/etc/passwd` and `/etc/group`: root, the sandbox's uids, this user.
fn own_etc() -> Result<tempfile::TempDir> {
    let dir = tempfile::Builder::new().prefix("swelake-sandbox-etc-").tempdir()?;
    let mut passwd = String::from("root:x:0:0:root:/root:/bin/sh\n");
    let mut group = String::from("root:x:0:\n");
    for k in 0..=SLOTS {
        let id = SANDBOX_UID + k;
        passwd.push_str(&format!("sandbox{k}:x:{id}:{id}:sandbox:/tmp:/bin/sh\n"));
        group.push_str(&format!("sandbox{k}:x:{id}:\n"));
    }
    // SAFETY: plain system calls.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    if uid != 0 {
        passwd.push_str(&format!("user:x:{uid}:{gid}:user:/tmp:/bin/sh\n"));
        group.push_str(&format!("user:x:{gid}:\n"));
    }
    passwd.push_str("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
    group.push_str("nogroup:x:65534:\n");
    std::fs::write(dir.path().join("passwd"), passwd)?;
    std::fs::write(dir.path().join("group"), group)?;
    Ok(dir)
}

/// A uid of the sandbox's own, held by one run at a time on this machine: an exclusive `flock`
/// on a file of the slot's, so two swelake processes (a verify run and an evaluate) never share
/// one, and the process limit of a uid is the limit of one run.
struct Slot(u32, #[allow(dead_code)] File);

impl Slot {
    fn take() -> Result<Slot> {
        use std::os::fd::AsRawFd;
        let base = if Path::new("/run").is_dir() { PathBuf::from("/run") } else { std::env::temp_dir() };
        let dir = base.join("swelake-sandbox-slots");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        for k in 0..SLOTS {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(dir.join(k.to_string()))?;
            // SAFETY: a plain system call on an open descriptor.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Ok(Slot(k, f));
            }
        }
        bail!("more than {SLOTS} sandboxed runs at once on this machine")
    }
}

/// Gives `path` and everything under it to `uid`, never following a link: a link a run left
/// behind could otherwise hand a host file to the next run.
fn hand_over(path: &Path, uid: u32) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    std::os::unix::fs::lchown(path, Some(uid), Some(uid))?;
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            hand_over(&entry?.path(), uid)?;
        }
    }
    Ok(())
}

/// bubblewrap's arguments: new namespaces of every kind (the network unless `network`; the
/// user namespace only when not root, since root drops to its own uid instead), the system
/// directories read-only, [`ETC`] and the sandbox's own accounts, a private `/tmp`, `/proc` and
/// `/dev` of the sandbox, the given mounts, an empty environment but `env`.
fn bwrap_args(
    cwd: &Path,
    env: &[(String, String)],
    mounts: &Mounts,
    etc: &Path,
    drops_uid: bool,
    network: bool,
) -> Vec<String> {
    let mut a: Vec<String> = Vec::new();
    let mut add = |xs: &[&str]| a.extend(xs.iter().map(|s| s.to_string()));
    if drops_uid {
        add(&["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]);
        if !network {
            add(&["--unshare-net"]);
        }
    } else {
        add(&["--unshare-all"]);
        if network {
            add(&["--share-net"]);
        }
    }
    add(&["--die-with-parent", "--new-session", "--clearenv", "--ro-bind", "/usr", "/usr"]);
    for dir in ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"] {
        match std::fs::read_link(dir) {
            Ok(target) => add(&["--symlink", &target.to_string_lossy(), dir]),
            Err(_) if Path::new(dir).is_dir() => add(&["--ro-bind", dir, dir]),
            Err(_) => {}
        }
    }
    add(&["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp"]);
    let etc_files: Vec<String> = ETC.iter().filter(|f| Path::new(f).exists()).map(|f| f.to_string()).collect();
    let own: Vec<(String, String)> =
        ["passwd", "group"].iter().map(|f| (etc.join(f).to_string_lossy().into_owned(), format!("/etc/{f}"))).collect();
    let user: Vec<String> = mounts
        .read_only
        .iter()
        .chain(&mounts.writable)
        .chain(&mounts.kept)
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    // bubblewrap makes the directories above a mount point 0700, which the run's uid could not
    // pass: they are made first, 0755.
    let targets: Vec<&str> = etc_files
        .iter()
        .map(String::as_str)
        .chain(own.iter().map(|(_, t)| t.as_str()))
        .chain(user.iter().map(String::as_str))
        .collect();
    for d in parent_dirs(&targets) {
        add(&["--perms", "0755", "--dir", &d]);
    }
    for f in &etc_files {
        add(&["--ro-bind", f, f]);
    }
    for (src, dest) in &own {
        add(&["--ro-bind", src, dest]);
    }
    for p in &mounts.read_only {
        let p = p.to_string_lossy();
        add(&["--ro-bind", &p, &p]);
    }
    for p in mounts.writable.iter().chain(&mounts.kept) {
        let p = p.to_string_lossy();
        add(&["--bind", &p, &p]);
    }
    for (k, v) in env {
        add(&["--setenv", k, v]);
    }
    add(&["--chdir", &cwd.to_string_lossy()]);
    a
}

/// The directories above `targets` that the sandbox must make, parents first: not `/`, not
/// what is there already (`/usr`, `/tmp`, `/proc`, `/dev`), not a target or what is inside one.
fn parent_dirs(targets: &[&str]) -> Vec<String> {
    let given = |d: &Path| {
        ["/usr", "/proc", "/dev"].iter().any(|m| d.starts_with(m))
            || d == Path::new("/tmp")
            || targets.iter().any(|t| d.starts_with(t))
    };
    let mut out = std::collections::BTreeSet::new();
    for t in targets {
        for d in Path::new(t).ancestors().skip(1) {
            if d != Path::new("/") && !given(d) {
                out.insert(d.to_string_lossy().into_owned());
            }
        }
    }
    // Sorted as strings, a parent comes before its children.
    out.into_iter().collect()
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

/// Moves the calling process into the cgroup whose `cgroup.procs` is `procs` ("0": itself).
/// Called between fork and exec: system calls only.
fn join_cgroup(procs: &CString) -> std::io::Result<()> {
    // SAFETY: open/write/close on a NUL-terminated path and a static buffer.
    unsafe {
        let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let n = libc::write(fd, b"0".as_ptr().cast(), 1);
        let e = std::io::Error::last_os_error();
        libc::close(fd);
        if n != 1 {
            return Err(e);
        }
    }
    Ok(())
}

/// Where this process may make cgroups that bound memory and processes: a cgroup v2 directory
/// with both controllers, or the v1 hierarchies of each.
#[derive(Debug)]
struct Cgroups {
    /// v2: the parent directory; its children get `memory.max` and `pids.max`.
    v2: Option<PathBuf>,
    /// v1: the memory hierarchy's and the pids hierarchy's parent directories.
    v1_memory: Option<PathBuf>,
    v1_pids: Option<PathBuf>,
}

/// One run's cgroup directories and the `cgroup.procs` files its first process joins.
struct RunCgroup {
    dirs: Vec<PathBuf>,
    procs: Vec<CString>,
}

static CGROUP_SEQ: AtomicU64 = AtomicU64::new(0);

impl Cgroups {
    /// This process's cgroups where it may make children that hold both bounds, tried once
    /// with a probe; `None` where it may not (the bounds then are per uid and per process).
    fn find() -> Option<Cgroups> {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        // (mount point, root of the mount, fs type, super options)
        let mut points: Vec<(String, String, String, String)> = Vec::new();
        for line in mounts.lines() {
            let (pre, post) = line.split_once(" - ")?;
            let f: Vec<&str> = pre.split(' ').collect();
            let g: Vec<&str> = post.split(' ').collect();
            if f.len() >= 5 && g.len() >= 3 && (g[0] == "cgroup" || g[0] == "cgroup2") {
                points.push((f[4].to_string(), f[3].to_string(), g[0].to_string(), g[2].to_string()));
            }
        }
        let dir_of = |point: &(String, String, String, String), path: &str| -> PathBuf {
            let rel = path.strip_prefix(point.1.as_str()).unwrap_or(path).trim_start_matches('/');
            Path::new(&point.0).join(rel)
        };
        let mut found = Cgroups { v2: None, v1_memory: None, v1_pids: None };
        for line in own.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
                continue;
            };
            if controllers.is_empty() {
                if let Some(p) = points.iter().find(|p| p.2 == "cgroup2") {
                    let dir = dir_of(p, path);
                    let have = std::fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
                    if have.split_whitespace().any(|c| c == "memory") && have.split_whitespace().any(|c| c == "pids") {
                        // Children get the controllers only if this cgroup hands them down.
                        let _ = std::fs::write(dir.join("cgroup.subtree_control"), "+memory +pids");
                        found.v2 = Some(dir);
                    }
                }
            }
            for c in controllers.split(',') {
                let Some(p) = points.iter().find(|p| p.2 == "cgroup" && p.3.split(',').any(|o| o == c)) else {
                    continue;
                };
                match c {
                    "memory" => found.v1_memory = Some(dir_of(p, path)),
                    "pids" => found.v1_pids = Some(dir_of(p, path)),
                    _ => {}
                }
            }
        }
        // v2 holds both bounds in one directory; v1 needs both hierarchies.
        let v2 = Cgroups { v2: found.v2.clone(), v1_memory: None, v1_pids: None };
        let v1 = Cgroups { v2: None, v1_memory: found.v1_memory, v1_pids: found.v1_pids };
        [v2, v1]
            .into_iter()
            .filter(|c| c.v2.is_some() || (c.v1_memory.is_some() && c.v1_pids.is_some()))
            .find(|c| c.make(64 << 20, 16).map(RunCgroup::remove).is_ok())
    }

    fn describe(&self) -> String {
        match &self.v2 {
            Some(d) => format!("v2 under {}", d.display()),
            None => format!(
                "v1 under {} and {}",
                self.v1_memory.as_deref().unwrap_or(Path::new("?")).display(),
                self.v1_pids.as_deref().unwrap_or(Path::new("?")).display()
            ),
        }
    }

    /// A new cgroup for one run with its bounds set.
    fn make(&self, memory: u64, pids: u64) -> Result<RunCgroup> {
        let name = format!("swelake-{}-{}", std::process::id(), CGROUP_SEQ.fetch_add(1, Ordering::Relaxed));
        let mut run = RunCgroup { dirs: Vec::new(), procs: Vec::new() };
        let mut make_one = |parent: &Path, limits: &[(&str, u64)]| -> Result<()> {
            let dir = parent.join(&name);
            std::fs::create_dir(&dir).with_context(|| format!("making cgroup {}", dir.display()))?;
            run.dirs.push(dir.clone());
            for (file, value) in limits {
                std::fs::write(dir.join(file), value.to_string())
                    .with_context(|| format!("setting {} of cgroup {}", file, dir.display()))?;
            }
            run.procs.push(CString::new(dir.join("cgroup.procs").as_os_str().as_bytes())?);
            Ok(())
        };
        let made = match &self.v2 {
            Some(parent) => make_one(parent, &[("memory.max", memory), ("memory.swap.max", 0), ("pids.max", pids)]),
            None => {
                let mem = self.v1_memory.as_deref().context("no memory cgroup")?;
                let pid = self.v1_pids.as_deref().context("no pids cgroup")?;
                make_one(mem, &[("memory.limit_in_bytes", memory)]).and_then(|_| make_one(pid, &[("pids.max", pids)]))
            }
        };
        if let Err(e) = made {
            run.remove();
            return Err(e);
        }
        Ok(run)
    }
}

impl RunCgroup {
    /// Kills what is still in the cgroup and removes it.
    fn remove(self) {
        for dir in &self.dirs {
            let _ = std::fs::write(dir.join("cgroup.kill"), "1");
            for _ in 0..100 {
                let pids = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                let pids: Vec<i32> = pids.lines().filter_map(|l| l.trim().parse().ok()).collect();
                if pids.is_empty() {
                    break;
                }
                for p in pids {
                    // SAFETY: a plain system call.
                    unsafe { libc::kill(p, libc::SIGKILL) };
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// `name` on PATH.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// Opens a file a run could have written, refusing a link anywhere below `within` (a run
/// may leave `report.xml -> /etc/shadow` for the host to read as root).
pub fn open_output(path: &Path, within: &Path) -> std::io::Result<File> {
    no_links(path, within)?;
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path)
}

/// An error when `path`, or a directory between `within` and it, is a symbolic link.
fn no_links(path: &Path, within: &Path) -> std::io::Result<()> {
    let rel = path.strip_prefix(within).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} is not under {}", path.display(), within.display()),
        )
    })?;
    let mut at = within.to_path_buf();
    for part in rel.components() {
        at.push(part);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!("{} is a link a sandboxed run left", at.display()),
                ))
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The text of a file a run could have written ([`open_output`]), at most `limit` bytes.
pub fn read_output(path: &Path, within: &Path, limit: u64) -> std::io::Result<String> {
    let f = open_output(path, within)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{} is not a file", path.display())));
    }
    let mut buf = Vec::new();
    f.take(limit).read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// The last `lines` lines of a log (at most 64 KiB read), for a verdict's reason. The log's
/// directory may be a run's writable tree: a link there is not followed.
pub fn tail(log: &Path, lines: usize) -> String {
    let within = log.parent().unwrap_or(Path::new("/"));
    let Ok(mut f) = open_output(log, within) else { return String::new() };
    if !f.metadata().is_ok_and(|m| m.is_file()) {
        return String::new();
    }
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 << 10)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Writes `bytes` to `path` in a tree a run could have written, replacing what is there and
/// never through a link (a build may leave `.swelake-ready -> /etc/...` for root to write).
pub fn write_output(path: &Path, within: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    no_links(path.parent().unwrap_or(within), within)?;
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.is_dir() => std::fs::remove_file(path)?,
        _ => {}
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    f.write_all(bytes)
}
