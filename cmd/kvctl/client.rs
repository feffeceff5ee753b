//! Connections to the cluster. Like etcdctl, connecting is part of the command's deadline:
//! an unreachable cluster ends in `context deadline exceeded` after `--command-timeout`.
use std::time::Duration;

use kvd::proto::etcdserverpb::{
    cluster_client::ClusterClient, kv_client::KvClient, maintenance_client::MaintenanceClient,
};
use std::sync::Arc;
use tokio::time::Instant;

use tonic::transport::{Channel, Endpoint};

use crate::error::{status_message, CliError, EXIT_BAD_CONNECTION};
use crate::tls::TlsSettings;
use crate::token::{AuthChannel, Credentials};

/// etcd's clientv3 default limit for requests it sends (`MaxCallSendMsgSize`).
pub const MAX_SEND_MSG_SIZE: usize = 2 * 1024 * 1024;

/// Turns an etcdctl endpoint (`host:port`, `http://` or `https://` URL) into the URL tonic
/// dials: `https` when the connection uses TLS (see `tls`), `http` otherwise.
pub fn endpoint_url(ep: &str, tls: bool) -> Result<String, CliError> {
    if ep.starts_with("unix://") || ep.starts_with("unixs://") {
        return Err(CliError::new(
            crate::error::EXIT_ERROR,
            format!("kvctl does not support unix socket endpoints: {ep}"),
        ));
    }
    let hostport = ep
        .strip_prefix("http://")
        .or_else(|| ep.strip_prefix("https://"))
        .unwrap_or(ep);
    let scheme = if tls { "https" } else { "http" };
    Ok(format!("{scheme}://{hostport}"))
}

/// How to reach the cluster: the connection settings shared by every command.
#[derive(Clone)]
pub struct Dial {
    pub dial_timeout: Duration,
    pub tls: TlsSettings,
    /// `--user` with a password (clientv3 authenticates only when both are non-empty).
    pub auth: Option<(String, String)>,
}

/// A connection to one of the endpoints, used by a single command.
#[derive(Clone)]
pub struct Conn {
    pub channel: AuthChannel,
}

impl Conn {
    /// Connects to the first endpoint that answers, cycling through all of them until `deadline`,
    /// then authenticates if `--user` was given (a failure ends the command with exit code 2,
    /// as clientv3.New's error does in etcdctl).
    pub async fn connect(
        endpoints: &[String],
        dial: &Dial,
        deadline: Instant,
    ) -> Result<Conn, CliError> {
        if endpoints.is_empty() {
            return Err(CliError::bad_args("no endpoints given"));
        }
        // The scheme of the first endpoint decides TLS for all (clientv3 dials them as one).
        let tls = dial.tls.for_endpoint(endpoints[0].trim())?;
        // With credentials, etcdctl connects and authenticates in clientv3.New, bounded by the
        // dial timeout alone, and a failure there exits with code 2.
        let (deadline, code) = match dial.auth {
            Some(_) => (Instant::now() + dial.dial_timeout, EXIT_BAD_CONNECTION),
            None => (deadline, crate::error::EXIT_ERROR),
        };
        let timed_out = || CliError::new(code, "context deadline exceeded");
        let channel = loop {
            if let Some(c) = Self::dial_any(endpoints, dial, &tls, deadline).await? {
                break c;
            }
            let pause = Duration::from_millis(100);
            if Instant::now() + pause >= deadline {
                tokio::time::sleep_until(deadline).await;
                return Err(timed_out());
            }
            tokio::time::sleep(pause).await;
        };
        let creds = dial
            .auth
            .as_ref()
            .map(|(u, p)| Credentials::new(u.clone(), p.clone()));
        if let Some(c) = &creds {
            match tokio::time::timeout_at(deadline, c.authenticate(channel.clone())).await {
                Ok(Ok(())) => {}
                Ok(Err(s)) => return Err(CliError::new(EXIT_BAD_CONNECTION, status_message(&s))),
                Err(_) => {
                    return Err(CliError::new(
                        EXIT_BAD_CONNECTION,
                        "context deadline exceeded",
                    ))
                }
            }
        }
        Ok(Conn {
            channel: AuthChannel::new(channel, creds),
        })
    }

    /// One pass over the endpoints: the first channel that connects before `deadline`.
    async fn dial_any(
        endpoints: &[String],
        dial: &Dial,
        tls: &Option<Arc<rustls::ClientConfig>>,
        deadline: Instant,
    ) -> Result<Option<Channel>, CliError> {
        for ep in endpoints {
            let now = Instant::now();
            if now >= deadline {
                return Err(CliError::deadline());
            }
            let url = endpoint_url(ep.trim(), tls.is_some())?;
            let endpoint = match Endpoint::from_shared(url) {
                Ok(e) => e,
                Err(e) => return Err(CliError::bad_args(e.to_string())),
            };
            let timeout = dial.dial_timeout.min(deadline - now);
            let endpoint = endpoint.connect_timeout(timeout);
            let connected = match tls {
                None => {
                    let connector = tower::service_fn(crate::tls::dial_plain);
                    tokio::time::timeout(timeout, endpoint.connect_with_connector(connector)).await
                }
                Some(cfg) => {
                    let cfg = cfg.clone();
                    let connector =
                        tower::service_fn(move |uri| crate::tls::dial(cfg.clone(), uri));
                    tokio::time::timeout(timeout, endpoint.connect_with_connector(connector)).await
                }
            };
            if let Ok(Ok(channel)) = connected {
                return Ok(Some(channel));
            }
        }
        Ok(None)
    }

    pub fn auth(&self) -> kvd::proto::etcdserverpb::auth_client::AuthClient<AuthChannel> {
        kvd::proto::etcdserverpb::auth_client::AuthClient::new(self.channel.clone())
            .max_decoding_message_size(i32::MAX as usize)
    }

    pub fn kv(&self) -> KvClient<AuthChannel> {
        KvClient::new(self.channel.clone()).max_decoding_message_size(i32::MAX as usize)
    }

    pub fn lease(&self) -> kvd::proto::etcdserverpb::lease_client::LeaseClient<AuthChannel> {
        kvd::proto::etcdserverpb::lease_client::LeaseClient::new(self.channel.clone())
            .max_decoding_message_size(i32::MAX as usize)
    }

    pub fn cluster(&self) -> ClusterClient<AuthChannel> {
        ClusterClient::new(self.channel.clone()).max_decoding_message_size(i32::MAX as usize)
    }

    pub fn maintenance(&self) -> MaintenanceClient<AuthChannel> {
        MaintenanceClient::new(self.channel.clone()).max_decoding_message_size(i32::MAX as usize)
    }
}

/// Rejects requests larger than clientv3 would send, with grpc-go's client-side message.
pub fn check_send_size<M: prost::Message>(m: &M) -> Result<(), CliError> {
    let n = m.encoded_len();
    if n > MAX_SEND_MSG_SIZE {
        return Err(CliError::new(
            crate::error::EXIT_ERROR,
            format!(
                "rpc error: code = ResourceExhausted desc = trying to send message larger than max ({n} vs. {MAX_SEND_MSG_SIZE})"
            ),
        ));
    }
    Ok(())
}

/// Runs `fut` so that it fails with `context deadline exceeded` at `deadline`.
pub async fn with_deadline<T, F>(deadline: Instant, fut: F) -> Result<T, CliError>
where
    F: std::future::Future<Output = Result<T, CliError>>,
{
    match tokio::time::timeout_at(deadline, fut).await {
        Ok(r) => r,
        Err(_) => Err(CliError::deadline()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            endpoint_url("127.0.0.1:2379", false).unwrap(),
            "http://127.0.0.1:2379"
        );
        assert_eq!(endpoint_url("http://a:1", false).unwrap(), "http://a:1");
        assert_eq!(endpoint_url("https://a:1", true).unwrap(), "https://a:1");
        assert_eq!(endpoint_url("a:1", true).unwrap(), "https://a:1");
        assert!(endpoint_url("unix://a", false).is_err());
    }
}
