//! Output of the `auth`, `user` and `role` commands in etcdctl 3.4's formats: `simple`, `json`
//! (Go's encoding/json of the response), `protobuf`, and `fields` where etcdctl's fields
//! printer has the method (`user get` and `user list` have none: unsupported, as `table`).
//! The request has already been applied when an unsupported format is reported, as in etcdctl.
use kvd::proto::authpb::{permission, Permission};
use kvd::proto::etcdserverpb::{
    AuthRoleGetResponse, AuthRoleListResponse, AuthUserGetResponse, AuthUserListResponse,
    ResponseHeader,
};

use super::fields::fields_hdr;
use super::{json_header, Format, Output, Printer};
use crate::error::CliError;
use crate::gofmt::{base64, quote};
use crate::output::json_string;

/// clientv3's `GetPrefixRangeEnd`: the first key after every key with this prefix, `"\0"` when
/// there is none.
pub fn prefix_range_end(key: &[u8]) -> Vec<u8> {
    let mut end = key.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn perm_type_name(t: i32) -> &'static str {
    match permission::Type::try_from(t) {
        Ok(permission::Type::Read) => "READ",
        Ok(permission::Type::Write) => "WRITE",
        Ok(permission::Type::Readwrite) => "READWRITE",
        Err(_) => "UNKNOWN",
    }
}

fn header_only_json(h: &Option<ResponseHeader>) -> String {
    match h {
        Some(h) => format!("{{\"header\":{}}}", json_header(h)),
        None => "{}".to_string(),
    }
}

fn strings_json(h: &Option<ResponseHeader>, key: &str, items: &[String]) -> String {
    let mut parts = Vec::new();
    if let Some(h) = h {
        parts.push(format!("\"header\":{}", json_header(h)));
    }
    if !items.is_empty() {
        let items: Vec<String> = items.iter().map(|s| json_string(s)).collect();
        parts.push(format!("\"{key}\":[{}]", items.join(",")));
    }
    format!("{{{}}}", parts.join(","))
}

fn perm_json(p: &Permission) -> String {
    let mut parts = Vec::new();
    if p.perm_type != 0 {
        parts.push(format!("\"permType\":{}", p.perm_type));
    }
    if !p.key.is_empty() {
        parts.push(format!("\"key\":\"{}\"", base64(&p.key)));
    }
    if !p.range_end.is_empty() {
        parts.push(format!("\"range_end\":\"{}\"", base64(&p.range_end)));
    }
    format!("{{{}}}", parts.join(","))
}

/// One permission line of `role get` (simple): a key, or a range with its prefix noted.
fn simple_perm(out: &mut Vec<u8>, p: &Permission) {
    if p.range_end.is_empty() {
        out.extend_from_slice(b"\t");
        out.extend_from_slice(&p.key);
        out.push(b'\n');
        return;
    }
    if p.range_end != [0] {
        out.extend_from_slice(b"\t[");
        out.extend_from_slice(&p.key);
        out.extend_from_slice(b", ");
        out.extend_from_slice(&p.range_end);
        out.push(b')');
    } else {
        out.extend_from_slice(b"\t[");
        out.extend_from_slice(&p.key);
        out.extend_from_slice(b", <open ended>");
    }
    if prefix_range_end(&p.key) == p.range_end {
        out.extend_from_slice(b" (prefix ");
        out.extend_from_slice(&p.key);
        out.push(b')');
    }
    out.push(b'\n');
}

impl Printer {
    /// A response that carries only a header: `simple` prints `line`.
    pub fn auth_header_only<M: prost::Message>(
        &self,
        line: &[u8],
        h: &Option<ResponseHeader>,
        m: &M,
    ) -> Result<Output, CliError> {
        Ok(Output::out(match self.format {
            Format::Simple => line.to_vec(),
            Format::Json => (header_only_json(h) + "\n").into_bytes(),
            Format::Fields => {
                let mut s = String::new();
                fields_hdr(&mut s, h);
                s.into_bytes()
            }
            Format::Protobuf => m.encode_to_vec(),
            Format::Table => return Err(self.unsupported()),
        }))
    }

    pub fn role_get(&self, role: &str, r: &AuthRoleGetResponse) -> Result<Output, CliError> {
        Ok(Output::out(match self.format {
            Format::Simple => {
                let mut out = format!("Role {role}\nKV Read:\n").into_bytes();
                let is = |p: &Permission, t: permission::Type| {
                    p.perm_type == t as i32 || p.perm_type == permission::Type::Readwrite as i32
                };
                for p in r.perm.iter().filter(|p| is(p, permission::Type::Read)) {
                    simple_perm(&mut out, p);
                }
                out.extend_from_slice(b"KV Write:\n");
                for p in r.perm.iter().filter(|p| is(p, permission::Type::Write)) {
                    simple_perm(&mut out, p);
                }
                out
            }
            Format::Json => {
                let mut parts = Vec::new();
                if let Some(h) = &r.header {
                    parts.push(format!("\"header\":{}", json_header(h)));
                }
                if !r.perm.is_empty() {
                    let perms: Vec<String> = r.perm.iter().map(perm_json).collect();
                    parts.push(format!("\"perm\":[{}]", perms.join(",")));
                }
                format!("{{{}}}\n", parts.join(",")).into_bytes()
            }
            Format::Fields => {
                let mut s = String::new();
                fields_hdr(&mut s, &r.header);
                for p in &r.perm {
                    s.push_str(&format!(
                        "\"PermType\" :  {}\n\"Key\" : {}\n\"RangeEnd\" : {}\n",
                        perm_type_name(p.perm_type),
                        quote(&p.key),
                        quote(&p.range_end)
                    ));
                }
                s.into_bytes()
            }
            Format::Protobuf => prost::Message::encode_to_vec(r),
            Format::Table => return Err(self.unsupported()),
        }))
    }

    pub fn role_list(&self, r: &AuthRoleListResponse) -> Result<Output, CliError> {
        Ok(Output::out(match self.format {
            Format::Simple => r
                .roles
                .iter()
                .map(|x| format!("{x}\n"))
                .collect::<String>()
                .into_bytes(),
            Format::Json => (strings_json(&r.header, "roles", &r.roles) + "\n").into_bytes(),
            Format::Fields => {
                let mut s = String::new();
                fields_hdr(&mut s, &r.header);
                s.push_str("\"Roles\" :");
                for x in &r.roles {
                    s.push(' ');
                    s.push_str(&quote(x.as_bytes()));
                }
                s.push('\n');
                s.into_bytes()
            }
            Format::Protobuf => prost::Message::encode_to_vec(r),
            Format::Table => return Err(self.unsupported()),
        }))
    }

    pub fn user_get(&self, user: &str, r: &AuthUserGetResponse) -> Result<Output, CliError> {
        Ok(Output::out(match self.format {
            Format::Simple => {
                let mut s = format!("User: {user}\nRoles:");
                for x in &r.roles {
                    s.push(' ');
                    s.push_str(x);
                }
                s.push('\n');
                s.into_bytes()
            }
            Format::Json => (strings_json(&r.header, "roles", &r.roles) + "\n").into_bytes(),
            Format::Protobuf => prost::Message::encode_to_vec(r),
            Format::Fields | Format::Table => return Err(self.unsupported()),
        }))
    }

    pub fn user_list(&self, r: &AuthUserListResponse) -> Result<Output, CliError> {
        Ok(Output::out(match self.format {
            Format::Simple => r
                .users
                .iter()
                .map(|x| format!("{x}\n"))
                .collect::<String>()
                .into_bytes(),
            Format::Json => (strings_json(&r.header, "users", &r.users) + "\n").into_bytes(),
            Format::Protobuf => prost::Message::encode_to_vec(r),
            Format::Fields | Format::Table => return Err(self.unsupported()),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_range_end(b"a"), b"b");
        assert_eq!(prefix_range_end(b"a\xff"), b"b");
        assert_eq!(prefix_range_end(b"\xff"), b"\0");
    }

    #[test]
    fn role_get_simple() {
        let r = AuthRoleGetResponse {
            header: None,
            perm: vec![
                Permission {
                    perm_type: permission::Type::Read as i32,
                    key: b"/ro/".to_vec(),
                    range_end: b"/ro0".to_vec(),
                },
                Permission {
                    perm_type: permission::Type::Readwrite as i32,
                    key: b"k".to_vec(),
                    range_end: vec![],
                },
                Permission {
                    perm_type: permission::Type::Write as i32,
                    key: b"z".to_vec(),
                    range_end: vec![0],
                },
            ],
        };
        let p = Printer::new(Format::Simple, false);
        let out = String::from_utf8(p.role_get("r", &r).unwrap().stdout).unwrap();
        assert_eq!(
            out,
            "Role r\nKV Read:\n\t[/ro/, /ro0) (prefix /ro/)\n\tk\nKV Write:\n\tk\n\t[z, <open ended>\n"
        );
        let p = Printer::new(Format::Json, false);
        let out = String::from_utf8(p.role_get("r", &r).unwrap().stdout).unwrap();
        assert!(out.starts_with("{\"perm\":[{\"key\":\"L3JvLw==\",\"range_end\":\"L3JvMA==\"}"));
    }
}
