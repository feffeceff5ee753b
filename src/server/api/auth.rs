//! etcd's Auth service, and the password work it needs.
//!
//! Invariants:
//! - Passwords are hashed here, on the member that received the request, before anything is
//!   proposed: the log and snapshots carry bcrypt hashes only, and no password is logged.
//! - A password check (Authenticate) runs outside Raft, outside every lock the apply path
//!   takes, on a blocking thread, and at most `checks` of them at once: a flood of failed
//!   logins queues here instead of taking every core from the other requests. bcrypt reads the
//!   first 72 bytes only, so a huge password costs what a short one does.
//! - Authenticate checks the password after a read barrier, against the auth state at least
//!   as new as every change acknowledged before the request, and returns a token only if the
//!   auth revision it checked at is still the store's once the token's entry has applied here
//!   (else it checks again): no password that was already replaced, and no user that was
//!   already deleted, gets a token (etcd's Authenticate).
//! - Changes go through Raft and are checked at apply time (admin, with the identity in the
//!   entry, see `crate::auth::store`); listings and gets are answered here after a read
//!   barrier, with the same admin check, except that a user may get their own entry and the
//!   roles they hold (etcd's authApplierV3 UserGet and RoleGet).

use tonic::{Request, Response, Status};

use crate::auth::token_jwt::JwtError;
use crate::auth::{token, AuthError, AuthInfo};
use crate::proto::authpb::UserAddOptions;
use crate::proto::etcdserverpb::auth_server::Auth;
use crate::proto::etcdserverpb::*;
use crate::proto::kvdpb::auth_request::Request as A;
use crate::proto::kvdpb::internal_response::Response as Out;
use crate::proto::kvdpb::{
    internal_request, AuthRequest, InternalAuthenticateRequest, InternalRequest,
};
use crate::server::context::ServerCtx;
use crate::server::error::ApiError;

/// bcrypt with a bound on concurrent checks.
pub struct Passwords {
    cost: u32,
    checks: tokio::sync::Semaphore,
}

impl Passwords {
    pub fn new(cost: u32) -> Passwords {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Passwords {
            cost,
            // Half the CPUs: the other half keeps serving while logins are hammered.
            checks: tokio::sync::Semaphore::new((cpus / 2).max(1)),
        }
    }

    async fn hash(&self, password: String) -> Result<String, ApiError> {
        let cost = self.cost;
        let _permit = self.checks.acquire().await;
        tokio::task::spawn_blocking(move || bcrypt::hash(password, cost))
            .await
            .map_err(|e| ApiError::Internal(e.to_string()))?
            .map_err(|e| ApiError::Internal(format!("failed to hash password: {e}")))
    }

    async fn verify(&self, password: String, hash: Vec<u8>) -> bool {
        let _permit = self.checks.acquire().await;
        tokio::task::spawn_blocking(move || {
            let hash = String::from_utf8_lossy(&hash);
            bcrypt::verify(password, &hash).unwrap_or(false)
        })
        .await
        .unwrap_or(false)
    }
}

/// How many times Authenticate checks the password again because the auth state changed
/// while its token's entry was in flight, before it gives up with a timeout (etcd retries
/// until the request's deadline).
const AUTHENTICATE_ATTEMPTS: usize = 10;

/// etcd's Authenticate loop: `check` verifies the password and returns the auth revision it
/// read the password at; `propose` replicates the token's entry and returns once it has
/// applied here; the result stands only if `revision()` is still the checked one then, since
/// a change applied in between (a password change, a user delete) may have made the check
/// stale. `None` when every attempt was overtaken by a change.
async fn while_revision_holds<T, E, C, CF, P, PF>(
    mut check: C,
    mut propose: P,
    revision: impl Fn() -> u64,
    attempts: usize,
) -> Result<Option<T>, E>
where
    C: FnMut() -> CF,
    CF: std::future::Future<Output = Result<u64, E>>,
    P: FnMut() -> PF,
    PF: std::future::Future<Output = Result<T, E>>,
{
    for _ in 0..attempts {
        let checked = check().await?;
        let out = propose().await?;
        if revision() == checked {
            return Ok(Some(out));
        }
        tracing::info!("auth revision changed since the password was checked; checking again");
    }
    Ok(None)
}

pub struct AuthService {
    pub ctx: ServerCtx,
}

type Res<T> = Result<Response<T>, Status>;

impl AuthService {
    fn header(&self) -> Option<ResponseHeader> {
        self.ctx.header(self.ctx.current_revision())
    }

    async fn who<T>(&self, req: &Request<T>) -> Result<Option<AuthInfo>, ApiError> {
        self.ctx.check_leader(req.metadata())?;
        self.ctx.auth_info(req.metadata(), req.extensions()).await
    }

    /// Proposes an auth change as the caller.
    async fn change<T>(&self, req: &Request<T>, r: A) -> Result<String, Status> {
        let ai = self.who(req).await?;
        let ir = InternalRequest {
            request: Some(internal_request::Request::Auth(AuthRequest {
                request: Some(r),
            })),
            ..Default::default()
        };
        match self.ctx.propose_as(ir, ai.as_ref()).await? {
            Out::Auth(a) => Ok(a.token),
            _ => Err(ApiError::Internal("unexpected apply result".into()).into()),
        }
    }

    /// A linearizable read of the auth store by an admin.
    async fn admin_read<T>(&self, req: &Request<T>) -> Result<(), Status> {
        self.read_as(req, |store, ai| store.check_admin(ai)).await
    }

    /// A linearizable read of the auth store by whom `permitted` allows.
    async fn read_as<T>(
        &self,
        req: &Request<T>,
        permitted: impl FnOnce(&crate::auth::AuthStore, Option<&AuthInfo>) -> Result<(), AuthError>,
    ) -> Result<(), Status> {
        let ai = self.who(req).await?;
        self.ctx.node.read_barrier().await.map_err(ApiError::from)?;
        permitted(self.ctx.node.auth(), ai.as_ref()).map_err(ApiError::from)?;
        Ok(())
    }

    /// Checks `name`'s password; returns the auth revision it was checked at.
    async fn check_password(&self, name: &str, password: &str) -> Result<u64, Status> {
        let store = self.ctx.node.auth();
        let (hash, revision) = store.password_hash(name).map_err(auth_err)?;
        if !self.ctx.passwords.verify(password.to_string(), hash).await {
            tracing::info!(user = %name, "invalid password");
            return Err(auth_err(AuthError::AuthFailed));
        }
        Ok(revision)
    }

    /// Proposes the entry that assigns `name` a token; the simple token it assigned, if any.
    async fn propose_token(&self, name: &str) -> Result<String, Status> {
        // The entry checks, in log order, that auth is still enabled and the user exists.
        // Simple tokens are assigned by it on every member; a JWT is signed afterwards by
        // this member alone, at the auth revision it has applied by then.
        let ir = InternalRequest {
            request: Some(internal_request::Request::Auth(AuthRequest {
                request: Some(A::Authenticate(InternalAuthenticateRequest {
                    name: name.to_string(),
                    simple_token: if self.ctx.jwt.is_some() {
                        String::new()
                    } else {
                        token::new_prefix()
                    },
                })),
            })),
            ..Default::default()
        };
        match self.ctx.propose(ir).await? {
            Out::Auth(a) => Ok(a.token),
            _ => Err(ApiError::Internal("unexpected apply result".into()).into()),
        }
    }
}

fn auth_err(e: AuthError) -> Status {
    ApiError::Auth(e).into()
}

#[tonic::async_trait]
impl Auth for AuthService {
    async fn auth_enable(&self, req: Request<AuthEnableRequest>) -> Res<AuthEnableResponse> {
        self.change(&req, A::Enable(AuthEnableRequest {})).await?;
        Ok(Response::new(AuthEnableResponse {
            header: self.header(),
        }))
    }

    async fn auth_disable(&self, req: Request<AuthDisableRequest>) -> Res<AuthDisableResponse> {
        self.change(&req, A::Disable(AuthDisableRequest {})).await?;
        Ok(Response::new(AuthDisableResponse {
            header: self.header(),
        }))
    }

    async fn auth_status(&self, req: Request<AuthStatusRequest>) -> Res<AuthStatusResponse> {
        self.who(&req).await?;
        self.ctx.node.read_barrier().await.map_err(ApiError::from)?;
        let store = self.ctx.node.auth();
        Ok(Response::new(AuthStatusResponse {
            header: self.header(),
            enabled: store.is_enabled(),
            auth_revision: store.revision(),
        }))
    }

    async fn authenticate(&self, req: Request<AuthenticateRequest>) -> Res<AuthenticateResponse> {
        self.ctx.check_leader(req.metadata())?;
        let r = req.get_ref();
        // A lagging member must not check the password against a replaced one: it first
        // applies every change acknowledged before this request.
        self.ctx.node.read_barrier().await.map_err(ApiError::from)?;
        let store = self.ctx.node.auth();
        // A verify-only JWT member cannot issue tokens (etcd fails the same way, at apply).
        let verify_only = self.ctx.jwt.as_ref().is_some_and(|j| j.verify_only());
        let token = while_revision_holds(
            move || async move {
                let revision = self.check_password(&r.name, &r.password).await?;
                if verify_only {
                    return Err(Status::unknown(JwtError::VerifyOnly.to_string()));
                }
                Ok(revision)
            },
            move || self.propose_token(&r.name),
            move || store.revision(),
            AUTHENTICATE_ATTEMPTS,
        )
        .await?
        .ok_or(ApiError::Timeout)?;
        let token = match &self.ctx.jwt {
            None => token,
            Some(jwt) => {
                // Deleted since the entry applied: fail as if it had been deleted before.
                if !store.user_exists(&r.name) {
                    return Err(auth_err(AuthError::AuthFailed));
                }
                jwt.assign(&r.name, store.revision())
                    .map_err(|e| Status::unknown(e.to_string()))?
            }
        };
        Ok(Response::new(AuthenticateResponse {
            header: self.header(),
            token,
        }))
    }

    async fn user_add(&self, req: Request<AuthUserAddRequest>) -> Res<AuthUserAddResponse> {
        let r = req.get_ref();
        if r.name.is_empty() {
            return Err(auth_err(AuthError::UserEmpty));
        }
        let no_password = r.options.is_some_and(|o| o.no_password);
        let hashed = if no_password {
            String::new()
        } else if !r.hashed_password.is_empty() {
            // A client that hashed it itself (etcd 3.5's clientv3 may).
            r.hashed_password.clone()
        } else {
            self.ctx.passwords.hash(r.password.clone()).await?
        };
        let add = AuthUserAddRequest {
            name: r.name.clone(),
            password: String::new(),
            options: Some(r.options.unwrap_or(UserAddOptions { no_password })),
            hashed_password: hashed,
        };
        self.change(&req, A::UserAdd(add)).await?;
        Ok(Response::new(AuthUserAddResponse {
            header: self.header(),
        }))
    }

    async fn user_get(&self, req: Request<AuthUserGetRequest>) -> Res<AuthUserGetResponse> {
        let name = &req.get_ref().name;
        self.read_as(&req, |store, ai| store.check_user_get(ai, name))
            .await?;
        let roles = self
            .ctx
            .node
            .auth()
            .user_get(&req.get_ref().name)
            .map_err(auth_err)?;
        Ok(Response::new(AuthUserGetResponse {
            header: self.header(),
            roles,
        }))
    }

    async fn user_list(&self, req: Request<AuthUserListRequest>) -> Res<AuthUserListResponse> {
        self.admin_read(&req).await?;
        Ok(Response::new(AuthUserListResponse {
            header: self.header(),
            users: self.ctx.node.auth().user_list(),
        }))
    }

    async fn user_delete(
        &self,
        req: Request<AuthUserDeleteRequest>,
    ) -> Res<AuthUserDeleteResponse> {
        let r = req.get_ref().clone();
        self.change(&req, A::UserDelete(r)).await?;
        Ok(Response::new(AuthUserDeleteResponse {
            header: self.header(),
        }))
    }

    async fn user_change_password(
        &self,
        req: Request<AuthUserChangePasswordRequest>,
    ) -> Res<AuthUserChangePasswordResponse> {
        let r = req.get_ref();
        let hashed = if r.hashed_password.is_empty() {
            self.ctx.passwords.hash(r.password.clone()).await?
        } else {
            r.hashed_password.clone()
        };
        let change = AuthUserChangePasswordRequest {
            name: r.name.clone(),
            password: String::new(),
            hashed_password: hashed,
        };
        self.change(&req, A::UserChangePassword(change)).await?;
        Ok(Response::new(AuthUserChangePasswordResponse {
            header: self.header(),
        }))
    }

    async fn user_grant_role(
        &self,
        req: Request<AuthUserGrantRoleRequest>,
    ) -> Res<AuthUserGrantRoleResponse> {
        let r = req.get_ref().clone();
        self.change(&req, A::UserGrantRole(r)).await?;
        Ok(Response::new(AuthUserGrantRoleResponse {
            header: self.header(),
        }))
    }

    async fn user_revoke_role(
        &self,
        req: Request<AuthUserRevokeRoleRequest>,
    ) -> Res<AuthUserRevokeRoleResponse> {
        let r = req.get_ref().clone();
        self.change(&req, A::UserRevokeRole(r)).await?;
        Ok(Response::new(AuthUserRevokeRoleResponse {
            header: self.header(),
        }))
    }

    async fn role_add(&self, req: Request<AuthRoleAddRequest>) -> Res<AuthRoleAddResponse> {
        let r = req.get_ref().clone();
        if r.name.is_empty() {
            return Err(auth_err(AuthError::RoleEmpty));
        }
        self.change(&req, A::RoleAdd(r)).await?;
        Ok(Response::new(AuthRoleAddResponse {
            header: self.header(),
        }))
    }

    async fn role_get(&self, req: Request<AuthRoleGetRequest>) -> Res<AuthRoleGetResponse> {
        let role = &req.get_ref().role;
        self.read_as(&req, |store, ai| store.check_role_get(ai, role))
            .await?;
        let perm = self
            .ctx
            .node
            .auth()
            .role_get(&req.get_ref().role)
            .map_err(auth_err)?;
        Ok(Response::new(AuthRoleGetResponse {
            header: self.header(),
            perm,
        }))
    }

    async fn role_list(&self, req: Request<AuthRoleListRequest>) -> Res<AuthRoleListResponse> {
        self.admin_read(&req).await?;
        Ok(Response::new(AuthRoleListResponse {
            header: self.header(),
            roles: self.ctx.node.auth().role_list(),
        }))
    }

    async fn role_delete(
        &self,
        req: Request<AuthRoleDeleteRequest>,
    ) -> Res<AuthRoleDeleteResponse> {
        let r = req.get_ref().clone();
        self.change(&req, A::RoleDelete(r)).await?;
        Ok(Response::new(AuthRoleDeleteResponse {
            header: self.header(),
        }))
    }

    async fn role_grant_permission(
        &self,
        req: Request<AuthRoleGrantPermissionRequest>,
    ) -> Res<AuthRoleGrantPermissionResponse> {
        let r = req.get_ref().clone();
        if r.perm.is_none() {
            return Err(auth_err(AuthError::PermissionNotGiven));
        }
        self.change(&req, A::RoleGrantPermission(r)).await?;
        Ok(Response::new(AuthRoleGrantPermissionResponse {
            header: self.header(),
        }))
    }

    async fn role_revoke_permission(
        &self,
        req: Request<AuthRoleRevokePermissionRequest>,
    ) -> Res<AuthRoleRevokePermissionResponse> {
        let r = req.get_ref().clone();
        self.change(&req, A::RoleRevokePermission(r)).await?;
        Ok(Response::new(AuthRoleRevokePermissionResponse {
            header: self.header(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

    /// The store's revision moves while the first token's entry is in flight (a password
    /// change applied before it): that token is not returned, the password is checked again,
    /// and the second check decides.
    #[tokio::test]
    async fn a_token_whose_check_went_stale_is_not_returned() {
        let revision = AtomicU64::new(5);
        let checks = AtomicUsize::new(0);
        let proposals = AtomicUsize::new(0);
        // The password changes during the first proposal; the new one does not match.
        let check = || async {
            match checks.fetch_add(1, Ordering::SeqCst) {
                0 => Ok(revision.load(Ordering::SeqCst)),
                _ => Err(AuthError::AuthFailed),
            }
        };
        let propose = || async {
            let n = proposals.fetch_add(1, Ordering::SeqCst);
            if n == 0 {
                revision.fetch_add(1, Ordering::SeqCst);
            }
            Ok(format!("token{n}"))
        };
        let r = while_revision_holds(check, propose, || revision.load(Ordering::SeqCst), 10);
        assert_eq!(r.await, Err(AuthError::AuthFailed));
        assert_eq!(checks.load(Ordering::SeqCst), 2);
        assert_eq!(proposals.load(Ordering::SeqCst), 1);

        // A change that leaves the password valid (a role granted): the second token stands.
        let checks = AtomicUsize::new(0);
        let proposals = AtomicUsize::new(0);
        let check = || async {
            checks.fetch_add(1, Ordering::SeqCst);
            Ok::<_, AuthError>(revision.load(Ordering::SeqCst))
        };
        let propose = || async {
            let n = proposals.fetch_add(1, Ordering::SeqCst);
            if n == 0 {
                revision.fetch_add(1, Ordering::SeqCst);
            }
            Ok(format!("token{n}"))
        };
        let r = while_revision_holds(check, propose, || revision.load(Ordering::SeqCst), 10);
        assert_eq!(r.await, Ok(Some("token1".to_string())));
        assert_eq!(checks.load(Ordering::SeqCst), 2);

        // The state keeps changing: it gives up after the attempts allowed.
        let propose = || async {
            revision.fetch_add(1, Ordering::SeqCst);
            Ok::<_, AuthError>(())
        };
        let check = || async { Ok(revision.load(Ordering::SeqCst)) };
        let r = while_revision_holds(check, propose, || revision.load(Ordering::SeqCst), 3);
        assert_eq!(r.await, Ok(None));
    }
}
