//! FNV-1a (64-bit): stable across runs, platforms and versions, unlike std's hasher, for
//! everything that must hash the same tomorrow — input fingerprints, train/test splits, the
//! seeds of deterministic shuffles.

/// The FNV-1a offset basis: the state to start from.
pub const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

const PRIME: u64 = 0x0000_0100_0000_01b3;

/// Folds `bytes` into `state` (start from [`OFFSET`], or from `OFFSET ^ seed` for a seeded
/// family of hashes).
pub fn fnv1a(bytes: impl IntoIterator<Item = u8>, state: u64) -> u64 {
    bytes.into_iter().fold(state, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME))
}

/// FNV-1a of a string from the offset basis.
pub fn fnv1a_str(s: &str) -> u64 {
    fnv1a(s.bytes(), OFFSET)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_test_vectors() {
        // From the FNV reference (isthe.com/chongo/tech/comp/fnv): FNV-1a 64 of "", "a", "foobar".
        assert_eq!(fnv1a_str(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a_str("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a_str("foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn folding_in_pieces_is_folding_the_whole() {
        let whole = fnv1a_str("events/part-1");
        let pieces = fnv1a("part-1".bytes(), fnv1a("events/".bytes(), OFFSET));
        assert_eq!(whole, pieces);
    }
}
