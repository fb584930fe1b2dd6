//! Splitting the git stages' work over workers by repository: `--shard I/N` takes the
//! repositories whose stable hash falls in shard I, so N workers (processes, Kubernetes
//! indexed-Job pods, Airflow tasks) cover every repository exactly once, whatever order they
//! see them in and wherever they run.

use std::fmt;
use std::str::FromStr;

/// Shard `index` of `count` (`0 <= index < count`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

impl Shard {
    /// Whether `repo` (owner/name) is this shard's. Case-insensitive, as GitHub names are,
    /// and by FNV-1a: the same answer on every machine and in every release.
    pub fn owns(&self, repo: &str) -> bool {
        self.count <= 1 || shard_of(repo, self.count) == self.index
    }

    /// The lease key of this shard's work, so that two workers of different shards never
    /// wait for each other.
    pub fn lease_key(&self) -> String {
        format!("__shard_{}_of_{}", self.index, self.count)
    }
}

/// The shard `repo` falls in among `count`.
pub fn shard_of(repo: &str, count: u32) -> u32 {
    let h = crate::hash::fnv1a(repo.bytes().map(|b| b.to_ascii_lowercase()), crate::hash::OFFSET);
    // FNV's low bits mix poorly for short keys; fold the high half in first.
    ((h ^ (h >> 32)) % u64::from(count.max(1))) as u32
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl FromStr for Shard {
    type Err = String;

    fn from_str(s: &str) -> Result<Shard, String> {
        let bad = || format!("`{s}`: expected I/N with 0 <= I < N, e.g. 0/4");
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let index: u32 = i.trim().parse().map_err(|_| bad())?;
        let count: u32 = n.trim().parse().map_err(|_| bad())?;
        if count == 0 || index >= count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        assert_eq!("1/4".parse::<Shard>(), Ok(Shard { index: 1, count: 4 }));
        for bad in ["4/4", "1", "a/2", "0/0", "-1/2"] {
            assert!(bad.parse::<Shard>().is_err(), "{bad}");
        }
    }

    #[test]
    fn every_repository_in_exactly_one_shard_and_spread() {
        let repos: Vec<String> = (0..1000).map(|i| format!("owner{}/repo-{i}", i % 37)).collect();
        let shards: Vec<Shard> = (0..4).map(|index| Shard { index, count: 4 }).collect();
        let mut per = [0usize; 4];
        for r in &repos {
            let owners: Vec<&Shard> = shards.iter().filter(|s| s.owns(r)).collect();
            assert_eq!(owners.len(), 1, "{r}");
            per[owners[0].index as usize] += 1;
            assert!(owners[0].owns(&r.to_uppercase()), "case-insensitive: {r}");
        }
        // 1000 names over 4 shards: each gets a fair share (binomial sd ~14).
        assert!(per.iter().all(|&n| (180..=320).contains(&n)), "{per:?}");
    }

    #[test]
    fn stable_across_releases() {
        // Fixed answers: a change of the hash would move repositories between workers whose
        // mirrors are cached per shard.
        assert_eq!(shard_of("pallets/jinja", 2), shard_of("PALLETS/JINJA", 2));
        let v: Vec<u32> = ["pallets/jinja", "pallets/werkzeug", "pallets/flask", "rust-lang/rust"]
            .iter()
            .map(|r| shard_of(r, 16))
            .collect();
        assert_eq!(v, FIXED.to_vec());
    }

    // From an independent Python implementation of FNV-1a 64 (offset 0xcbf29ce484222325,
    // prime 0x100000001b3) over the lowercased name, high half folded in, mod 16.
    const FIXED: [u32; 4] = [9, 9, 15, 1];
}
