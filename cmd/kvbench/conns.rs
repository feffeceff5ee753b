//! Dials the `--conns` gRPC connections, spread over the endpoints in order; `https://`
//! endpoints over TLS with `--cacert` (and `--cert`/`--key` for mutual TLS).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tonic::transport::{Channel, Endpoint};

use crate::Global;

/// etcd's tools accept `host:port` as well as URLs.
fn url(ep: &str) -> anyhow::Result<String> {
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
    let tls = tls_config(g)?;
    let mut out = Vec::with_capacity(g.conns);
    for i in 0..g.conns {
        let u = url(eps[i % eps.len()])?;
        // Each Endpoint::connect is its own HTTP/2 connection, which is what --conns means.
        let ep = Endpoint::from_shared(u.clone())?
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true);
        let ch = if u.starts_with("https://") {
            let (addr, name) = kvd::raft::net::dial::target(&u).map_err(anyhow::Error::msg)?;
            let config = tls
                .clone()
                .context("https endpoints need --cacert (and --cert/--key for mutual TLS)")?;
            ep.connect_with_connector(kvd::raft::net::dial::TlsDial { config, addr, name })
                .await
        } else {
            ep.connect().await
        }
        .with_context(|| format!("connect {u}"))?;
        out.push(ch);
    }
    Ok(out)
}

/// The TLS client config from `--cacert`, `--cert` and `--key`, if a CA is given.
fn tls_config(g: &Global) -> anyhow::Result<Option<Arc<rustls::ClientConfig>>> {
    use kvd::server::tls::files;
    let Some(ca) = &g.cacert else {
        return Ok(None);
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let b = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(files::roots(ca)?);
    let mut c = match (&g.cert, &g.key) {
        (Some(cert), Some(key)) => {
            b.with_client_auth_cert(files::certs(cert)?, files::key(key)?)?
        }
        _ => b.with_no_client_auth(),
    };
    c.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Some(Arc::new(c)))
}
