//! Dials the `--conns` gRPC connections, spread over the endpoints in order.

use std::time::Duration;

use anyhow::Context;
use tonic::transport::{Channel, Endpoint};

use crate::Global;

/// etcd's tools accept `host:port` as well as URLs.
fn url(ep: &str) -> anyhow::Result<String> {
    if ep.starts_with("https://") {
        anyhow::bail!("{ep}: TLS endpoints are not supported");
    }
    Ok(if ep.contains("://") {
        ep.to_string()
    } else {
        format!("http://{ep}")
    })
}

pub async fn connect(g: &Global) -> anyhow::Result<Vec<Channel>> {
    let eps: Vec<&str> = g
        .endpoints
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    anyhow::ensure!(!eps.is_empty(), "--endpoints must not be empty");
    anyhow::ensure!(g.conns > 0, "--conns must be positive");
    anyhow::ensure!(g.clients > 0, "--clients must be positive");
    let mut out = Vec::with_capacity(g.conns);
    for i in 0..g.conns {
        let u = url(eps[i % eps.len()])?;
        // Each Endpoint::connect is its own HTTP/2 connection, which is what --conns means.
        let ch = Endpoint::from_shared(u.clone())?
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            .connect()
            .await
            .with_context(|| format!("connect {u}"))?;
        out.push(ch);
    }
    Ok(out)
}
