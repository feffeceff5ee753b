//! `auth enable|disable`, as etcdctl 3.4.23 has them (`auth status` came with etcdctl 3.5).
//! Both print their line in every output format, as etcdctl does.
use kvd::proto::etcdserverpb::{
    AuthDisableRequest, AuthEnableRequest, AuthRoleAddRequest, AuthUserGrantRoleRequest,
};

use crate::cli::NoArgs;
use crate::client::with_deadline;
use crate::commands::Ctx;
use crate::error::{CliError, EtcdError};

pub async fn enable(ctx: &Ctx, a: NoArgs) -> Result<i32, CliError> {
    if !a.args.is_empty() {
        return Err(CliError::bad_args(
            "auth enable command does not accept any arguments",
        ));
    }
    let deadline = ctx.deadline();
    with_deadline(deadline, async {
        let conn = ctx.connect(deadline).await?;
        let mut auth = conn.auth();
        // Like etcdctl: a root user without the root role gets it, then enabling is retried.
        loop {
            match auth.auth_enable(AuthEnableRequest {}).await {
                Ok(_) => return Ok(()),
                Err(s) if EtcdError::of(&s) == Some(EtcdError::RootRoleNotExist) => {
                    let role = AuthRoleAddRequest {
                        name: "root".into(),
                    };
                    auth.role_add(role).await?;
                    let grant = AuthUserGrantRoleRequest {
                        user: "root".into(),
                        role: "root".into(),
                    };
                    auth.user_grant_role(grant).await?;
                }
                Err(s) => return Err(s.into()),
            }
        }
    })
    .await?;
    println!("Authentication Enabled");
    Ok(0)
}

pub async fn disable(ctx: &Ctx, a: NoArgs) -> Result<i32, CliError> {
    if !a.args.is_empty() {
        return Err(CliError::bad_args(
            "auth disable command does not accept any arguments",
        ));
    }
    let deadline = ctx.deadline();
    with_deadline(deadline, async {
        let conn = ctx.connect(deadline).await?;
        conn.auth().auth_disable(AuthDisableRequest {}).await?;
        Ok(())
    })
    .await?;
    println!("Authentication Disabled");
    Ok(0)
}
