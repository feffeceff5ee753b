//! The requests each subcommand issues, built per request index.

use kvd::proto::etcdserverpb::kv_client::KvClient;
use kvd::proto::etcdserverpb::{request_op, PutRequest, RangeRequest, RequestOp, TxnRequest};
use tonic::transport::Channel;

use crate::keys::KeyGen;
use crate::KeyArgs;

#[derive(Debug, Clone)]
pub enum Op {
    Put {
        keys: KeyGen,
        value: Vec<u8>,
    },
    TxnPut {
        keys: KeyGen,
        value: Vec<u8>,
        ops: usize,
    },
    Range {
        req: RangeRequest,
    },
}

/// `--consistency`: l (linearizable) or s (serializable); true for serializable.
pub fn serializable(consistency: &str) -> anyhow::Result<bool> {
    match consistency {
        "l" => Ok(false),
        "s" => Ok(true),
        c => anyhow::bail!("--consistency must be 'l' or 's', got {c:?}"),
    }
}

/// One value for the whole run, like etcd's tool: random so compression cannot flatter it.
pub fn random_value(size: usize) -> Vec<u8> {
    use rand::RngCore;
    let mut v = vec![0u8; size];
    rand::thread_rng().fill_bytes(&mut v);
    v
}

impl Op {
    pub fn put(k: &KeyArgs) -> anyhow::Result<Op> {
        Ok(Op::Put {
            keys: KeyGen::new(k)?,
            value: random_value(k.val_size),
        })
    }

    pub fn txn_put(k: &KeyArgs, ops: usize) -> anyhow::Result<Op> {
        anyhow::ensure!(ops > 0, "--txn-ops must be positive");
        let keys = KeyGen::new(k)?;
        anyhow::ensure!(
            keys.space() >= ops as u64,
            "--key-space-size must be at least --txn-ops (keys in a txn must differ)"
        );
        Ok(Op::TxnPut {
            keys,
            value: random_value(k.val_size),
            ops,
        })
    }

    pub fn range(
        key: Vec<u8>,
        end: Option<Vec<u8>>,
        consistency: &str,
        limit: i64,
    ) -> anyhow::Result<Op> {
        let serializable = serializable(consistency)?;
        Ok(Op::Range {
            req: RangeRequest {
                key,
                range_end: end.unwrap_or_default(),
                serializable,
                limit,
                ..Default::default()
            },
        })
    }

    pub fn name(&self) -> String {
        match self {
            Op::Put { .. } => "put".into(),
            Op::TxnPut { ops, .. } => format!("txn-put({ops})"),
            Op::Range { req } => format!(
                "range({})",
                if req.serializable {
                    "serializable"
                } else {
                    "linearizable"
                }
            ),
        }
    }

    /// Issues request `i` on `c`.
    pub async fn call(&self, c: &mut KvClient<Channel>, i: u64) -> Result<(), tonic::Status> {
        match self {
            Op::Put { keys, value } => {
                c.put(PutRequest {
                    key: keys.key(i),
                    value: value.clone(),
                    ..Default::default()
                })
                .await?;
            }
            Op::TxnPut { keys, value, ops } => {
                let success = keys
                    .keys(i, *ops as u64)
                    .into_iter()
                    .map(|key| RequestOp {
                        request: Some(request_op::Request::RequestPut(PutRequest {
                            key,
                            value: value.clone(),
                            ..Default::default()
                        })),
                    })
                    .collect();
                c.txn(TxnRequest {
                    success,
                    ..Default::default()
                })
                .await?;
            }
            Op::Range { req } => {
                c.range(req.clone()).await?;
            }
        }
        Ok(())
    }
}

/// The bytes a hex string (two digits a byte, either case) stands for.
pub fn unhex(s: &str) -> anyhow::Result<Vec<u8>> {
    anyhow::ensure!(s.is_ascii(), "{s:?}: not hex digits");
    anyhow::ensure!(
        s.len().is_multiple_of(2),
        "{s:?}: an odd number of hex digits"
    );
    (0..s.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(&s[i..i + 2], 16)
                .map_err(|_| anyhow::anyhow!("{s:?}: not hex digits"))
        })
        .collect()
}
