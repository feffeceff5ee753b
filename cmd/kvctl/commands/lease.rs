//! `lease grant|revoke|timetolive|list|keep-alive`, with etcdctl 3.4's simple output and
//! messages.
use futures::StreamExt;
use kvd::proto::etcdserverpb::{
    LeaseGrantRequest, LeaseKeepAliveRequest, LeaseLeasesRequest, LeaseRevokeRequest,
    LeaseTimeToLiveRequest,
};

use crate::cli::{parse_go_int, LeaseIdArgs, LeaseKeepAliveArgs, LeaseTimeToLiveArgs};
use crate::client::with_deadline;
use crate::commands::Ctx;
use crate::error::{status_message, CliError, EXIT_ERROR};
use crate::ops::parse_lease_id;

/// etcdctl's exit code when a keep-alive fails (`ExitBadConnection`).
const EXIT_BAD_CONNECTION: i32 = 2;

fn one_id(args: &[String], missing: &str) -> Result<i64, CliError> {
    if args.len() != 1 {
        return Err(CliError::bad_args(missing));
    }
    parse_lease_id(&args[0], "bad lease ID arg")
}

pub async fn grant(ctx: &Ctx, a: LeaseIdArgs) -> Result<i32, CliError> {
    if a.args.len() != 1 {
        return Err(CliError::bad_args("lease grant command needs TTL argument"));
    }
    let ttl = parse_go_int(&a.args[0]).map_err(|e| CliError::bad_args(format!("bad TTL ({e})")))?;
    let deadline = ctx.deadline();
    let resp = with_deadline(deadline, async {
        let conn = ctx.connect(deadline).await?;
        conn.lease()
            .lease_grant(LeaseGrantRequest { ttl, id: 0 })
            .await
            .map(|r| r.into_inner())
            .map_err(|s| {
                CliError::new(
                    EXIT_ERROR,
                    format!("failed to grant lease ({})", status_message(&s)),
                )
            })
    })
    .await?;
    println!("lease {:016x} granted with TTL({}s)", resp.id, resp.ttl);
    Ok(0)
}

pub async fn revoke(ctx: &Ctx, a: LeaseIdArgs) -> Result<i32, CliError> {
    let id = one_id(&a.args, "lease revoke command needs 1 argument")?;
    let deadline = ctx.deadline();
    with_deadline(deadline, async {
        let conn = ctx.connect(deadline).await?;
        conn.lease()
            .lease_revoke(LeaseRevokeRequest { id })
            .await
            .map_err(|s| {
                CliError::new(
                    EXIT_ERROR,
                    format!("failed to revoke lease ({})", status_message(&s)),
                )
            })
    })
    .await?;
    println!("lease {id:016x} revoked");
    Ok(0)
}

pub async fn time_to_live(ctx: &Ctx, a: LeaseTimeToLiveArgs) -> Result<i32, CliError> {
    let id = one_id(
        &a.args,
        "lease timetolive command needs lease ID as argument",
    )?;
    let deadline = ctx.deadline();
    let resp = with_deadline(deadline, async {
        let conn = ctx.connect(deadline).await?;
        Ok(conn
            .lease()
            .lease_time_to_live(LeaseTimeToLiveRequest { id, keys: a.keys })
            .await?
            .into_inner())
    })
    .await?;
    if resp.granted_ttl == 0 && resp.ttl == -1 {
        println!("lease {:016x} already expired", resp.id);
        return Ok(0);
    }
    let mut txt = format!(
        "lease {:016x} granted with TTL({}s), remaining({}s)",
        resp.id, resp.granted_ttl, resp.ttl
    );
    if a.keys {
        // Go's %v of a []string.
        let keys: Vec<String> = resp
            .keys
            .iter()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect();
        txt.push_str(&format!(", attached keys([{}])", keys.join(" ")));
    }
    println!("{txt}");
    Ok(0)
}

pub async fn list(ctx: &Ctx) -> Result<i32, CliError> {
    let deadline = ctx.deadline();
    let resp = with_deadline(deadline, async {
        let conn = ctx.connect(deadline).await?;
        Ok(conn
            .lease()
            .lease_leases(LeaseLeasesRequest {})
            .await?
            .into_inner())
    })
    .await?;
    let mut out = format!("found {} leases\n", resp.leases.len());
    for l in &resp.leases {
        out.push_str(&format!("{:016x}\n", l.id));
    }
    print!("{out}");
    Ok(0)
}

/// Without `--once`, keeps the lease alive until it is gone (clientv3 renews every third of
/// the TTL) and prints every response.
pub async fn keep_alive(ctx: &Ctx, a: LeaseKeepAliveArgs) -> Result<i32, CliError> {
    let id = one_id(
        &a.args,
        "lease keep-alive command needs lease ID as argument",
    )?;
    let deadline = ctx.deadline();
    let conn = with_deadline(deadline, ctx.connect(deadline)).await?;
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    // grpc-go sends headers lazily: send the first request before awaiting the call.
    let _ = tx.send(LeaseKeepAliveRequest { id }).await;
    let mut client = conn.lease();
    let call = client.lease_keep_alive(tokio_stream::wrappers::ReceiverStream::new(rx));
    let stream_err = |s: tonic::Status| CliError::new(EXIT_BAD_CONNECTION, status_message(&s));
    let mut stream = if a.once {
        with_deadline(deadline, async { call.await.map_err(stream_err) })
            .await?
            .into_inner()
    } else {
        call.await.map_err(stream_err)?.into_inner()
    };
    loop {
        let next = if a.once {
            with_deadline(deadline, async { Ok(stream.next().await) }).await?
        } else {
            stream.next().await
        };
        let resp = match next {
            Some(Ok(r)) => r,
            Some(Err(s)) => return Err(stream_err(s)),
            None => {
                return Err(CliError::new(
                    EXIT_BAD_CONNECTION,
                    "lease keepalive stream closed",
                ))
            }
        };
        if resp.ttl <= 0 {
            if a.once {
                return Err(CliError::new(
                    EXIT_BAD_CONNECTION,
                    "etcdserver: requested lease not found",
                ));
            }
            println!("lease {id:016x} expired or revoked.");
            return Ok(0);
        }
        println!("lease {:016x} keepalived with TTL({})", resp.id, resp.ttl);
        if a.once {
            return Ok(0);
        }
        let pause = std::time::Duration::from_secs((resp.ttl / 3).max(1) as u64);
        tokio::time::sleep(pause).await;
        if tx.send(LeaseKeepAliveRequest { id }).await.is_err() {
            return Err(CliError::new(
                EXIT_BAD_CONNECTION,
                "lease keepalive stream closed",
            ));
        }
    }
}
