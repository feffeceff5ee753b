//! `user add|delete|get|list|passwd|grant-role|revoke-role` with etcdctl 3.4's arguments,
//! prompts, output and exit codes. Like etcdctl, the requests have no deadline
//! (`context.TODO()`).
use kvd::proto::authpb::UserAddOptions;
use kvd::proto::etcdserverpb::{
    AuthRoleGetRequest, AuthUserAddRequest, AuthUserAddResponse, AuthUserChangePasswordRequest,
    AuthUserDeleteRequest, AuthUserGetRequest, AuthUserGrantRoleRequest, AuthUserListRequest,
    AuthUserRevokeRoleRequest,
};

use crate::cli::{NoArgs, UserAddArgs, UserGetArgs, UserPasswdArgs};
use crate::client::Conn;
use crate::commands::{emit, Ctx};
use crate::error::CliError;
use crate::password;

/// Connects for a request without deadline: like etcdctl's `context.TODO()`, an unreachable
/// cluster is retried until the command is interrupted. Authenticating still has the dial
/// timeout (clientv3.New's `getToken`).
pub(crate) async fn connect(ctx: &Ctx) -> Result<Conn, CliError> {
    // A deadline far enough to be none (a year), without overflowing the clock.
    let forever = tokio::time::Instant::now() + std::time::Duration::from_secs(365 * 24 * 3600);
    ctx.connect(forever).await
}

pub async fn add(ctx: &Ctx, a: UserAddArgs) -> Result<i32, CliError> {
    exact_args(
        &a.args,
        1,
        "user add command requires user name as its argument",
    )?;
    let arg = &a.args[0];
    let (user, password) = if a.no_password {
        (arg.clone(), String::new())
    } else if !a.new_user_password.is_empty() {
        (arg.clone(), a.new_user_password.clone())
    } else {
        match arg.split_once(':') {
            Some(("", _)) => return Err(CliError::bad_args("empty user name is not allowed")),
            Some((u, p)) => (u.to_string(), p.to_string()),
            None if !a.interactive => (arg.clone(), password::scan_word()),
            None => (arg.clone(), password::ask_new(arg)?),
        }
    };
    let req = AuthUserAddRequest {
        name: user.clone(),
        password,
        options: Some(UserAddOptions {
            no_password: a.no_password,
        }),
        ..Default::default()
    };
    let r: AuthUserAddResponse = connect(ctx).await?.auth().user_add(req).await?.into_inner();
    let line = format!("User {user} created\n");
    confirm(ctx, line, &r.header, &r)
}

pub async fn delete(ctx: &Ctx, a: NoArgs) -> Result<i32, CliError> {
    exact_args(
        &a.args,
        1,
        "user delete command requires user name as its argument",
    )?;
    let name = a.args[0].clone();
    let req = AuthUserDeleteRequest { name: name.clone() };
    let r = connect(ctx)
        .await?
        .auth()
        .user_delete(req)
        .await?
        .into_inner();
    let line = format!("User {name} deleted\n");
    confirm(ctx, line, &r.header, &r)
}

pub async fn get(ctx: &Ctx, a: UserGetArgs) -> Result<i32, CliError> {
    exact_args(
        &a.args,
        1,
        "user get command requires user name as its argument",
    )?;
    let name = a.args[0].clone();
    let mut auth = connect(ctx).await?.auth();
    let req = AuthUserGetRequest { name: name.clone() };
    let r = auth.user_get(req).await?.into_inner();
    if !a.detail {
        emit(&ctx.printer.user_get(&name, &r)?);
        return Ok(0);
    }
    // etcdctl prints these lines itself, whatever the format, then each role in the format.
    println!("User: {name}");
    for role in &r.roles {
        println!();
        let req = AuthRoleGetRequest { role: role.clone() };
        let rr = auth.role_get(req).await?.into_inner();
        emit(&ctx.printer.role_get(role, &rr)?);
    }
    Ok(0)
}

pub async fn list(ctx: &Ctx, a: NoArgs) -> Result<i32, CliError> {
    if !a.args.is_empty() {
        return Err(CliError::bad_args(
            "user list command requires no arguments",
        ));
    }
    let r = connect(ctx)
        .await?
        .auth()
        .user_list(AuthUserListRequest {})
        .await?
        .into_inner();
    emit(&ctx.printer.user_list(&r)?);
    Ok(0)
}

pub async fn passwd(ctx: &Ctx, a: UserPasswdArgs) -> Result<i32, CliError> {
    exact_args(
        &a.args,
        1,
        "user passwd command requires user name as its argument",
    )?;
    let name = a.args[0].clone();
    let password = if a.interactive {
        password::ask_new(&name)?
    } else {
        password::scan_word()
    };
    let req = AuthUserChangePasswordRequest {
        name,
        password,
        ..Default::default()
    };
    let r = connect(ctx)
        .await?
        .auth()
        .user_change_password(req)
        .await?
        .into_inner();
    emit(
        &ctx.printer
            .auth_header_only(b"Password updated\n", &r.header, &r)?,
    );
    Ok(0)
}

pub async fn grant_role(ctx: &Ctx, a: NoArgs) -> Result<i32, CliError> {
    exact_args(
        &a.args,
        2,
        "user grant command requires user name and role name as its argument",
    )?;
    let (user, role) = (a.args[0].clone(), a.args[1].clone());
    let req = AuthUserGrantRoleRequest {
        user: user.clone(),
        role: role.clone(),
    };
    let r = connect(ctx)
        .await?
        .auth()
        .user_grant_role(req)
        .await?
        .into_inner();
    let line = format!("Role {role} is granted to user {user}\n");
    confirm(ctx, line, &r.header, &r)
}

pub async fn revoke_role(ctx: &Ctx, a: NoArgs) -> Result<i32, CliError> {
    exact_args(
        &a.args,
        2,
        "user revoke-role requires user name and role name as its argument",
    )?;
    let (user, role) = (a.args[0].clone(), a.args[1].clone());
    let req = AuthUserRevokeRoleRequest {
        name: user.clone(),
        role: role.clone(),
    };
    let r = connect(ctx)
        .await?
        .auth()
        .user_revoke_role(req)
        .await?
        .into_inner();
    let line = format!("Role {role} is revoked from user {user}\n");
    confirm(ctx, line, &r.header, &r)
}

/// Checks that a user or role command got exactly `n` arguments; else etcdctl's usage error.
pub(crate) fn exact_args(args: &[String], n: usize, usage: &str) -> Result<(), CliError> {
    if args.len() != n {
        return Err(CliError::bad_args(usage));
    }
    Ok(())
}

/// Prints etcdctl's confirmation of a user or role change (the line in simple format, the
/// response header in the others).
pub(crate) fn confirm<M: prost::Message>(
    ctx: &Ctx,
    line: String,
    header: &Option<kvd::proto::etcdserverpb::ResponseHeader>,
    m: &M,
) -> Result<i32, CliError> {
    emit(&ctx.printer.auth_header_only(line.as_bytes(), header, m)?);
    Ok(0)
}
