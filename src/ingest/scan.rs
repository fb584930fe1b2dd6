//! Splitting a JSON object line into its top-level members without parsing the values.
//!
//! The ingest then hands each member's text to serde exactly once (typed where it needs the
//! content, validated with `IgnoredAny` where it does not), instead of validating the whole
//! payload as a raw value and parsing it again as a typed one — the payload is most of the
//! bytes of an archive. The scanner checks the object's own structure (braces, keys,
//! colons, commas, nothing after the end); value spans are found by matching brackets and
//! skipping strings, and are only trusted after serde has parsed them.

use std::borrow::Cow;

/// Why a line is not a well-formed JSON object, with the byte position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanError {
    pub message: String,
}

fn err(message: impl Into<String>) -> ScanError {
    ScanError { message: message.into() }
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// End (exclusive) of the string starting with the quote at `i`.
fn skip_string(b: &[u8], i: usize) -> Result<usize, ScanError> {
    let mut j = i + 1;
    loop {
        match memchr::memchr2(b'"', b'\\', &b[j..]) {
            Some(off) => {
                let at = j + off;
                if b[at] == b'"' {
                    return Ok(at + 1);
                }
                // A backslash escapes the next byte (for \uXXXX the digits are plain bytes).
                j = at + 2;
                if j > b.len() {
                    return Err(err(format!("unterminated string starting at byte {i}")));
                }
            }
            None => return Err(err(format!("unterminated string starting at byte {i}"))),
        }
    }
}

/// End (exclusive) of the value starting at `i` (not validated; serde does that).
fn skip_value(b: &[u8], i: usize) -> Result<usize, ScanError> {
    match b.get(i) {
        None => Err(err("expected a value at the end of the line")),
        Some(b'"') => skip_string(b, i),
        Some(b'{' | b'[') => {
            let mut depth = 0usize;
            let mut j = i;
            while j < b.len() {
                match b[j] {
                    b'"' => {
                        j = skip_string(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Ok(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            Err(err(format!("unclosed object or array starting at byte {i}")))
        }
        Some(_) => {
            let mut j = i;
            while j < b.len() && !matches!(b[j], b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r') {
                j += 1;
            }
            if j == i {
                return Err(err(format!("expected a value at byte {i}")));
            }
            Ok(j)
        }
    }
}

/// The members of a top-level object, in order: (key, value text). Keys with escapes are
/// decoded, as JSON compares them.
pub fn members(line: &str) -> Result<Vec<(Cow<'_, str>, &str)>, ScanError> {
    members_with(line, |_, _, _| None)
}

/// As [`members`], but `value_end(members so far, key, start)` may find the end of a value
/// itself (for example by parsing it with serde, which then need not see it again); `None`
/// leaves the value to the scanner.
pub fn members_with<'a>(
    line: &'a str,
    mut value_end: impl FnMut(&[(Cow<'a, str>, &'a str)], &str, usize) -> Option<usize>,
) -> Result<Vec<(Cow<'a, str>, &'a str)>, ScanError> {
    let b = line.as_bytes();
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return Err(err("expected '{' at the start of the line"));
    }
    i = skip_ws(b, i + 1);
    let mut out = Vec::with_capacity(10);
    if b.get(i) == Some(&b'}') {
        i += 1;
    } else {
        loop {
            if b.get(i) != Some(&b'"') {
                return Err(err(format!("expected a key at byte {i}")));
            }
            let key_end = skip_string(b, i)?;
            let raw_key = &line[i + 1..key_end - 1];
            if raw_key.bytes().any(|c| c < 0x20) {
                return Err(err(format!("control character in the key at byte {i}")));
            }
            let key: Cow<str> = if raw_key.contains('\\') {
                Cow::Owned(
                    serde_json::from_str::<String>(&line[i..key_end])
                        .map_err(|e| err(format!("bad key at byte {i}: {e}")))?,
                )
            } else {
                Cow::Borrowed(raw_key)
            };
            i = skip_ws(b, key_end);
            if b.get(i) != Some(&b':') {
                return Err(err(format!("expected ':' at byte {i}")));
            }
            i = skip_ws(b, i + 1);
            let end = match value_end(&out, &key, i) {
                Some(end) => end,
                None => skip_value(b, i)?,
            };
            out.push((key, &line[i..end]));
            i = skip_ws(b, end);
            match b.get(i) {
                Some(b',') => i = skip_ws(b, i + 1),
                Some(b'}') => {
                    i += 1;
                    break;
                }
                _ => return Err(err(format!("expected ',' or '}}' at byte {i}"))),
            }
        }
    }
    if skip_ws(b, i) != b.len() {
        return Err(err(format!("trailing characters at byte {i}")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// Every member span parses to the same value serde finds for that key, and lines are
    /// rejected exactly when serde rejects them (once each span is validated by serde too).
    #[test]
    fn agrees_with_serde() {
        let lines = [
            r#"{"a":1,"b":"x","c":{"d":[1,2,{"e":"}]"}]},"f":null,"g":true,"h":-1.5e3}"#,
            r#" { "k" : "with \"quotes\" and \\ backslash\\" , "n" : [ ] , "o" : { } } "#,
            r#"{"u":"\u0041\ud83d\ude00","s":"]}{[","p\u0061yload":{"x":"y"}}"#,
            r#"{}"#,
            r#"{"a":[[],[[]],{"b":[{}]}]}"#,
            r#"{"a":"é€😀","b":"\\\\"}"#,
        ];
        for l in lines {
            let want: serde_json::Map<String, Value> = serde_json::from_str(l).unwrap();
            let got = members(l).unwrap();
            assert_eq!(got.len(), want.len(), "{l}");
            for (k, v) in got {
                let parsed: Value = serde_json::from_str(v).unwrap();
                assert_eq!(&parsed, &want[k.as_ref()], "{l} key {k}");
            }
        }
        let bad = [
            r#"{"a":1"#,
            r#"{"a":1,}"#,
            r#"{"a" 1}"#,
            r#"{"a":1} x"#,
            r#"{a:1}"#,
            r#"{"a":"unterminated}"#,
            r#"{"a":[1,2}"#,
            r#"{"a":1 "b":2}"#,
            r#"{"a":}"#,
            r#"{"a":[}"#,
        ];
        for l in bad {
            assert!(serde_json::from_str::<Value>(l).is_err(), "{l} is invalid JSON");
            // Either the scanner rejects it, or one of its spans fails serde.
            let accepted = match members(l) {
                Ok(m) => m.iter().all(|(_, v)| serde_json::from_str::<serde::de::IgnoredAny>(v).is_ok()),
                Err(_) => false,
            };
            assert!(!accepted, "{l} must be rejected");
        }
    }
}
