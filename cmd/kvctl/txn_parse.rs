//! etcdctl's txn input format: compares, a blank line, success requests, a blank line, failure
//! requests, a blank line. Every line must end with a newline (etcdctl 3.4 fails with `EOF`
//! otherwise).
use std::ffi::OsString;
use std::io::BufRead;
use std::os::unix::ffi::OsStringExt;

use clap::Parser;
use kvd::proto::etcdserverpb::{
    compare::{CompareResult, CompareTarget, TargetUnion},
    request_op, Compare, RequestOp,
};

use crate::cli::{TxnOpCommand, TxnOpLine};
use crate::error::{CliError, EXIT_INVALID_INPUT};
use crate::gofmt::{quote, unquote_prefix};
use crate::ops;

fn invalid(msg: impl Into<String>) -> CliError {
    CliError::new(EXIT_INVALID_INPUT, msg)
}

/// Reads one `\n`-terminated line, trimmed; `EOF` when the input ends first.
fn read_line(r: &mut dyn BufRead) -> Result<String, CliError> {
    let mut buf = Vec::new();
    r.read_until(b'\n', &mut buf)
        .map_err(|e| invalid(e.to_string()))?;
    if buf.last() != Some(&b'\n') {
        return Err(invalid("EOF"));
    }
    Ok(String::from_utf8_lossy(&buf).trim().to_string())
}

/// Reads compares up to the first blank line.
pub fn read_compares(r: &mut dyn BufRead) -> Result<Vec<Compare>, CliError> {
    let mut cmps = Vec::new();
    loop {
        let line = read_line(r)?;
        if line.is_empty() {
            return Ok(cmps);
        }
        cmps.push(parse_compare(&line)?);
    }
}

/// Reads requests up to the first blank line.
pub fn read_ops(r: &mut dyn BufRead) -> Result<Vec<RequestOp>, CliError> {
    let mut ops = Vec::new();
    loop {
        let line = read_line(r)?;
        if line.is_empty() {
            return Ok(ops);
        }
        ops.push(parse_request(&line)?);
    }
}

fn skip_space(s: &str) -> &str {
    s.trim_start()
}

/// Parses `TARGET("key") OP "value"` (Go: `fmt.Sscanf(rest, "%q) %s %q", ...)`).
pub fn parse_compare(line: &str) -> Result<Compare, CliError> {
    let Some((target, rest)) = line.split_once('(') else {
        return Err(invalid(format!("malformed comparison: {line}")));
    };
    let mut key = Vec::new();
    let mut op = String::new();
    let mut val = Vec::new();
    let parsed = (|| {
        let (k, rest) = unquote_prefix(skip_space(rest)).ok()?;
        key = k;
        let rest = rest.strip_prefix(')')?;
        let rest = skip_space(rest);
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        if end == 0 {
            return None;
        }
        op = rest[..end].to_string();
        let (v, _) = unquote_prefix(skip_space(&rest[end..])).ok()?;
        val = v;
        Some(())
    })();
    if parsed.is_none() {
        return Err(invalid(format!(
            "malformed comparison: {line}; got {target}({}) {op} {}",
            quote(&key),
            quote(&val)
        )));
    }
    let result = match op.as_str() {
        "=" => CompareResult::Equal,
        "!=" => CompareResult::NotEqual,
        ">" => CompareResult::Greater,
        "<" => CompareResult::Less,
        _ => {
            return Err(invalid(format!(
                "malformed comparison: {line} (unknown result op {op})"
            )))
        }
    };
    let int = || -> Result<i64, CliError> {
        String::from_utf8_lossy(&val)
            .parse::<i64>()
            .map_err(|_| invalid(format!("invalid txn compare request: {line}")))
    };
    let (target, union) = match target {
        "ver" | "version" => (CompareTarget::Version, TargetUnion::Version(int()?)),
        "c" | "create" => (CompareTarget::Create, TargetUnion::CreateRevision(int()?)),
        "m" | "mod" => (CompareTarget::Mod, TargetUnion::ModRevision(int()?)),
        "val" | "value" => (CompareTarget::Value, TargetUnion::Value(val.clone())),
        // etcdctl 3.4 accepts this target but then panics; kvctl takes the lease ID in hex,
        // as `put --lease` does.
        "lease" => {
            let id = i64::from_str_radix(&String::from_utf8_lossy(&val), 16)
                .map_err(|_| invalid(format!("invalid txn compare request: {line}")))?;
            (CompareTarget::Lease, TargetUnion::Lease(id))
        }
        _ => {
            return Err(invalid(format!(
                "malformed comparison: {line} (unknown target {target})"
            )))
        }
    };
    Ok(Compare {
        result: result as i32,
        target: target as i32,
        key,
        range_end: Vec::new(),
        target_union: Some(union),
    })
}

/// etcdctl's `argify`: splits a line into words, honouring "double" (Go-escaped) and 'single'
/// quotes. It keeps etcdctl 3.4's quirk of trimming single-quoted words by the number of words.
pub fn argify(s: &str) -> Result<Vec<OsString>, CliError> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' => {
                let mut j = i + 1;
                let mut closed = None;
                while j < b.len() {
                    match b[j] {
                        b'"' => {
                            closed = Some(j);
                            break;
                        }
                        b'\\' if j + 1 < b.len() && b[j + 1] != b'\n' => j += 2,
                        b'\\' => break,
                        _ => j += 1,
                    }
                }
                match closed {
                    Some(j) => {
                        out.push(s[i..=j].to_string());
                        i = j + 1;
                    }
                    None => i += 1,
                }
            }
            b'\'' => match s[i + 1..].find('\'') {
                Some(off) => {
                    let j = i + 1 + off;
                    out.push(s[i..=j].to_string());
                    i = j + 1;
                }
                None => i += 1,
            },
            b' ' | b'\t' | b'\n' | b'\r' | b'\x0c' => i += 1,
            _ => {
                let end = s[i..]
                    .find([' ', '\t', '\n', '\r', '\x0c'])
                    .map(|o| i + o)
                    .unwrap_or(b.len());
                out.push(s[i..end].to_string());
                i = end;
            }
        }
    }
    let n = out.len();
    out.into_iter()
        .map(|arg| {
            if arg.starts_with('\'') {
                // etcdctl 3.4 slices with len(args) instead of len(arg).
                arg.get(1..n.saturating_sub(1).max(1))
                    .map(OsString::from)
                    .ok_or_else(|| invalid(format!("invalid quoting: {arg}")))
            } else if arg.starts_with('"') {
                let (v, _) = unquote_prefix(&arg).map_err(invalid)?;
                Ok(OsString::from_vec(v))
            } else {
                Ok(OsString::from(arg))
            }
        })
        .collect()
}

/// Parses one `get`/`put`/`del` request line of a txn.
pub fn parse_request(line: &str) -> Result<RequestOp, CliError> {
    let args = argify(line)?;
    if args.len() < 2 {
        return Err(invalid(format!("invalid txn compare request: {line}")));
    }
    let parsed = TxnOpLine::try_parse_from(&args)
        .map_err(|_| invalid(format!("invalid txn request: {line}")))?;
    let request = match parsed.op {
        TxnOpCommand::Put(a) => request_op::Request::RequestPut(ops::put_request(&a, None)?),
        TxnOpCommand::Get(a) => request_op::Request::RequestRange(ops::range_request(&a)?),
        TxnOpCommand::Del(a) => request_op::Request::RequestDeleteRange(ops::delete_request(&a)?),
    };
    Ok(RequestOp {
        request: Some(request),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compares() {
        let c = parse_compare(r#"mod("key1") > "0""#).unwrap();
        assert_eq!(c.key, b"key1");
        assert_eq!(c.result, CompareResult::Greater as i32);
        assert_eq!(c.target, CompareTarget::Mod as i32);
        assert_eq!(c.target_union, Some(TargetUnion::ModRevision(0)));
        let c = parse_compare(r#"val("k\x41") != "v 1""#).unwrap();
        assert_eq!(c.key, b"kA");
        assert_eq!(c.target_union, Some(TargetUnion::Value(b"v 1".to_vec())));
        assert_eq!(c.result, CompareResult::NotEqual as i32);
        let c = parse_compare(r#"c("k") = "3""#).unwrap();
        assert_eq!(c.target_union, Some(TargetUnion::CreateRevision(3)));
        let c = parse_compare(r#"lease("k") = "1f""#).unwrap();
        assert_eq!(c.target, CompareTarget::Lease as i32);
        assert_eq!(c.target_union, Some(TargetUnion::Lease(31)));
        let c = parse_compare(r#"version("k") < "3""#).unwrap();
        assert_eq!(c.target_union, Some(TargetUnion::Version(3)));
        let e = parse_compare(r#"version("k") < "x""#).unwrap_err();
        assert_eq!(
            (e.code, e.msg.as_str()),
            (3, r#"invalid txn compare request: version("k") < "x""#)
        );
        let e = parse_compare("nothing").unwrap_err();
        assert_eq!(e.msg, "malformed comparison: nothing");
        let e = parse_compare(r#"foo("k") = "1""#).unwrap_err();
        assert_eq!(
            e.msg,
            r#"malformed comparison: foo("k") = "1" (unknown target foo)"#
        );
        assert!(parse_compare(r#"value("k")="1""#).is_err());
    }

    #[test]
    fn argify_words() {
        assert_eq!(
            argify(r#"put k "a b\n" x"#).unwrap(),
            vec!["put", "k", "a b\n", "x"]
        );
        assert_eq!(
            argify("get  --prefix  k").unwrap(),
            vec!["get", "--prefix", "k"]
        );
        // etcdctl 3.4 quirk: 'k2' among 3 words becomes "k".
        assert_eq!(argify("put 'k2' v2").unwrap(), vec!["put", "k", "v2"]);
        assert_eq!(
            argify("put 'k2' v2 x").unwrap(),
            vec!["put", "k2", "v2", "x"]
        );
    }

    #[test]
    fn sections() {
        let input = "value(\"a\") = \"1\"\nmod(\"b\") > \"0\"\n\nget a\nput c 3 --prev-kv\n\ndel b --prefix\n\n";
        let mut r: &[u8] = input.as_bytes();
        let cmps = read_compares(&mut r).unwrap();
        assert_eq!(cmps.len(), 2);
        let succ = read_ops(&mut r).unwrap();
        assert_eq!(succ.len(), 2);
        match &succ[1].request {
            Some(request_op::Request::RequestPut(p)) => {
                assert_eq!(
                    (p.key.as_slice(), p.value.as_slice(), p.prev_kv),
                    (&b"c"[..], &b"3"[..], true)
                )
            }
            other => panic!("{other:?}"),
        }
        let fail = read_ops(&mut r).unwrap();
        match &fail[0].request {
            Some(request_op::Request::RequestDeleteRange(d)) => assert_eq!(d.range_end, b"c"),
            other => panic!("{other:?}"),
        }
        // A missing final newline is an error, as in etcdctl 3.4.
        let mut r: &[u8] = b"\n\nput x y";
        read_compares(&mut r).unwrap();
        read_ops(&mut r).unwrap();
        assert_eq!(read_ops(&mut r).unwrap_err(), CliError::new(3, "EOF"));
        assert_eq!(
            parse_request("get").unwrap_err().msg,
            "invalid txn compare request: get"
        );
        assert_eq!(
            parse_request("bogus x").unwrap_err().msg,
            "invalid txn request: bogus x"
        );
        assert_eq!(
            parse_request("get x --nope").unwrap_err().msg,
            "invalid txn request: get x --nope"
        );
    }
}
