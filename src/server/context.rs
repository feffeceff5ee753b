//! What every client-facing service shares: the Raft node, ids for response headers, limits.

use tonic::metadata::MetadataMap;

use super::error::ApiError;
use crate::auth::{AuthError, AuthInfo};
use crate::proto::etcdserverpb::ResponseHeader;
use crate::proto::kvdpb::{internal_response, InternalRequest, InternalResponse};
use crate::raft::RaftNode;

/// How long a request with a token waits for this member to apply the token's entry.
const TOKEN_INDEX_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

#[derive(Clone)]
pub struct ServerCtx {
    pub node: RaftNode,
    pub cluster_id: u64,
    pub max_request_bytes: usize,
    pub max_txn_ops: usize,
    pub reconfig: std::sync::Arc<super::membership::Reconfig>,
    /// The backend quota writes are checked against before they are proposed.
    pub quota: std::sync::Arc<super::duties::quota::Quota>,
    /// Password hashing and checking (bcrypt cost, the bound on concurrent checks).
    pub passwords: std::sync::Arc<super::api::auth::Passwords>,
    /// The JWT token provider (`--auth-token jwt,...`); `None` with simple tokens.
    pub jwt: Option<std::sync::Arc<crate::auth::token_jwt::JwtTokens>>,
}

impl ServerCtx {
    /// etcd's response header: this member's id, the cluster id, the given revision and this
    /// member's current term.
    pub fn header(&self, revision: i64) -> Option<ResponseHeader> {
        Some(ResponseHeader {
            cluster_id: self.cluster_id,
            member_id: self.node.id,
            revision,
            raft_term: self.node.term(),
        })
    }

    pub fn current_revision(&self) -> i64 {
        self.node.store().current_revision()
    }

    /// Clients in require-leader mode send `hasleader=true`: fail fast without a leader.
    /// A member that stopped applying (it needs a newer kvd) refuses every request first.
    pub fn check_leader(&self, md: &MetadataMap) -> Result<(), ApiError> {
        if let Some(why) = self.node.needs_upgrade() {
            return Err(ApiError::NeedsUpgrade(why.to_string()));
        }
        let wants = md.get("hasleader").and_then(|v| v.to_str().ok()) == Some("true");
        if wants && !self.node.has_leader() {
            return Err(ApiError::NoLeader);
        }
        Ok(())
    }

    /// Who is asking (etcd's AuthInfoFromCtx): `None` with auth disabled or no credentials;
    /// the user of the `token` (or `authorization`) metadata, else the verified client
    /// certificate's CN. An unknown, expired or (JWT) badly signed token is an error. A JWT
    /// carries the auth revision it was issued at, which the permission checks compare with
    /// the store's (etcd's ErrAuthOldRevision); a simple token is checked at the current one.
    pub async fn auth_info(
        &self,
        md: &MetadataMap,
        ext: &http::Extensions,
    ) -> Result<Option<AuthInfo>, ApiError> {
        let store = self.node.auth();
        if !store.is_enabled() {
            return Ok(None);
        }
        let token = md
            .get("token")
            .or_else(|| md.get("authorization"))
            .and_then(|v| v.to_str().ok());
        if let (Some(token), Some(jwt)) = (token, &self.jwt) {
            return Ok(Some(jwt.info(token).ok_or(AuthError::InvalidAuthToken)?));
        }
        if let Some(token) = token {
            // As etcd's simple tokens: a token is valid once this member has applied the
            // entry that assigned it (its index follows the last dot).
            if let Some(index) = token.rsplit_once('.').and_then(|(_, i)| i.parse().ok()) {
                let wait = self.node.wait_applied(index);
                let _ = tokio::time::timeout(TOKEN_INDEX_WAIT, wait).await;
            }
            let username = store
                .tokens
                .user(token)
                .ok_or(AuthError::InvalidAuthToken)?;
            return Ok(Some(AuthInfo {
                username,
                revision: store.revision(),
            }));
        }
        Ok(
            super::api::client_cert::common_name(ext).map(|username| AuthInfo {
                username,
                revision: store.revision(),
            }),
        )
    }

    /// etcd's admin check of a request (maintenance, membership): with auth enabled, only a
    /// user with the root role.
    pub async fn check_admin(
        &self,
        md: &MetadataMap,
        ext: &http::Extensions,
    ) -> Result<(), ApiError> {
        let ai = self.auth_info(md, ext).await?;
        Ok(self.node.auth().check_admin(ai.as_ref())?)
    }

    /// etcd's requireAuthInfo: with auth enabled, some user.
    pub async fn check_user(
        &self,
        md: &MetadataMap,
        ext: &http::Extensions,
    ) -> Result<(), ApiError> {
        match self.auth_info(md, ext).await? {
            None if self.node.auth().is_enabled() => Err(AuthError::UserEmpty.into()),
            _ => Ok(()),
        }
    }

    /// Replicates a client's write, carrying who asked so the apply checks it.
    pub async fn propose_as(
        &self,
        mut req: InternalRequest,
        ai: Option<&AuthInfo>,
    ) -> Result<internal_response::Response, ApiError> {
        if let Some(ai) = ai {
            req.username = ai.username.clone();
            req.auth_revision = ai.revision;
        }
        self.propose(req).await
    }

    /// Replicates a write and returns its response, or the error applying it produced.
    pub async fn propose(
        &self,
        req: InternalRequest,
    ) -> Result<internal_response::Response, ApiError> {
        use prost::Message;
        if req.encoded_len() > self.max_request_bytes {
            return Err(ApiError::RequestTooLarge);
        }
        let InternalResponse {
            response,
            error_code,
            ..
        } = self.node.propose(req).await?;
        match response {
            Some(internal_response::Response::Error(e)) => Err(ApiError::applied(error_code, e)),
            Some(r) => Ok(r),
            None => Err(ApiError::Internal("empty apply result".into())),
        }
    }
}
