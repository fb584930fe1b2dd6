//! Python `str` semantics that the reward depends on and Rust's std does not share.
//!
//! The reference reward runs on Python strings: `splitlines()` breaks on more characters than
//! `\n`/`\r\n`, `strip()` trims a wider whitespace set than `str::trim`, and `\d` in `re` and
//! `int()` accept every Unicode decimal digit. Anything that has to agree with the reference
//! bit for bit goes through these helpers instead of the std equivalents.

/// Python's `str.isspace()`: Rust's `char::is_whitespace` plus the information separators
/// U+001C..=U+001F, which Python treats as whitespace (bidi class B/S).
pub fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `str.strip()` with no arguments.
pub fn py_strip(s: &str) -> &str {
    s.trim_matches(is_py_space)
}

/// Python's `str.splitlines()` (keepends=False): `\r\n` is one boundary, a trailing boundary
/// does not produce an empty last line, and `""` gives no lines.
///
/// Boundaries are `\n \r \x0b \x0c \x1c \x1d \x1e`, U+0085 (UTF-8 `C2 85`) and U+2028/U+2029
/// (`E2 80 A8`/`E2 80 A9`); scanning bytes finds them without decoding characters.
pub fn py_splitlines(s: &str) -> Vec<&str> {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let (mut start, mut i) = (0, 0);
    while i < bytes.len() {
        // Fast path: 8 bytes that are all in 0x20..0x80 hold no boundary (boundaries are
        // control bytes or start with 0xC2/0xE2).
        if let Some(chunk) = bytes.get(i..i + 8) {
            let w = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
            let below_space = w.wrapping_sub(0x2020_2020_2020_2020) & !w & 0x8080_8080_8080_8080;
            if (below_space | (w & 0x8080_8080_8080_8080)) == 0 {
                i += 8;
                continue;
            }
        }
        let b = bytes[i];
        let width = match b {
            b'\n' | 0x0b | 0x0c | 0x1c | 0x1d | 0x1e => 1,
            b'\r' => {
                if bytes.get(i + 1) == Some(&b'\n') {
                    2
                } else {
                    1
                }
            }
            0xc2 if bytes.get(i + 1) == Some(&0x85) => 2,
            0xe2 if bytes.get(i + 1) == Some(&0x80) && matches!(bytes.get(i + 2), Some(0xa8 | 0xa9)) => 3,
            _ => {
                i += 1;
                continue;
            }
        };
        out.push(&s[start..i]);
        i += width;
        start = i;
    }
    if start < bytes.len() {
        out.push(&s[start..]);
    }
    out
}

/// First code point of each run of ten decimal digits (Unicode category Nd) known to
/// Python 3.11 (Unicode 14). Every Nd character is `zero + value` for one of these.
const DIGIT_ZEROS: [u32; 66] = [
    0x30, 0x660, 0x6f0, 0x7c0, 0x966, 0x9e6, 0xa66, 0xae6, 0xb66, 0xbe6, 0xc66, 0xce6, 0xd66, 0xde6, 0xe50, 0xed0,
    0xf20, 0x1040, 0x1090, 0x17e0, 0x1810, 0x1946, 0x19d0, 0x1a80, 0x1a90, 0x1b50, 0x1bb0, 0x1c40, 0x1c50, 0xa620,
    0xa8d0, 0xa900, 0xa9d0, 0xa9f0, 0xaa50, 0xabf0, 0xff10, 0x104a0, 0x10d30, 0x11066, 0x110f0, 0x11136, 0x111d0,
    0x112f0, 0x11450, 0x114d0, 0x11650, 0x116c0, 0x11730, 0x118e0, 0x11950, 0x11c50, 0x11d50, 0x11da0, 0x16a60,
    0x16ac0, 0x16b50, 0x1d7ce, 0x1d7d8, 0x1d7e2, 0x1d7ec, 0x1d7f6, 0x1e140, 0x1e2f0, 0x1e950, 0x1fbf0,
];

/// The value of a Python `\d` character, or `None` if Python does not consider it a digit.
pub fn py_digit(c: char) -> Option<u32> {
    let cp = c as u32;
    if c.is_ascii_digit() {
        return Some(cp - 0x30);
    }
    let idx = DIGIT_ZEROS.partition_point(|&z| z <= cp);
    if idx == 0 {
        return None;
    }
    let off = cp - DIGIT_ZEROS[idx - 1];
    (off < 10).then_some(off)
}

/// A regex character class equivalent to Python's `\d` (for use inside `[...]`).
pub fn py_digit_class() -> String {
    let mut class = String::new();
    for z in DIGIT_ZEROS {
        let lo = char::from_u32(z).expect("table holds valid code points");
        let hi = char::from_u32(z + 9).expect("table holds valid code points");
        class.push_str(&format!("\\x{{{:x}}}-\\x{{{:x}}}", lo as u32, hi as u32));
    }
    class
}

/// Python's `int()` of a string of `\d` characters, `None` when it does not fit in u128
/// (such a number cannot describe a real hunk; callers treat it as a parse failure).
pub fn py_int(digits: &str) -> Option<u128> {
    let mut v: u128 = 0;
    for c in digits.chars() {
        v = v.checked_mul(10)?.checked_add(py_digit(c)? as u128)?;
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitlines_matches_python_boundaries() {
        // Expected values written from Python 3.11: 'a\rb\r\nc\x0bd\x1ce\u2028f\n\n'.splitlines()
        assert_eq!(py_splitlines("a\rb\r\nc\u{0b}d\u{1c}e\u{2028}f\n\n"), vec!["a", "b", "c", "d", "e", "f", ""]);
        assert_eq!(py_splitlines(""), Vec::<&str>::new());
        assert_eq!(py_splitlines("\n"), vec![""]);
        assert_eq!(py_splitlines("x"), vec!["x"]);
        // \x1f is whitespace for strip() but not a line boundary.
        assert_eq!(py_splitlines("a\u{1f}b"), vec!["a\u{1f}b"]);
        assert_eq!(py_splitlines("a\r\rb"), vec!["a", "", "b"]);
        // Long ASCII runs take the 8-byte fast path; boundaries just after one must be seen.
        let long = "0123456789abcdef\n0123456789abcdefg\u{85}xyz\u{2029}tail12345678\r";
        assert_eq!(py_splitlines(long), vec!["0123456789abcdef", "0123456789abcdefg", "xyz", "tail12345678"]);
        assert_eq!(py_splitlines("abcdefgh\u{1}ijklmnop"), vec!["abcdefgh\u{1}ijklmnop"], "\\x01 is no boundary");
    }

    #[test]
    fn strip_includes_information_separators() {
        assert_eq!(py_strip("\u{1c}\u{1f} x \u{85}\u{3000}"), "x");
        assert_eq!("\u{1f}x".trim(), "\u{1f}x", "std trim differs, which is the point");
        assert_eq!(py_strip("\u{200b}x"), "\u{200b}x", "zero-width space is not whitespace");
    }

    #[test]
    fn unicode_digits() {
        assert_eq!(py_int("0042"), Some(42));
        assert_eq!(py_int("\u{661}\u{662}"), Some(12)); // Arabic-Indic 1 2
        assert_eq!(py_int("\u{ff19}"), Some(9)); // fullwidth 9
        assert_eq!(py_digit('x'), None);
        assert_eq!(py_digit('\u{b2}'), None, "superscript two is not Nd");
        assert_eq!(py_int("99999999999999999999999999999999999999999"), None);
    }
}
