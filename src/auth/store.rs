//! The replicated auth store (etcd's auth/store.go): enabled flag, users, roles and the auth
//! revision, changed only by applied `AuthRequest` entries.
//!
//! Invariants:
//! - Every piece of auth state is a state-machine meta key (`auth/enabled`, `auth/revision`,
//!   `auth/user/<name>`, `auth/role/<name>`, values prost-encoded `authpb` messages) written in
//!   the same batch as the entry that changed it, so auth survives restarts and travels in
//!   snapshots; the in-memory copy is reloaded from them at open and after a snapshot load.
//! - The revision starts at 1 and grows by one with every change, so a permission read at an
//!   older revision is detectably stale (a write proposed before a revoke is refused).
//! - Users hold bcrypt hashes only; no clear password is ever stored, logged or proposed.
//! - The permission cache holds entries for the current revision only: every change clears it.
//! - Every change of the revision (an applied change, a load) is published to
//!   [`AuthStore::watch_revision`] after the new state is in place, so a subscriber that sees
//!   the new revision reads the new state.
//! - A simple token outlives a load only if the loaded state has the same revision, enabled
//!   flag and users as the replaced one: every entry that invalidates tokens (user delete,
//!   password change, auth disable) bumps the revision, so an unchanged revision proves none
//!   was skipped; any other load drops them all (see docs/decisions/0041-auth-freshness.md).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};

use prost::Message;

use super::error::AuthError;
use super::perms::{same_range, UserPerms};
use super::token::SimpleTokens;
use crate::proto::authpb::{Permission, Role, User, UserAddOptions};
use crate::proto::etcdserverpb::{
    request_op, AuthRoleAddRequest, AuthRoleDeleteRequest, AuthRoleGrantPermissionRequest,
    AuthRoleRevokePermissionRequest, AuthUserAddRequest, AuthUserChangePasswordRequest,
    AuthUserDeleteRequest, AuthUserGrantRoleRequest, AuthUserRevokeRoleRequest, RequestOp,
    TxnRequest,
};
use crate::proto::kvdpb::{
    auth_request, internal_request, AuthRequest, InternalAuthenticateRequest, InternalRequest,
};
use crate::sync::LockExt;
use crate::sync::RwLockExt;

/// Meta key prefix of all auth state.
pub const META_AUTH_PREFIX: &str = "auth/";
pub(super) const META_ENABLED: &str = "auth/enabled";
pub(super) const META_REVISION: &str = "auth/revision";
pub(super) const META_USER: &str = "auth/user/";
pub(super) const META_ROLE: &str = "auth/role/";

pub const ROOT: &str = "root";

/// A meta write: the key and its value, `None` to delete.
pub type MetaWrite = (Vec<u8>, Option<Vec<u8>>);

/// Who a request comes from, as etcd's AuthInfo: the user and the auth revision their token
/// was checked at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthInfo {
    pub username: String,
    pub revision: u64,
}

/// A permission decision taken at one auth state, applied to keys later
/// ([`AuthStore::key_check`]).
#[derive(Clone, Debug)]
pub struct KeyCheck(Verdict);

#[derive(Clone, Debug)]
enum Verdict {
    /// Auth is off, or the user has the root role.
    Any,
    /// Every key is refused with this error (no identity, a stale token, no such user).
    Refuse(AuthError),
    Perms(Arc<UserPerms>),
}

impl KeyCheck {
    /// Whether the range `[key, range_end)` may be read (or written, if `write`).
    pub fn check(&self, key: &[u8], range_end: &[u8], write: bool) -> Result<(), AuthError> {
        match &self.0 {
            Verdict::Any => Ok(()),
            Verdict::Refuse(e) => Err(*e),
            Verdict::Perms(p) if p.permits(key, range_end, write) => Ok(()),
            Verdict::Perms(_) => Err(AuthError::PermissionDenied),
        }
    }
}

#[derive(Default)]
struct State {
    enabled: bool,
    revision: u64,
    users: BTreeMap<String, User>,
    roles: BTreeMap<String, Role>,
}

/// etcd's auth store for one member.
pub struct AuthStore {
    state: RwLock<State>,
    /// Per-user merged permissions at the current revision.
    cache: Mutex<HashMap<String, Arc<UserPerms>>>,
    /// Simple tokens assigned by applied Authenticate entries (in memory, as etcd's).
    pub tokens: SimpleTokens,
    /// The revision, for those that must react to a change (open watches re-check theirs).
    revision_tx: tokio::sync::watch::Sender<u64>,
}

impl Default for AuthStore {
    fn default() -> Self {
        AuthStore {
            state: RwLock::new(State {
                revision: 1,
                ..Default::default()
            }),
            cache: Mutex::default(),
            tokens: SimpleTokens::default(),
            revision_tx: tokio::sync::watch::Sender::new(1),
        }
    }
}

fn user_key(name: &str) -> Vec<u8> {
    format!("{META_USER}{name}").into_bytes()
}

fn role_key(name: &str) -> Vec<u8> {
    format!("{META_ROLE}{name}").into_bytes()
}

impl AuthStore {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read_or_recover()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write_or_recover()
    }

    /// Replaces the state with the one stored under `entries` (the `auth/` meta keys).
    pub fn load(&self, entries: &[(Vec<u8>, Vec<u8>)]) {
        let mut s = State {
            revision: 1,
            ..Default::default()
        };
        for (k, v) in entries {
            let k = String::from_utf8_lossy(k);
            if k == META_ENABLED {
                s.enabled = v.first() == Some(&1);
            } else if k == META_REVISION {
                if let Ok(b) = <[u8; 8]>::try_from(v.as_slice()) {
                    s.revision = u64::from_be_bytes(b);
                }
            } else if let Some(name) = k.strip_prefix(META_USER) {
                if let Ok(u) = User::decode(v.as_slice()) {
                    s.users.insert(name.to_string(), u);
                }
            } else if let Some(name) = k.strip_prefix(META_ROLE) {
                if let Ok(r) = Role::decode(v.as_slice()) {
                    s.roles.insert(name.to_string(), r);
                }
            }
        }
        let revision = s.revision;
        {
            let mut cur = self.write();
            // The tokens were assigned for the replaced state; the entries that led from it to
            // the loaded one were never applied here, so whatever they invalidated is unknown
            // unless nothing that invalidates tokens can be among them.
            let same =
                s.enabled && cur.enabled && s.revision == cur.revision && s.users == cur.users;
            if !same {
                self.tokens.clear();
            }
            *cur = s;
            self.cache.lock_or_recover().clear();
        }
        self.revision_tx.send_replace(revision);
    }

    /// The auth revision, changing whenever the auth state does (a load may also keep it).
    pub fn watch_revision(&self) -> tokio::sync::watch::Receiver<u64> {
        self.revision_tx.subscribe()
    }

    pub fn is_enabled(&self) -> bool {
        self.read().enabled
    }

    pub fn revision(&self) -> u64 {
        self.read().revision
    }

    /// etcd's CheckPassword before the bcrypt compare: the stored hash of `name`'s password
    /// and the revision, or why no password can match.
    pub fn password_hash(&self, name: &str) -> Result<(Vec<u8>, u64), AuthError> {
        let s = self.read();
        if !s.enabled {
            return Err(AuthError::AuthNotEnabled);
        }
        let u = s.users.get(name).ok_or(AuthError::AuthFailed)?;
        if u.options.as_ref().is_some_and(|o| o.no_password) {
            return Err(AuthError::AuthFailed);
        }
        Ok((u.password.clone(), s.revision))
    }

    /// Whether `name` is a user (the CN of a client certificate must name one).
    pub fn user_exists(&self, name: &str) -> bool {
        self.read().users.contains_key(name)
    }

    pub fn user_get(&self, name: &str) -> Result<Vec<String>, AuthError> {
        let s = self.read();
        let u = s.users.get(name).ok_or(AuthError::UserNotFound)?;
        Ok(u.roles.clone())
    }

    pub fn user_list(&self) -> Vec<String> {
        self.read().users.keys().cloned().collect()
    }

    pub fn role_get(&self, name: &str) -> Result<Vec<Permission>, AuthError> {
        let s = self.read();
        let r = s.roles.get(name).ok_or(AuthError::RoleNotFound)?;
        Ok(r.key_permission.clone())
    }

    pub fn role_list(&self) -> Vec<String> {
        self.read().roles.keys().cloned().collect()
    }

    /// etcd's IsAdminPermitted: with auth enabled, only a user with the root role.
    pub fn check_admin(&self, ai: Option<&AuthInfo>) -> Result<(), AuthError> {
        let s = self.read();
        if !s.enabled {
            return Ok(());
        }
        let name = match ai {
            Some(ai) if !ai.username.is_empty() => &ai.username,
            _ => return Err(AuthError::UserEmpty),
        };
        let u = s.users.get(name).ok_or(AuthError::UserNotFound)?;
        if !has_root_role(u) {
            return Err(AuthError::PermissionDenied);
        }
        Ok(())
    }

    /// etcd's authApplierV3.UserGet: an admin, or the user asking about themself.
    pub fn check_user_get(&self, ai: Option<&AuthInfo>, name: &str) -> Result<(), AuthError> {
        match self.check_admin(ai) {
            Err(_) if ai.is_some_and(|ai| ai.username == name) => Ok(()),
            r => r,
        }
    }

    /// etcd's authApplierV3.RoleGet: an admin, or a user who holds the role.
    pub fn check_role_get(&self, ai: Option<&AuthInfo>, role: &str) -> Result<(), AuthError> {
        match self.check_admin(ai) {
            Err(_) if ai.is_some_and(|ai| self.has_role(&ai.username, role)) => Ok(()),
            r => r,
        }
    }

    /// etcd's HasRole: whether user `name` exists and holds `role`.
    fn has_role(&self, name: &str, role: &str) -> bool {
        let s = self.read();
        s.users
            .get(name)
            .is_some_and(|u| u.roles.iter().any(|r| r == role))
    }

    /// etcd's isOpPermitted: whether `ai` may read (or write) `[key, range_end)`.
    pub fn check_op(
        &self,
        ai: Option<&AuthInfo>,
        key: &[u8],
        range_end: &[u8],
        write: bool,
    ) -> Result<(), AuthError> {
        self.key_check(ai).check(key, range_end, write)
    }

    /// What `ai` may do at the current auth state, decided once and kept: checked later
    /// against keys it does not know yet, it answers as [`Self::check_op`] would have now.
    pub fn key_check(&self, ai: Option<&AuthInfo>) -> KeyCheck {
        let s = self.read();
        if !s.enabled {
            return KeyCheck(Verdict::Any);
        }
        let ai = match ai {
            Some(ai) if ai.revision != 0 => ai,
            _ => return KeyCheck(Verdict::Refuse(AuthError::UserEmpty)),
        };
        if ai.revision < s.revision {
            return KeyCheck(Verdict::Refuse(AuthError::AuthOldRevision));
        }
        let Some(u) = s.users.get(&ai.username) else {
            return KeyCheck(Verdict::Refuse(AuthError::PermissionDenied));
        };
        if has_root_role(u) {
            return KeyCheck(Verdict::Any);
        }
        let perms = {
            let mut cache = self.cache.lock_or_recover();
            cache
                .entry(ai.username.clone())
                .or_insert_with(|| {
                    Arc::new(UserPerms::of_roles(
                        u.roles.iter().filter_map(|r| s.roles.get(r)),
                    ))
                })
                .clone()
        };
        KeyCheck(Verdict::Perms(perms))
    }

    pub fn check_lease(
        &self,
        ai: Option<&AuthInfo>,
        keys: &[Vec<u8>],
        write: bool,
    ) -> Result<(), AuthError> {
        if !self.is_enabled() {
            return Ok(());
        }
        let Some(ai) = ai else {
            return Err(AuthError::UserEmpty);
        };
        if self.check_admin(Some(ai)).is_ok() {
            return Ok(());
        }
        for k in keys {
            self.check_op(Some(ai), k, &[], write)?;
        }
        Ok(())
    }

    /// etcd's checkTxnAuth: read on every compared key, and every op of both branches.
    pub fn check_txn(&self, ai: Option<&AuthInfo>, t: &TxnRequest) -> Result<(), AuthError> {
        for c in &t.compare {
            self.check_op(ai, &c.key, &c.range_end, false)?;
        }
        self.check_ops(ai, &t.success)?;
        self.check_ops(ai, &t.failure)
    }

    fn check_ops(&self, ai: Option<&AuthInfo>, ops: &[RequestOp]) -> Result<(), AuthError> {
        use request_op::Request as Op;
        for op in ops {
            match &op.request {
                Some(Op::RequestRange(r)) => self.check_op(ai, &r.key, &r.range_end, false)?,
                Some(Op::RequestPut(p)) => {
                    self.check_op(ai, &p.key, &[], true)?;
                    if p.prev_kv {
                        self.check_op(ai, &p.key, &[], false)?;
                    }
                }
                Some(Op::RequestDeleteRange(d)) => {
                    if d.prev_kv {
                        self.check_op(ai, &d.key, &d.range_end, false)?;
                    }
                    self.check_op(ai, &d.key, &d.range_end, true)?;
                }
                Some(Op::RequestTxn(t)) => self.check_txn(ai, t)?,
                None => {}
            }
        }
        Ok(())
    }

    /// The apply-time check of a client write (etcd's authApplierV3), with the proposer's
    /// identity from the entry. Server-made entries (lease expiry, compaction, alarms,
    /// publish) are not checked. A lease revoke is checked against the keys its lease holds
    /// when it applies, which only the store knows then: [`Self::revoke_check`].
    pub fn check_entry(&self, req: &InternalRequest) -> Result<(), AuthError> {
        use internal_request::Request as R;
        let ai = AuthInfo {
            username: req.username.clone(),
            revision: req.auth_revision,
        };
        let ai = Some(&ai);
        match &req.request {
            Some(R::Put(p)) => {
                self.check_op(ai, &p.key, &[], true)?;
                if p.prev_kv {
                    self.check_op(ai, &p.key, &[], false)?;
                }
                Ok(())
            }
            Some(R::DeleteRange(d)) => {
                if d.prev_kv {
                    self.check_op(ai, &d.key, &d.range_end, false)?;
                }
                self.check_op(ai, &d.key, &d.range_end, true)
            }
            Some(R::Txn(t)) => self.check_txn(ai, t),
            Some(R::Auth(a)) => match &a.request {
                Some(auth_request::Request::Authenticate(_)) | None => Ok(()),
                Some(_) => self.check_admin(ai),
            },
            _ => Ok(()),
        }
    }

    /// For a client's lease revoke entry: the check of each key its lease holds, taken at
    /// this point of the log (etcd's checkLeasePuts: write permission on every key; a lease
    /// without keys needs none). `None` for any other entry.
    pub fn revoke_check(&self, req: &InternalRequest) -> Option<KeyCheck> {
        match &req.request {
            Some(internal_request::Request::LeaseRevoke(_)) => {
                Some(self.key_check(Some(&AuthInfo {
                    username: req.username.clone(),
                    revision: req.auth_revision,
                })))
            }
            _ => None,
        }
    }

    /// Applies an auth change at log `index`: etcd's result, and the meta writes.
    /// An applied Authenticate answers the token it assigned.
    pub fn apply(
        &self,
        req: &AuthRequest,
        index: u64,
    ) -> (Result<Option<String>, AuthError>, Vec<MetaWrite>) {
        use auth_request::Request as A;
        let mut s = self.write();
        let mut w = Vec::new();
        let mut token = None;
        let r = (|| -> Result<bool, AuthError> {
            match req.request.as_ref() {
                None => Ok(false),
                Some(A::Enable(_)) => self.enable(&mut s, &mut w),
                Some(A::Disable(_)) => self.disable(&mut s, &mut w),
                Some(A::Authenticate(a)) => {
                    token = self.authenticate(&s, a, index)?;
                    Ok(false)
                }
                Some(A::UserAdd(u)) => self.user_add(&mut s, &mut w, u),
                Some(A::UserDelete(u)) => self.user_delete(&mut s, &mut w, u),
                Some(A::UserChangePassword(u)) => self.user_change_password(&mut s, &mut w, u),
                Some(A::UserGrantRole(g)) => self.user_grant_role(&mut s, &mut w, g),
                Some(A::UserRevokeRole(g)) => self.user_revoke_role(&mut s, &mut w, g),
                Some(A::RoleAdd(r)) => self.role_add(&mut s, &mut w, r),
                Some(A::RoleDelete(r)) => self.role_delete(&mut s, &mut w, r),
                Some(A::RoleGrantPermission(g)) => self.role_grant_permission(&mut s, &mut w, g),
                Some(A::RoleRevokePermission(g)) => self.role_revoke_permission(&mut s, &mut w, g),
            }
        })();
        match r {
            Ok(changed) => {
                if changed {
                    s.revision += 1;
                    w.push((
                        META_REVISION.into(),
                        Some(s.revision.to_be_bytes().to_vec()),
                    ));
                    self.cache.lock_or_recover().clear();
                    let revision = s.revision;
                    drop(s);
                    self.revision_tx.send_replace(revision);
                }
                (Ok(token), w)
            }
            Err(e) => (Err(e), Vec::new()),
        }
    }

    /// Turns authentication on, if the root user has the root role.
    fn enable(&self, s: &mut State, w: &mut Vec<MetaWrite>) -> Result<bool, AuthError> {
        if s.enabled {
            return Ok(false);
        }
        let root = s.users.get(ROOT).ok_or(AuthError::RootUserNotExist)?;
        if !has_root_role(root) {
            return Err(AuthError::RootRoleNotExist);
        }
        s.enabled = true;
        w.push((META_ENABLED.into(), Some(vec![1])));
        tracing::info!("enabled authentication");
        Ok(true)
    }

    /// Turns authentication off and drops every token.
    fn disable(&self, s: &mut State, w: &mut Vec<MetaWrite>) -> Result<bool, AuthError> {
        if !s.enabled {
            return Ok(false);
        }
        s.enabled = false;
        self.tokens.clear();
        w.push((META_ENABLED.into(), Some(vec![0])));
        tracing::info!("disabled authentication");
        Ok(true)
    }

    /// Assigns the simple token a successful authentication asked for.
    fn authenticate(
        &self,
        s: &State,
        a: &InternalAuthenticateRequest,
        index: u64,
    ) -> Result<Option<String>, AuthError> {
        if !s.enabled {
            return Err(AuthError::AuthNotEnabled);
        }
        if !s.users.contains_key(&a.name) {
            return Err(AuthError::AuthFailed);
        }
        if !a.simple_token.is_empty() {
            let t = format!("{}.{index}", a.simple_token);
            self.tokens.assign(t.clone(), a.name.clone());
            return Ok(Some(t));
        }
        Ok(None)
    }

    /// Adds a user with no roles.
    fn user_add(
        &self,
        s: &mut State,
        w: &mut Vec<MetaWrite>,
        u: &AuthUserAddRequest,
    ) -> Result<bool, AuthError> {
        if u.name.is_empty() {
            return Err(AuthError::UserEmpty);
        }
        if s.users.contains_key(&u.name) {
            return Err(AuthError::UserAlreadyExist);
        }
        let user = User {
            name: u.name.clone().into_bytes(),
            password: u.hashed_password.clone().into_bytes(),
            roles: Vec::new(),
            options: Some(u.options.unwrap_or(UserAddOptions { no_password: false })),
        };
        w.push((user_key(&u.name), Some(user.encode_to_vec())));
        s.users.insert(u.name.clone(), user);
        tracing::info!(user = %u.name, "added a user");
        Ok(true)
    }

    /// Deletes a user (never root while auth is on) and its tokens.
    fn user_delete(
        &self,
        s: &mut State,
        w: &mut Vec<MetaWrite>,
        u: &AuthUserDeleteRequest,
    ) -> Result<bool, AuthError> {
        if s.enabled && u.name == ROOT {
            return Err(AuthError::InvalidAuthMgmt);
        }
        s.users.remove(&u.name).ok_or(AuthError::UserNotFound)?;
        w.push((user_key(&u.name), None));
        self.tokens.invalidate_user(&u.name);
        tracing::info!(user = %u.name, "deleted a user");
        Ok(true)
    }

    /// Sets a user's password hash and drops its tokens.
    fn user_change_password(
        &self,
        s: &mut State,
        w: &mut Vec<MetaWrite>,
        u: &AuthUserChangePasswordRequest,
    ) -> Result<bool, AuthError> {
        let user = s.users.get_mut(&u.name).ok_or(AuthError::UserNotFound)?;
        user.password = u.hashed_password.clone().into_bytes();
        w.push((user_key(&u.name), Some(user.encode_to_vec())));
        self.tokens.invalidate_user(&u.name);
        tracing::info!(user = %u.name, "changed a password of a user");
        Ok(true)
    }

    /// Grants a user a role, keeping its roles sorted.
    fn user_grant_role(
        &self,
        s: &mut State,
        w: &mut Vec<MetaWrite>,
        g: &AuthUserGrantRoleRequest,
    ) -> Result<bool, AuthError> {
        if !s.users.contains_key(&g.user) {
            return Err(AuthError::UserNotFound);
        }
        if g.role != ROOT && !s.roles.contains_key(&g.role) {
            return Err(AuthError::RoleNotFound);
        }
        let user = s.users.get_mut(&g.user).expect("checked above");
        let Err(i) = user.roles.binary_search(&g.role) else {
            return Ok(false);
        };
        user.roles.insert(i, g.role.clone());
        w.push((user_key(&g.user), Some(user.encode_to_vec())));
        Ok(true)
    }

    /// Revokes a role from a user (never root's root role while auth is on).
    fn user_revoke_role(
        &self,
        s: &mut State,
        w: &mut Vec<MetaWrite>,
        g: &AuthUserRevokeRoleRequest,
    ) -> Result<bool, AuthError> {
        if s.enabled && g.name == ROOT && g.role == ROOT {
            return Err(AuthError::InvalidAuthMgmt);
        }
        let user = s.users.get_mut(&g.name).ok_or(AuthError::UserNotFound)?;
        let i = user
            .roles
            .iter()
            .position(|r| *r == g.role)
            .ok_or(AuthError::RoleNotGranted)?;
        user.roles.remove(i);
        w.push((user_key(&g.name), Some(user.encode_to_vec())));
        Ok(true)
    }

    /// Adds a role with no permissions.
    fn role_add(
        &self,
        s: &mut State,
        w: &mut Vec<MetaWrite>,
        r: &AuthRoleAddRequest,
    ) -> Result<bool, AuthError> {
        if r.name.is_empty() {
            return Err(AuthError::RoleEmpty);
        }
        if s.roles.contains_key(&r.name) {
            return Err(AuthError::RoleAlreadyExist);
        }
        let role = Role {
            name: r.name.clone().into_bytes(),
            key_permission: Vec::new(),
        };
        w.push((role_key(&r.name), Some(role.encode_to_vec())));
        s.roles.insert(r.name.clone(), role);
        Ok(true)
    }

    /// Deletes a role (never root while auth is on) and revokes it from every user.
    fn role_delete(
        &self,
        s: &mut State,
        w: &mut Vec<MetaWrite>,
        r: &AuthRoleDeleteRequest,
    ) -> Result<bool, AuthError> {
        if s.enabled && r.role == ROOT {
            return Err(AuthError::InvalidAuthMgmt);
        }
        s.roles.remove(&r.role).ok_or(AuthError::RoleNotFound)?;
        w.push((role_key(&r.role), None));
        for (name, u) in s.users.iter_mut() {
            if let Some(i) = u.roles.iter().position(|x| *x == r.role) {
                u.roles.remove(i);
                w.push((user_key(name), Some(u.encode_to_vec())));
            }
        }
        Ok(true)
    }

    /// Grants a role a key range permission, or changes the type of one it has.
    fn role_grant_permission(
        &self,
        s: &mut State,
        w: &mut Vec<MetaWrite>,
        g: &AuthRoleGrantPermissionRequest,
    ) -> Result<bool, AuthError> {
        let perm = g.perm.as_ref().ok_or(AuthError::PermissionNotGiven)?;
        let role = s.roles.get_mut(&g.name).ok_or(AuthError::RoleNotFound)?;
        match role
            .key_permission
            .iter_mut()
            .find(|p| same_range(p, &perm.key, &perm.range_end))
        {
            Some(p) => p.perm_type = perm.perm_type,
            None => {
                role.key_permission.push(perm.clone());
                role.key_permission.sort_by(|a, b| a.key.cmp(&b.key));
            }
        }
        w.push((role_key(&g.name), Some(role.encode_to_vec())));
        Ok(true)
    }

    /// Revokes a role's permission on exactly this key range.
    fn role_revoke_permission(
        &self,
        s: &mut State,
        w: &mut Vec<MetaWrite>,
        g: &AuthRoleRevokePermissionRequest,
    ) -> Result<bool, AuthError> {
        let role = s.roles.get_mut(&g.role).ok_or(AuthError::RoleNotFound)?;
        let i = role
            .key_permission
            .iter()
            .position(|p| same_range(p, &g.key, &g.range_end))
            .ok_or(AuthError::PermissionNotGranted)?;
        role.key_permission.remove(i);
        w.push((role_key(&g.role), Some(role.encode_to_vec())));
        Ok(true)
    }
}

fn has_root_role(u: &User) -> bool {
    u.roles.iter().any(|r| r == ROOT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::authpb::permission::Type as PermType;
    use crate::proto::etcdserverpb::*;
    use auth_request::Request as A;

    fn apply(s: &AuthStore, r: A) -> Result<(), AuthError> {
        s.apply(&AuthRequest { request: Some(r) }, 7).0.map(|_| ())
    }

    /// root (root role), u with read on `foo/` prefix and readwrite on `k`; auth enabled.
    fn store() -> AuthStore {
        let s = AuthStore::default();
        for name in ["root", "u"] {
            apply(
                &s,
                A::UserAdd(AuthUserAddRequest {
                    name: name.into(),
                    hashed_password: "h".into(),
                    ..Default::default()
                }),
            )
            .unwrap();
        }
        assert_eq!(
            apply(&s, A::Enable(AuthEnableRequest {})),
            Err(AuthError::RootRoleNotExist)
        );
        let grant = |user: &str, role: &str| {
            A::UserGrantRole(AuthUserGrantRoleRequest {
                user: user.into(),
                role: role.into(),
            })
        };
        apply(&s, grant("root", "root")).unwrap();
        apply(&s, A::RoleAdd(AuthRoleAddRequest { name: "r".into() })).unwrap();
        for (t, k, e) in [
            (PermType::Read, "foo/", "foo0"),
            (PermType::Readwrite, "k", ""),
        ] {
            apply(
                &s,
                A::RoleGrantPermission(AuthRoleGrantPermissionRequest {
                    name: "r".into(),
                    perm: Some(Permission {
                        perm_type: t as i32,
                        key: k.into(),
                        range_end: e.into(),
                    }),
                }),
            )
            .unwrap();
        }
        apply(&s, grant("u", "r")).unwrap();
        apply(&s, A::Enable(AuthEnableRequest {})).unwrap();
        s
    }

    fn op(r: request_op::Request) -> RequestOp {
        RequestOp { request: Some(r) }
    }

    #[test]
    fn txn_needs_every_compare_and_op_in_both_branches() {
        let s = store();
        let ai = AuthInfo {
            username: "u".into(),
            revision: s.revision(),
        };
        let get = |k: &str| {
            op(request_op::Request::RequestRange(RangeRequest {
                key: k.into(),
                ..Default::default()
            }))
        };
        let put = |k: &str| {
            op(request_op::Request::RequestPut(PutRequest {
                key: k.into(),
                ..Default::default()
            }))
        };
        let txn = |cmp: &str, success: Vec<RequestOp>, failure: Vec<RequestOp>| TxnRequest {
            compare: vec![Compare {
                key: cmp.into(),
                ..Default::default()
            }],
            success,
            failure,
        };
        let ok = txn("foo/a", vec![get("foo/b")], vec![put("k")]);
        assert_eq!(s.check_txn(Some(&ai), &ok), Ok(()));
        let bad_cmp = txn("bar", vec![], vec![]);
        assert_eq!(
            s.check_txn(Some(&ai), &bad_cmp),
            Err(AuthError::PermissionDenied)
        );
        let bad_failure = txn("foo/a", vec![get("foo/b")], vec![put("foo/b")]);
        assert_eq!(
            s.check_txn(Some(&ai), &bad_failure),
            Err(AuthError::PermissionDenied)
        );
        let nested = txn(
            "k",
            vec![op(request_op::Request::RequestTxn(txn(
                "k",
                vec![],
                vec![get("x")],
            )))],
            vec![],
        );
        assert_eq!(
            s.check_txn(Some(&ai), &nested),
            Err(AuthError::PermissionDenied)
        );
        // Anonymous, then a stale revision.
        assert_eq!(s.check_txn(None, &ok), Err(AuthError::UserEmpty));
        let stale = AuthInfo {
            revision: ai.revision - 1,
            ..ai.clone()
        };
        assert_eq!(
            s.check_txn(Some(&stale), &ok),
            Err(AuthError::AuthOldRevision)
        );
        // root may do anything.
        let root = AuthInfo {
            username: "root".into(),
            revision: s.revision(),
        };
        assert_eq!(s.check_txn(Some(&root), &bad_failure), Ok(()));
    }

    #[test]
    fn changes_bump_the_revision_and_drop_cached_permissions() {
        let s = store();
        let ai = |s: &AuthStore| AuthInfo {
            username: "u".into(),
            revision: s.revision(),
        };
        assert_eq!(s.check_op(Some(&ai(&s)), b"foo/x", b"", false), Ok(()));
        let rev = s.revision();
        apply(
            &s,
            A::UserRevokeRole(AuthUserRevokeRoleRequest {
                name: "u".into(),
                role: "r".into(),
            }),
        )
        .unwrap();
        assert_eq!(s.revision(), rev + 1);
        assert_eq!(
            s.check_op(Some(&ai(&s)), b"foo/x", b"", false),
            Err(AuthError::PermissionDenied)
        );
        // A refused change changes nothing.
        let (r, w) = s.apply(
            &AuthRequest {
                request: Some(A::UserDelete(AuthUserDeleteRequest {
                    name: "root".into(),
                })),
            },
            8,
        );
        assert_eq!(
            (r, w.len(), s.revision()),
            (Err(AuthError::InvalidAuthMgmt), 0, rev + 1)
        );
    }

    /// A store and the meta keys its applied changes wrote, as the state machine keeps them.
    struct Recorded {
        store: AuthStore,
        meta: BTreeMap<Vec<u8>, Vec<u8>>,
    }

    impl Recorded {
        fn new() -> Recorded {
            Recorded {
                store: AuthStore::default(),
                meta: BTreeMap::new(),
            }
        }

        fn run(&mut self, r: A, index: u64) -> Option<String> {
            let (res, w) = self.store.apply(&AuthRequest { request: Some(r) }, index);
            for (k, v) in w {
                match v {
                    Some(v) => self.meta.insert(k, v),
                    None => self.meta.remove(&k),
                };
            }
            res.unwrap()
        }

        /// The image a snapshot of this store carries.
        fn image(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
            self.meta.clone().into_iter().collect()
        }
    }

    fn user_add(name: &str, hash: &str) -> A {
        A::UserAdd(AuthUserAddRequest {
            name: name.into(),
            hashed_password: hash.into(),
            ..Default::default()
        })
    }

    fn login(name: &str) -> A {
        A::Authenticate(crate::proto::kvdpb::InternalAuthenticateRequest {
            name: name.into(),
            simple_token: "tok".into(),
        })
    }

    /// root and u, auth enabled, u logged in: the store and u's token.
    fn logged_in() -> (Recorded, String) {
        let mut r = Recorded::new();
        r.run(user_add("root", "h"), 1);
        r.run(
            A::UserGrantRole(AuthUserGrantRoleRequest {
                user: "root".into(),
                role: "root".into(),
            }),
            2,
        );
        r.run(user_add("u", "h1"), 3);
        r.run(A::Enable(AuthEnableRequest {}), 4);
        let token = r.run(login("u"), 5).unwrap();
        (r, token)
    }

    #[test]
    fn a_load_past_a_user_delete_or_password_change_drops_the_users_tokens() {
        let changes = [
            A::UserDelete(AuthUserDeleteRequest { name: "u".into() }),
            A::UserChangePassword(AuthUserChangePasswordRequest {
                name: "u".into(),
                hashed_password: "h2".into(),
                ..Default::default()
            }),
            // Changed to the same hash: the tokens go all the same, as applying it drops them.
            A::UserChangePassword(AuthUserChangePasswordRequest {
                name: "u".into(),
                hashed_password: "h1".into(),
                ..Default::default()
            }),
        ];
        for change in changes {
            // The member that lags holds the token; the others apply the change (and a
            // login, which changes no revision) and a snapshot of theirs is loaded.
            let (lagging, token) = logged_in();
            let mut ahead = Recorded {
                store: AuthStore::default(),
                meta: lagging.meta.clone(),
            };
            ahead.store.load(&ahead.image());
            ahead.run(change.clone(), 6);
            ahead.run(login("root"), 7);
            assert_eq!(lagging.store.tokens.user(&token).as_deref(), Some("u"));
            lagging.store.load(&ahead.image());
            assert_eq!(lagging.store.tokens.user(&token), None, "{change:?}");
        }
        // Disabled and enabled again in the skipped part: the state is the same but for the
        // revision, and applying the disable would have dropped every token.
        let (lagging, token) = logged_in();
        let mut ahead = Recorded::new();
        ahead.meta = lagging.meta.clone();
        ahead.store.load(&ahead.image());
        ahead.run(A::Disable(AuthDisableRequest {}), 6);
        ahead.run(A::Enable(AuthEnableRequest {}), 7);
        lagging.store.load(&ahead.image());
        assert_eq!(lagging.store.tokens.user(&token), None);
    }

    #[test]
    fn a_load_that_skipped_no_auth_change_keeps_the_tokens() {
        let (lagging, token) = logged_in();
        let mut rx = lagging.store.watch_revision();
        let rev = *rx.borrow_and_update();
        // Only key writes and logins were skipped: same revision, same users.
        lagging.store.load(&lagging.image());
        assert_eq!(lagging.store.tokens.user(&token).as_deref(), Some("u"));
        assert_eq!(*rx.borrow_and_update(), rev);
    }

    #[test]
    fn the_revision_is_published_after_each_change() {
        let (mut r, _) = logged_in();
        let mut rx = r.store.watch_revision();
        assert_eq!(*rx.borrow_and_update(), r.store.revision());
        // A login changes nothing.
        r.run(login("u"), 6);
        assert!(!rx.has_changed().unwrap());
        r.run(A::RoleAdd(AuthRoleAddRequest { name: "x".into() }), 7);
        assert!(rx.has_changed().unwrap());
        assert_eq!(*rx.borrow_and_update(), r.store.revision());
        // A load publishes the loaded revision.
        let fresh = AuthStore::default();
        let mut rx = fresh.watch_revision();
        fresh.load(&r.image());
        assert_eq!(*rx.borrow_and_update(), r.store.revision());
    }

    #[test]
    fn a_user_may_get_their_own_entry_and_the_roles_they_hold() {
        let s = store();
        let ai = |name: &str| AuthInfo {
            username: name.into(),
            revision: s.revision(),
        };
        let u = ai("u");
        assert_eq!(s.check_user_get(Some(&u), "u"), Ok(()));
        assert_eq!(
            s.check_user_get(Some(&u), "root"),
            Err(AuthError::PermissionDenied)
        );
        assert_eq!(s.check_role_get(Some(&u), "r"), Ok(()));
        assert_eq!(
            s.check_role_get(Some(&u), "root"),
            Err(AuthError::PermissionDenied)
        );
        assert_eq!(s.check_user_get(None, "u"), Err(AuthError::UserEmpty));
        assert_eq!(s.check_role_get(None, "r"), Err(AuthError::UserEmpty));
        // root may get anything, existing or not (the get itself says it does not exist).
        let root = ai("root");
        assert_eq!(s.check_user_get(Some(&root), "nobody"), Ok(()));
        assert_eq!(s.check_role_get(Some(&root), "r"), Ok(()));
        // A user that does not exist asking about itself: the get says it does not exist.
        assert_eq!(s.check_user_get(Some(&ai("gone")), "gone"), Ok(()));
        assert_eq!(
            s.check_role_get(Some(&ai("gone")), "r"),
            Err(AuthError::UserNotFound)
        );
    }

    #[test]
    fn state_round_trips_through_its_meta_keys() {
        let s = AuthStore::default();
        let mut meta = std::collections::BTreeMap::new();
        let mut run = |r: A| {
            let (res, w) = s.apply(&AuthRequest { request: Some(r) }, 1);
            res.unwrap();
            for (k, v) in w {
                match v {
                    Some(v) => meta.insert(k, v),
                    None => meta.remove(&k),
                };
            }
        };
        run(A::UserAdd(AuthUserAddRequest {
            name: "root".into(),
            hashed_password: "h".into(),
            ..Default::default()
        }));
        run(A::UserGrantRole(AuthUserGrantRoleRequest {
            user: "root".into(),
            role: "root".into(),
        }));
        run(A::RoleAdd(AuthRoleAddRequest { name: "r".into() }));
        run(A::Enable(AuthEnableRequest {}));
        let loaded = AuthStore::default();
        let entries: Vec<_> = meta.into_iter().collect();
        loaded.load(&entries);
        assert!(loaded.is_enabled());
        assert_eq!(loaded.revision(), s.revision());
        assert_eq!(loaded.user_list(), ["root"]);
        assert_eq!(loaded.role_list(), ["r"]);
        assert_eq!(loaded.password_hash("root").unwrap().0, b"h");
    }
}
