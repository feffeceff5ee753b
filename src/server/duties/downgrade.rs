//! `Maintenance.Downgrade` as etcd 3.5 answers it, for a cluster that can never be downgraded.
//!
//! etcd 3.5 validates a target (`X.Y` or `X.Y.Z`; only the minor version before the cluster's
//! is allowed), enables a downgrade job (recorded through Raft, after which members of the
//! older version may join), and cancels it. kvd has no older version whose members could
//! join, so no job is ever enabled: VALIDATE answers as etcd does (the cluster version, or
//! etcd's error for a bad target), CANCEL always finds no job in flight, and ENABLE of the one
//! allowed target is refused as unsupported (docs/decisions/0022-lock-election-downgrade.md).
//!
//! Invariants:
//! - Every answer but ENABLE's refusal is etcd 3.5's, code and text: clients recognise them.
//! - Like etcd, VALIDATE and CANCEL first wait for a read-index round, so a member never
//!   answers from a state older than a downgrade decision (here: none) it has not applied.

use tonic::Status;

use crate::proto::etcdserverpb::downgrade_request::DowngradeAction;
use crate::proto::etcdserverpb::{DowngradeRequest, DowngradeResponse};
use crate::server::context::ServerCtx;
use crate::server::error::ApiError;

/// Why a downgrade request is refused.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum DowngradeError {
    /// An action number etcd does not know (etcd's `ErrUnknownMethod`, answered `Unknown`).
    #[error("etcdserver: unknown method")]
    UnknownMethod,
    #[error("etcdserver: wrong downgrade target version format")]
    WrongVersionFormat,
    #[error("etcdserver: invalid downgrade target version")]
    InvalidTargetVersion,
    #[error("etcdserver: no inflight downgrade job")]
    NoInflightDowngrade,
    /// ENABLE of a valid target: kvd has no older version to run as.
    #[error("etcdserver: downgrade is not supported by kvd")]
    NotSupported,
    #[error(transparent)]
    Api(#[from] ApiError),
}

impl From<DowngradeError> for Status {
    fn from(e: DowngradeError) -> Status {
        use tonic::Code;
        let code = match &e {
            DowngradeError::Api(a) => return Status::from(a.clone()),
            DowngradeError::UnknownMethod => Code::Unknown,
            DowngradeError::WrongVersionFormat | DowngradeError::InvalidTargetVersion => {
                Code::InvalidArgument
            }
            DowngradeError::NoInflightDowngrade => Code::FailedPrecondition,
            DowngradeError::NotSupported => Code::Unimplemented,
        };
        Status::new(code, e.to_string())
    }
}

/// (major, minor) of a semantic version `X.Y.Z[-pre][+meta]`, or of `X.Y` (etcd's
/// `convertToClusterVersion`: the patch is dropped).
pub fn target_version(v: &str) -> Result<(u64, u64), DowngradeError> {
    let core = v.split('+').next().unwrap_or("");
    let parts: Vec<&str> = match core.split_once('-') {
        // A pre-release suffix only follows a full X.Y.Z.
        Some((tri, pre)) if !pre.is_empty() => tri.split('.').collect(),
        Some(_) => return Err(DowngradeError::WrongVersionFormat),
        None => core.split('.').collect(),
    };
    let full = core.contains('-') || v.contains('+');
    let numbers: Option<Vec<u64>> = parts
        .iter()
        .map(|p| {
            (!p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                .then(|| p.parse().ok())
                .flatten()
        })
        .collect();
    match numbers.as_deref() {
        Some([major, minor, _patch]) => Ok((*major, *minor)),
        Some([major, minor]) if !full => Ok((*major, *minor)),
        _ => Err(DowngradeError::WrongVersionFormat),
    }
}

/// The cluster version kvd reports, as (major, minor).
fn cluster_version() -> (u64, u64) {
    let mut parts = crate::server::version::ETCD_VERSION
        .split('.')
        .map(|p| p.parse::<u64>().unwrap_or(0));
    (parts.next().unwrap_or(3), parts.next().unwrap_or(5))
}

/// Answers a Downgrade request.
pub async fn downgrade(
    ctx: &ServerCtx,
    r: &DowngradeRequest,
) -> Result<DowngradeResponse, DowngradeError> {
    let action = DowngradeAction::try_from(r.action).map_err(|_| DowngradeError::UnknownMethod)?;
    if action != DowngradeAction::Cancel {
        let target = target_version(&r.version)?;
        ctx.node.read_barrier().await.map_err(ApiError::from)?;
        let (major, minor) = cluster_version();
        // etcd allows exactly one target: the previous minor version of the same major.
        if minor == 0 || target != (major, minor - 1) {
            return Err(DowngradeError::InvalidTargetVersion);
        }
        if action == DowngradeAction::Enable {
            return Err(DowngradeError::NotSupported);
        }
        return Ok(DowngradeResponse {
            header: ctx.header(ctx.current_revision()),
            version: format!("{major}.{minor}.0"),
        });
    }
    ctx.node.read_barrier().await.map_err(ApiError::from)?;
    Err(DowngradeError::NoInflightDowngrade)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_versions_parse_as_etcds() {
        assert_eq!(target_version("3.4"), Ok((3, 4)));
        assert_eq!(target_version("3.4.0"), Ok((3, 4)));
        assert_eq!(target_version("3.4.7-rc.1+build"), Ok((3, 4)));
        for bad in ["", "3", "v3.4", "3.4.x", "3..4", "3.4-rc", "3.4.0.1", "a.b"] {
            assert_eq!(
                target_version(bad),
                Err(DowngradeError::WrongVersionFormat),
                "{bad}"
            );
        }
    }

    #[test]
    fn errors_have_etcds_codes() {
        let s = Status::from(DowngradeError::InvalidTargetVersion);
        assert_eq!(s.code(), tonic::Code::InvalidArgument);
        let s = Status::from(DowngradeError::NoInflightDowngrade);
        assert_eq!(
            (s.code(), s.message()),
            (
                tonic::Code::FailedPrecondition,
                "etcdserver: no inflight downgrade job"
            )
        );
    }
}
