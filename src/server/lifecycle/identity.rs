//! A member's identity: member id, cluster id and name, fixed at first start and kept in
//! `member/member.json` (`wal::write_file_durable`: a temp file, fsynced, renamed, directory
//! fsynced).
//!
//! A restarted member uses its stored identity and ignores `--initial-cluster*`, as etcd does.
//! A member joining an existing cluster (`--initial-cluster-state existing`) asks its peers
//! which id it was added under.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::proto::kvdpb::MemberInfoRequest;
use crate::raft::net::network::Channels;
use crate::raft::Member;
use crate::server::config::{compute_cluster_id, compute_member_id, ClusterState, Config};
use crate::server::ServerError;
use crate::wal::{RealFs, WalFs};

const FORMAT: u32 = 1;
const FILE: &str = "member.json";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Identity {
    pub format: u32,
    pub member_id: u64,
    pub cluster_id: u64,
    pub name: String,
    /// Member id -> peer URLs of the bootstrap configuration (empty for a joining member).
    pub initial_members: BTreeMap<u64, Vec<String>>,
}

/// Loads the stored identity, or creates it from the flags. Returns whether it is new.
pub async fn load_or_create(
    cfg: &Config,
    dir: &Path,
    channels: &Channels,
) -> Result<(Identity, bool), ServerError> {
    let path = dir.join(FILE);
    if path.exists() {
        let b = std::fs::read(&path)?;
        let id: Identity = serde_json::from_slice(&b).map_err(|e| {
            ServerError::Config(format!("{}: corrupt member identity: {e}", path.display()))
        })?;
        if id.format != FORMAT {
            return Err(ServerError::Config(format!(
                "{}: data dir written by an incompatible kvd (format {}, this kvd reads {FORMAT})",
                path.display(),
                id.format
            )));
        }
        return Ok((id, false));
    }
    let ident = match cfg.initial_cluster_state {
        ClusterState::New => new_cluster(
            &cfg.name,
            &cfg.advertise_peer_urls,
            &cfg.initial_cluster,
            &cfg.initial_cluster_token,
        ),
        ClusterState::Existing => {
            let (member_id, cluster_id) = discover(cfg, channels).await?;
            Identity {
                format: FORMAT,
                member_id,
                cluster_id,
                name: cfg.name.clone(),
                initial_members: BTreeMap::new(),
            }
        }
    };
    store(&RealFs, dir, &ident)?;
    Ok((ident, true))
}

/// The identity of member `name` of a new cluster: ids derived from peer URLs and token as
/// etcd derives them, so every member (and a restore) computes the same ones.
pub fn new_cluster(
    name: &str,
    advertise_peer_urls: &[String],
    initial_cluster: &BTreeMap<String, Vec<String>>,
    token: &str,
) -> Identity {
    let initial_members: BTreeMap<u64, Vec<String>> = initial_cluster
        .values()
        .map(|urls| (compute_member_id(urls, token, None), urls.clone()))
        .collect();
    let ids: Vec<u64> = initial_members.keys().copied().collect();
    Identity {
        format: FORMAT,
        member_id: compute_member_id(advertise_peer_urls, token, None),
        cluster_id: compute_cluster_id(&ids),
        name: name.to_string(),
        initial_members,
    }
}

/// Writes `ident` as `dir/member.json` through `fs` (`wal::write_file_durable`: a temp file,
/// fsynced, renamed, directory fsynced).
pub fn store(fs: &dyn WalFs, dir: &Path, ident: &Identity) -> std::io::Result<()> {
    let json = serde_json::to_vec_pretty(ident).expect("serializable");
    crate::wal::write_file_durable(fs, &dir.join(FILE), &json)
}

/// Asks the other members of `--initial-cluster` which id this member was added under.
async fn discover(cfg: &Config, channels: &Channels) -> Result<(u64, u64), ServerError> {
    let peers: Vec<String> = cfg
        .initial_cluster
        .iter()
        .filter(|(n, _)| **n != cfg.name)
        .flat_map(|(_, u)| u.clone())
        .collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut last_err = String::from("no other member in --initial-cluster");
    while tokio::time::Instant::now() < deadline {
        for url in &peers {
            let Ok(mut c) = channels.peer(&Member {
                peer_urls: vec![url.clone()],
            }) else {
                continue;
            };
            let req = MemberInfoRequest {
                peer_urls: cfg.advertise_peer_urls.clone(),
            };
            match tokio::time::timeout(Duration::from_secs(2), c.member_info(req)).await {
                Ok(Ok(r)) if r.get_ref().found => return Ok((r.get_ref().member_id, r.get_ref().cluster_id)),
                Ok(Ok(_)) => {
                    return Err(ServerError::Config(format!(
                        "member with peer URLs {} is not in the existing cluster: add it first (kvctl member add {} --peer-urls={})",
                        cfg.advertise_peer_urls.join(","),
                        cfg.name,
                        cfg.advertise_peer_urls.join(",")
                    )))
                }
                Ok(Err(s)) => last_err = format!("{url}: {}", s.message()),
                Err(_) => last_err = format!("{url}: timed out"),
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(ServerError::Config(format!(
        "cannot fetch cluster info from peers ({last_err}); is --initial-cluster right?"
    )))
}
