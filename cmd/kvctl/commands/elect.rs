//! `elect <election-name> [proposal]` and `elect --listen <election-name>`: etcdctl 3.4's
//! elect, through the Election service. Campaigning runs on a session lease (60 s, clientv3's
//! default), prints the leader key once elected (as `get` prints it) and resigns on
//! SIGINT/SIGTERM; listening prints every leader the election reports until interrupted.

use kvd::proto::etcdserverpb::{RangeRequest, RangeResponse};
use kvd::proto::v3electionpb::election_client::ElectionClient;
use kvd::proto::v3electionpb::{CampaignRequest, LeaderRequest, ResignRequest};

use super::session::{interrupted, Session};
use super::{emit, Ctx};
use crate::cli::ElectArgs;
use crate::error::{CliError, EXIT_BAD_ARGS, EXIT_ERROR};

/// clientv3 concurrency's default session TTL.
const SESSION_TTL: i64 = 60;

pub async fn elect(ctx: &Ctx, a: ElectArgs) -> Result<i32, CliError> {
    if a.args.is_empty() || a.args.len() > 2 {
        return Err(CliError::new(
            EXIT_BAD_ARGS,
            "elect takes one election name argument and an optional proposal argument",
        ));
    }
    if a.args.len() == 1 && !a.listen {
        return Err(CliError::new(
            EXIT_BAD_ARGS,
            "no proposal argument but -l not set",
        ));
    }
    if a.args.len() == 2 && a.listen {
        return Err(CliError::new(EXIT_BAD_ARGS, "proposal given but -l is set"));
    }
    let deadline = ctx.deadline();
    let conn = crate::client::with_deadline(deadline, ctx.connect(deadline)).await?;
    let mut elections = ElectionClient::new(conn.channel.clone());
    let name = a.args[0].clone().into_bytes();

    if a.listen {
        let mut stream = tokio::select! {
            r = elections.observe(LeaderRequest { name }) => r?.into_inner(),
            _ = interrupted() => return Ok(0),
        };
        loop {
            tokio::select! {
                m = stream.message() => match m {
                    Ok(Some(r)) => emit(&ctx.printer.get(&RangeResponse {
                        header: r.header,
                        count: 1,
                        kvs: r.kv.into_iter().collect(),
                        more: false,
                    }, false)?),
                    _ => return Err(CliError::new(EXIT_ERROR, "elect: observer lost")),
                },
                _ = interrupted() => return Ok(0),
            }
        }
    }

    let mut session = Session::open(ctx, &conn, SESSION_TTL).await?;
    let req = CampaignRequest {
        name,
        lease: session.lease,
        value: a.args[1].clone().into_bytes(),
    };
    let elected = tokio::select! {
        r = elections.campaign(req) => r?.into_inner(),
        _ = interrupted() => return Err(CliError::new(EXIT_ERROR, "context canceled")),
    };
    let leader = elected.leader.unwrap_or_default();
    let got = conn
        .kv()
        .range(RangeRequest {
            key: leader.key.clone(),
            ..Default::default()
        })
        .await?
        .into_inner();
    emit(&ctx.printer.get(&got, false)?);
    tokio::select! {
        _ = interrupted() => {}
        _ = &mut session.done => {
            return Err(CliError::new(EXIT_ERROR, "elect: session expired"))
        }
    }
    elections
        .resign(ResignRequest {
            leader: Some(leader),
        })
        .await?;
    Ok(0)
}
