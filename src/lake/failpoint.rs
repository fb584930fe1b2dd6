//! Named points where a test makes the process die as a crash would.

use std::collections::BTreeMap;

/// A named point where a test can make the process die, as a crash would: `SWELAKE_FAILPOINT`
/// = `NAME` (or `NAME#N`, at the N-th time it is reached) aborts the process there, with no
/// cleanup. The names: `upload.before:TABLE`, `upload.after:TABLE`, `commit.before:TABLE`,
/// `commit.after:TABLE`, `shards.after`. With `NAME=pause`, the process sleeps 3 s there
/// instead (for tests of two runs at once).
pub fn failpoint(name: &str) {
    static HITS: std::sync::Mutex<BTreeMap<String, u32>> = std::sync::Mutex::new(BTreeMap::new());
    let Ok(spec) = std::env::var("SWELAKE_FAILPOINT") else { return };
    for one in spec.split(',') {
        let (one, pause) = match one.strip_suffix("=pause") {
            Some(p) => (p, true),
            None => (one, false),
        };
        let (point, nth) = match one.split_once('#') {
            Some((p, n)) => (p, n.parse().unwrap_or(1)),
            None => (one, 1),
        };
        if point != name {
            continue;
        }
        let mut hits = HITS.lock().unwrap_or_else(|e| e.into_inner());
        let n = hits.entry(name.to_string()).or_default();
        *n += 1;
        if *n == nth {
            if pause {
                std::thread::sleep(std::time::Duration::from_secs(3));
            } else {
                eprintln!("failpoint {name}: aborting");
                std::process::abort();
            }
        }
    }
}
