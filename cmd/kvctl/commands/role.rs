//! `role add|delete|get|list|grant-permission|revoke-permission` with etcdctl 3.4's arguments,
//! key ranges (`--prefix`, `--from-key`, an empty key meaning every key), output and exit codes.
use kvd::proto::authpb::{permission, Permission};
use kvd::proto::etcdserverpb::{
    AuthRoleAddRequest, AuthRoleDeleteRequest, AuthRoleGetRequest, AuthRoleGrantPermissionRequest,
    AuthRoleListRequest, AuthRoleRevokePermissionRequest,
};

use crate::cli::{NoArgs, RolePermArgs};
use crate::commands::user::{confirm, connect, exact_args};
use crate::commands::{emit, Ctx};
use crate::error::CliError;
use crate::output::prefix_range_end;

pub async fn add(ctx: &Ctx, a: NoArgs) -> Result<i32, CliError> {
    exact_args(
        &a.args,
        1,
        "role add command requires role name as its argument",
    )?;
    let name = a.args[0].clone();
    let req = AuthRoleAddRequest { name: name.clone() };
    let r = connect(ctx).await?.auth().role_add(req).await?.into_inner();
    let line = format!("Role {name} created\n");
    confirm(ctx, line, &r.header, &r)
}

pub async fn delete(ctx: &Ctx, a: NoArgs) -> Result<i32, CliError> {
    exact_args(
        &a.args,
        1,
        "role delete command requires role name as its argument",
    )?;
    let role = a.args[0].clone();
    let req = AuthRoleDeleteRequest { role: role.clone() };
    let r = connect(ctx)
        .await?
        .auth()
        .role_delete(req)
        .await?
        .into_inner();
    let line = format!("Role {role} deleted\n");
    confirm(ctx, line, &r.header, &r)
}

pub async fn get(ctx: &Ctx, a: NoArgs) -> Result<i32, CliError> {
    exact_args(
        &a.args,
        1,
        "role get command requires role name as its argument",
    )?;
    let role = a.args[0].clone();
    let req = AuthRoleGetRequest { role: role.clone() };
    let r = connect(ctx).await?.auth().role_get(req).await?.into_inner();
    emit(&ctx.printer.role_get(&role, &r)?);
    Ok(0)
}

pub async fn list(ctx: &Ctx, a: NoArgs) -> Result<i32, CliError> {
    if !a.args.is_empty() {
        return Err(CliError::bad_args(
            "role list command requires no arguments",
        ));
    }
    let r = connect(ctx)
        .await?
        .auth()
        .role_list(AuthRoleListRequest {})
        .await?
        .into_inner();
    emit(&ctx.printer.role_list(&r)?);
    Ok(0)
}

/// clientv3's `StrToPermissionType`: a case-insensitive name.
fn perm_type(s: &str) -> Result<permission::Type, CliError> {
    match s.to_uppercase().as_str() {
        "READ" => Ok(permission::Type::Read),
        "WRITE" => Ok(permission::Type::Write),
        "READWRITE" => Ok(permission::Type::Readwrite),
        _ => Err(CliError::bad_args(format!("invalid permission type: {s}"))),
    }
}

/// etcdctl's `permRange`: the key and range end of a permission from `<key> [endkey]` and the
/// flags. An empty key stands for every key: `"\0"`, open ended with `--prefix`/`--from-key`.
pub fn perm_range(
    args: &[String],
    prefix: bool,
    from_key: bool,
) -> Result<(Vec<u8>, Vec<u8>), CliError> {
    let key = args[0].as_bytes();
    if key.is_empty() {
        if prefix && from_key {
            return Err(CliError::bad_args(
                "--from-key and --prefix flags are mutually exclusive",
            ));
        }
        let end = if prefix || from_key { vec![0] } else { vec![] };
        return Ok((vec![0], end));
    }
    let end = if args.len() == 1 {
        match (prefix, from_key) {
            (true, true) => {
                return Err(CliError::bad_args(
                    "--from-key and --prefix flags are mutually exclusive",
                ))
            }
            (true, false) => prefix_range_end(key),
            (false, true) => vec![0],
            (false, false) => vec![],
        }
    } else if prefix {
        return Err(CliError::bad_args(
            "unexpected endkey argument with --prefix flag",
        ));
    } else if from_key {
        return Err(CliError::bad_args(
            "unexpected endkey argument with --from-key flag",
        ));
    } else {
        args[1].as_bytes().to_vec()
    };
    Ok((key.to_vec(), end))
}

pub async fn grant_permission(ctx: &Ctx, a: RolePermArgs) -> Result<i32, CliError> {
    if a.args.len() < 3 {
        return Err(CliError::bad_args(
            "role grant command requires role name, permission type, and key [endkey] as its argument",
        ));
    }
    let perm_type = perm_type(&a.args[1])?;
    let (key, range_end) = perm_range(&a.args[2..], a.prefix, a.from_key)?;
    let name = a.args[0].clone();
    let req = AuthRoleGrantPermissionRequest {
        name: name.clone(),
        perm: Some(Permission {
            perm_type: perm_type as i32,
            key,
            range_end,
        }),
    };
    let r = connect(ctx)
        .await?
        .auth()
        .role_grant_permission(req)
        .await?
        .into_inner();
    let line = format!("Role {name} updated\n");
    confirm(ctx, line, &r.header, &r)
}

pub async fn revoke_permission(ctx: &Ctx, a: RolePermArgs) -> Result<i32, CliError> {
    if a.args.len() < 2 {
        return Err(CliError::bad_args(
            "role revoke-permission command requires role name and key [endkey] as its argument",
        ));
    }
    let (key, range_end) = perm_range(&a.args[1..], a.prefix, a.from_key)?;
    let role = a.args[0].clone();
    let req = AuthRoleRevokePermissionRequest {
        role: role.clone(),
        key: key.clone(),
        range_end: range_end.clone(),
    };
    let r = connect(ctx)
        .await?
        .auth()
        .role_revoke_permission(req)
        .await?
        .into_inner();
    // etcdctl names the key as typed (args[1]) and the computed range end.
    let mut line = Vec::new();
    let typed = a.args[1].as_bytes();
    if range_end.is_empty() {
        line.extend_from_slice(b"Permission of key ");
        line.extend_from_slice(typed);
    } else if range_end != [0] {
        line.extend_from_slice(b"Permission of range [");
        line.extend_from_slice(typed);
        line.extend_from_slice(b", ");
        line.extend_from_slice(&range_end);
        line.push(b')');
    } else {
        line.extend_from_slice(b"Permission of range [");
        line.extend_from_slice(typed);
        line.extend_from_slice(b", <open ended>");
    }
    line.extend_from_slice(format!(" is revoked from role {role}\n").as_bytes());
    emit(&ctx.printer.auth_header_only(&line, &r.header, &r)?);
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn ranges() {
        let r = |a: &[&str], p, f| perm_range(&args(a), p, f);
        assert_eq!(r(&["k"], false, false).unwrap(), (b"k".to_vec(), vec![]));
        assert_eq!(
            r(&["k"], true, false).unwrap(),
            (b"k".to_vec(), b"l".to_vec())
        );
        assert_eq!(r(&["k"], false, true).unwrap(), (b"k".to_vec(), vec![0]));
        assert_eq!(
            r(&["a", "c"], false, false).unwrap(),
            (b"a".to_vec(), b"c".to_vec())
        );
        // The empty key is every key: "\0", open ended with a flag.
        assert_eq!(r(&[""], false, false).unwrap(), (vec![0], vec![]));
        assert_eq!(r(&[""], true, false).unwrap(), (vec![0], vec![0]));
        assert_eq!(
            r(&[""], true, true).unwrap_err().msg,
            "--from-key and --prefix flags are mutually exclusive"
        );
        assert_eq!(
            r(&["a", "c"], true, false).unwrap_err().msg,
            "unexpected endkey argument with --prefix flag"
        );
    }

    #[test]
    fn permission_names() {
        assert_eq!(perm_type("readWrite").unwrap(), permission::Type::Readwrite);
        assert_eq!(
            perm_type("x").unwrap_err().msg,
            "invalid permission type: x"
        );
    }
}
