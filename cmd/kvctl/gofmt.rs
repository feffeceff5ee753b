//! Re-implementations of the few Go formatting routines whose exact output etcdctl exposes:
//! `strconv.Quote`/`Unquote`, `time.Duration.String`, go-humanize `Bytes`, base64 and `--hex`.
use std::time::Duration;

/// Go's `strconv.Quote` applied to a byte string (invalid UTF-8 bytes become `\xNN`).
pub fn quote(b: &[u8]) -> String {
    let mut out = String::from("\"");
    let mut rest = b;
    while !rest.is_empty() {
        let (ch, len) = match std::str::from_utf8(rest) {
            Ok(s) => {
                let c = s.chars().next().unwrap_or('\0');
                (Some(c), c.len_utf8())
            }
            Err(e) if e.valid_up_to() > 0 => {
                let s = std::str::from_utf8(&rest[..e.valid_up_to()]).unwrap_or_default();
                let c = s.chars().next().unwrap_or('\0');
                (Some(c), c.len_utf8())
            }
            Err(_) => (None, 1),
        };
        match ch {
            None => out.push_str(&format!("\\x{:02x}", rest[0])),
            Some(c) => push_quoted_char(&mut out, c),
        }
        rest = &rest[len..];
    }
    out.push('"');
    out
}

fn push_quoted_char(out: &mut String, c: char) {
    match c {
        '"' => out.push_str("\\\""),
        '\\' => out.push_str("\\\\"),
        '\x07' => out.push_str("\\a"),
        '\x08' => out.push_str("\\b"),
        '\x0c' => out.push_str("\\f"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\x0b' => out.push_str("\\v"),
        ' '..='~' => out.push(c),
        c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
        c if !c.is_control() && !c.is_whitespace() && (c as u32) != 0xfeff => out.push(c),
        c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
        c => out.push_str(&format!("\\U{:08x}", c as u32)),
    }
}

/// Parses one Go quoted string literal (`"..."` or `` `...` ``) at the start of `s`, as
/// `fmt.Sscanf("%q")` does. Returns the value and the unparsed remainder.
pub fn unquote_prefix(s: &str) -> Result<(Vec<u8>, &str), String> {
    let bad = || "invalid syntax".to_string();
    let mut chars = s.char_indices();
    match chars.next() {
        Some((_, '`')) => {
            let end = s[1..].find('`').ok_or_else(bad)? + 1;
            Ok((s[1..end].replace('\r', "").into_bytes(), &s[end + 1..]))
        }
        Some((_, '"')) => {
            let mut out = Vec::new();
            let bytes = s.as_bytes();
            let mut i = 1;
            while i < bytes.len() {
                match bytes[i] {
                    b'"' => return Ok((out, &s[i + 1..])),
                    b'\n' => return Err(bad()),
                    b'\\' => {
                        let e = *bytes.get(i + 1).ok_or_else(bad)?;
                        i += 2;
                        match e {
                            b'a' => out.push(7),
                            b'b' => out.push(8),
                            b'f' => out.push(12),
                            b'n' => out.push(b'\n'),
                            b'r' => out.push(b'\r'),
                            b't' => out.push(b'\t'),
                            b'v' => out.push(11),
                            b'\\' => out.push(b'\\'),
                            b'"' => out.push(b'"'),
                            b'x' => {
                                let h = s.get(i..i + 2).ok_or_else(bad)?;
                                out.push(u8::from_str_radix(h, 16).map_err(|_| bad())?);
                                i += 2;
                            }
                            b'0'..=b'7' => {
                                let o = s.get(i - 1..i + 2).ok_or_else(bad)?;
                                let v = u32::from_str_radix(o, 8).map_err(|_| bad())?;
                                out.push(u8::try_from(v).map_err(|_| bad())?);
                                i += 2;
                            }
                            b'u' | b'U' => {
                                let n = if e == b'u' { 4 } else { 8 };
                                let h = s.get(i..i + n).ok_or_else(bad)?;
                                let v = u32::from_str_radix(h, 16).map_err(|_| bad())?;
                                let c = char::from_u32(v).ok_or_else(bad)?;
                                let mut buf = [0u8; 4];
                                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                                i += n;
                            }
                            _ => return Err(bad()),
                        }
                    }
                    b => {
                        out.push(b);
                        i += 1;
                    }
                }
            }
            Err(bad())
        }
        _ => Err(bad()),
    }
}

/// Go's `time.Duration.String()`.
pub fn duration_string(d: Duration) -> String {
    let mut u = d.as_nanos() as u64;
    if u == 0 {
        return "0s".to_string();
    }
    if u < 1_000_000_000 {
        let (prec, unit) = if u < 1_000 {
            return format!("{u}ns");
        } else if u < 1_000_000 {
            (3, "µs")
        } else {
            (6, "ms")
        };
        let (frac, int) = fmt_frac(u, prec);
        return format!("{int}{frac}{unit}");
    }
    let (frac, secs) = fmt_frac(u, 9);
    u = secs;
    let mut out = format!("{}{}s", u % 60, frac);
    u /= 60;
    if u > 0 {
        out = format!("{}m{}", u % 60, out);
        u /= 60;
        if u > 0 {
            out = format!("{u}h{out}");
        }
    }
    out
}

/// Splits `v` into integer part and a ".ddd" fraction of `prec` digits without trailing zeros.
fn fmt_frac(v: u64, prec: u32) -> (String, u64) {
    let p = 10u64.pow(prec);
    let frac = v % p;
    if frac == 0 {
        return (String::new(), v / p);
    }
    let digits = format!("{:0width$}", frac, width = prec as usize);
    (format!(".{}", digits.trim_end_matches('0')), v / p)
}

/// go-humanize `Bytes` (SI units), as used for the DB SIZE column.
pub fn humanize_bytes(s: u64) -> String {
    const SIZES: [&str; 7] = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
    if s < 10 {
        return format!("{s} B");
    }
    let e = ((s as f64).ln() / 1000f64.ln()).floor();
    let suffix = SIZES[e as usize];
    let val = ((s as f64) / 1000f64.powf(e) * 10.0 + 0.5).floor() / 10.0;
    if val < 10.0 {
        format!("{val:.1} {suffix}")
    } else {
        format!("{val:.0} {suffix}")
    }
}

/// Standard base64 with padding, as Go's encoding/json writes `[]byte`.
pub fn base64(b: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(b.len().div_ceil(3) * 4);
    for chunk in b.chunks(3) {
        let n = chunk.len();
        let v = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= n {
                out.push(T[((v >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// etcdctl's `--hex` rendering: every byte as `\xNN`.
pub fn hex_prefixed(b: &[u8]) -> String {
    b.iter().map(|x| format!("\\x{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(quote(b"abc"), "\"abc\"");
        assert_eq!(quote(b"a\"b\\c\n\x01\xff"), "\"a\\\"b\\\\c\\n\\x01\\xff\"");
        assert_eq!(quote("héllo".as_bytes()), "\"héllo\"");
        let (v, rest) = unquote_prefix("\"a\\x41\\n\\101\") > x").unwrap();
        assert_eq!(v, b"aA\nA");
        assert_eq!(rest, ") > x");
        let (v, rest) = unquote_prefix("`raw\\n`z").unwrap();
        assert_eq!(v, b"raw\\n");
        assert_eq!(rest, "z");
        assert!(unquote_prefix("\"open").is_err());
        assert!(unquote_prefix("bare").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(duration_string(Duration::ZERO), "0s");
        assert_eq!(duration_string(Duration::from_nanos(999)), "999ns");
        assert_eq!(
            duration_string(Duration::from_nanos(1_868_515)),
            "1.868515ms"
        );
        assert_eq!(duration_string(Duration::from_nanos(12_000)), "12µs");
        assert_eq!(duration_string(Duration::from_millis(1500)), "1.5s");
        assert_eq!(duration_string(Duration::from_secs(3723)), "1h2m3s");
        assert_eq!(duration_string(Duration::from_secs(60)), "1m0s");
    }

    #[test]
    fn humanize() {
        assert_eq!(humanize_bytes(0), "0 B");
        assert_eq!(humanize_bytes(20480), "20 kB");
        assert_eq!(humanize_bytes(1234), "1.2 kB");
        assert_eq!(humanize_bytes(1_500_000), "1.5 MB");
        assert_eq!(humanize_bytes(999), "999 B");
    }

    #[test]
    fn b64_and_hex() {
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"a"), "YQ==");
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(base64(b""), "");
        assert_eq!(hex_prefixed(b"a1"), "\\x61\\x31");
    }
}
