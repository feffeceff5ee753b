//! Translation of `put`/`get`/`del` arguments into requests, following etcdctl's
//! `getPutOp`/`getGetOp`/`getDelOp` and clientv3's option semantics.
use std::ffi::OsString;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;

use kvd::proto::etcdserverpb::{
    range_request::{SortOrder, SortTarget},
    DeleteRangeRequest, PutRequest, RangeRequest,
};

use crate::cli::{DelArgs, GetArgs, PutArgs};
use crate::error::{CliError, EXIT_BAD_FEATURE};

/// The bytes of a command line argument (Go passes arguments through unchanged).
fn bytes(s: &OsString) -> Vec<u8> {
    s.as_bytes().to_vec()
}

/// clientv3's `getPrefix`: the smallest key greater than every key with the given prefix.
pub fn prefix_end(key: &[u8]) -> Vec<u8> {
    let mut end = key.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// `put KEY [VALUE]`; the value is read from `stdin` when omitted.
pub fn put_request(a: &PutArgs, stdin: Option<&mut dyn Read>) -> Result<PutRequest, CliError> {
    let usage = "put command needs 1 argument and input from stdin or 2 arguments";
    let Some(key) = a.args.first() else {
        return Err(CliError::bad_args(usage));
    };
    if a.ignore_value && a.args.len() > 1 {
        return Err(CliError::bad_args(
            "put command needs only 1 argument when 'ignore-value' is set",
        ));
    }
    let mut value = Vec::new();
    if !a.ignore_value {
        if let Some(v) = a.args.get(1) {
            value = bytes(v);
        } else {
            let read = match stdin {
                Some(r) => r.read_to_end(&mut value).is_ok(),
                None => false,
            };
            if !read || value.is_empty() {
                return Err(CliError::bad_args(usage));
            }
        }
    }
    let lease = parse_lease(&a.lease)?;
    Ok(PutRequest {
        key: bytes(key),
        value,
        lease,
        prev_kv: a.prev_kv,
        ignore_value: a.ignore_value,
        ignore_lease: a.ignore_lease,
    })
}

fn parse_lease(s: &str) -> Result<i64, CliError> {
    parse_lease_id(s, "bad lease ID")
}

/// Go's `strconv.ParseInt(s, 16, 64)` with etcdctl's message, which starts with `what`
/// (`put` and the `lease` commands word it differently).
pub fn parse_lease_id(s: &str, what: &str) -> Result<i64, CliError> {
    let q = crate::gofmt::quote(s.as_bytes());
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(CliError::bad_args(format!(
            "{what} (strconv.ParseInt: parsing {q}: invalid syntax), expecting ID in Hex"
        )));
    }
    i64::from_str_radix(s, 16).map_err(|_| {
        CliError::bad_args(format!(
            "{what} (strconv.ParseInt: parsing {q}: value out of range), expecting ID in Hex"
        ))
    })
}

/// `get KEY [RANGE_END]` and its options.
pub fn range_request(a: &GetArgs) -> Result<RangeRequest, CliError> {
    let Some(first) = a.args.first() else {
        return Err(CliError::bad_args(
            "get command needs one argument as key and an optional argument as range_end",
        ));
    };
    if a.prefix && a.from_key {
        return Err(CliError::bad_args(
            "`--prefix` and `--from-key` cannot be set at the same time, choose one",
        ));
    }
    let mut r = RangeRequest::default();
    match a.consistency.as_str() {
        "s" => r.serializable = true,
        "l" => {}
        other => {
            return Err(CliError::new(
                EXIT_BAD_FEATURE,
                format!(
                    "unknown consistency flag {}",
                    crate::gofmt::quote(other.as_bytes())
                ),
            ))
        }
    }
    let mut key = bytes(first);
    if let Some(end) = a.args.get(1) {
        if a.prefix || a.from_key {
            return Err(too_many_args());
        }
        r.range_end = bytes(end);
    }
    r.limit = a.limit;
    if a.rev > 0 {
        r.revision = a.rev;
    }
    let mut order = match a.order.to_uppercase().as_str() {
        "ASCEND" => SortOrder::Ascend,
        "DESCEND" => SortOrder::Descend,
        "" => SortOrder::None,
        _ => {
            return Err(CliError::new(
                EXIT_BAD_FEATURE,
                format!("bad sort order {}", a.order),
            ))
        }
    };
    let target = match a.sort_by.to_uppercase().as_str() {
        "CREATE" => SortTarget::Create,
        "KEY" | "" => SortTarget::Key,
        "MODIFY" => SortTarget::Mod,
        "VALUE" => SortTarget::Value,
        "VERSION" => SortTarget::Version,
        _ => {
            return Err(CliError::new(
                EXIT_BAD_FEATURE,
                format!("bad sort target {}", a.sort_by),
            ))
        }
    };
    // clientv3.WithSort: ascending by key is the server's natural order.
    if target == SortTarget::Key && order == SortOrder::Ascend {
        order = SortOrder::None;
    }
    r.sort_order = order as i32;
    r.sort_target = target as i32;
    if a.prefix {
        if key.is_empty() {
            key = vec![0];
            r.range_end = vec![0];
        } else {
            r.range_end = prefix_end(&key);
        }
    }
    if a.from_key {
        if key.is_empty() {
            key = vec![0];
        }
        r.range_end = vec![0];
    }
    r.key = key;
    r.keys_only = a.keys_only;
    r.count_only = a.count_only;
    Ok(r)
}

fn too_many_args() -> CliError {
    CliError::bad_args(
        "too many arguments, only accept one argument when `--prefix` or `--from-key` is set",
    )
}

/// `del KEY [RANGE_END]` and its options.
pub fn delete_request(a: &DelArgs) -> Result<DeleteRangeRequest, CliError> {
    if a.args.is_empty() || a.args.len() > 2 {
        return Err(CliError::bad_args(
            "del command needs one argument as key and an optional argument as range_end",
        ));
    }
    if a.prefix && a.from_key {
        return Err(CliError::bad_args(
            "`--prefix` and `--from-key` cannot be set at the same time, choose one",
        ));
    }
    let mut r = DeleteRangeRequest::default();
    let mut key = bytes(&a.args[0]);
    if let Some(end) = a.args.get(1) {
        if a.prefix || a.from_key {
            return Err(too_many_args());
        }
        r.range_end = bytes(end);
    }
    if a.prefix {
        if key.is_empty() {
            key = vec![0];
            r.range_end = vec![0];
        } else {
            r.range_end = prefix_end(&key);
        }
    }
    r.prev_kv = a.prev_kv;
    if a.from_key {
        if key.is_empty() {
            key = vec![0];
        }
        r.range_end = vec![0];
    }
    r.key = key;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(args: &[&str]) -> GetArgs {
        GetArgs {
            args: args.iter().map(OsString::from).collect(),
            consistency: "l".into(),
            ..Default::default()
        }
    }

    #[test]
    fn prefixes() {
        assert_eq!(prefix_end(b"abc"), b"abd");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }

    #[test]
    fn get_options() {
        let mut a = get(&["foo"]);
        a.prefix = true;
        let r = range_request(&a).unwrap();
        assert_eq!(
            (r.key.as_slice(), r.range_end.as_slice()),
            (&b"foo"[..], &b"fop"[..])
        );
        let mut a = get(&[""]);
        a.from_key = true;
        let r = range_request(&a).unwrap();
        assert_eq!((r.key, r.range_end), (vec![0], vec![0]));
        let mut a = get(&["a", "b"]);
        a.prefix = true;
        assert_eq!(range_request(&a).unwrap_err().code, 128);
        let mut a = get(&["a"]);
        a.sort_by = "key".into();
        a.order = "ascend".into();
        let r = range_request(&a).unwrap();
        assert_eq!(r.sort_order, SortOrder::None as i32);
        a.sort_by = "bogus".into();
        assert_eq!(range_request(&a).unwrap_err().msg, "bad sort target bogus");
        let mut a = get(&["a"]);
        a.consistency = "x".into();
        assert_eq!(
            range_request(&a).unwrap_err().msg,
            "unknown consistency flag \"x\""
        );
    }

    #[test]
    fn put_options() {
        let a = PutArgs {
            args: vec!["k".into()],
            lease: "0".into(),
            ..Default::default()
        };
        let mut stdin: &[u8] = b"from stdin\n";
        let r = put_request(&a, Some(&mut stdin)).unwrap();
        assert_eq!(r.value, b"from stdin\n");
        let mut empty: &[u8] = b"";
        assert_eq!(put_request(&a, Some(&mut empty)).unwrap_err().code, 128);
        let a = PutArgs {
            args: vec!["k".into(), "v".into()],
            lease: "zz".into(),
            ..Default::default()
        };
        assert_eq!(
            put_request(&a, None).unwrap_err().msg,
            "bad lease ID (strconv.ParseInt: parsing \"zz\": invalid syntax), expecting ID in Hex"
        );
        let a = PutArgs {
            args: vec!["k".into(), "v".into()],
            lease: "1f".into(),
            ..Default::default()
        };
        assert_eq!(put_request(&a, None).unwrap().lease, 31);
    }
}
