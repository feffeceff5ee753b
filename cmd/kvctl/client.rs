//! Connections to the cluster. Like etcdctl, connecting is part of the command's deadline:
//! an unreachable cluster ends in `context deadline exceeded` after `--command-timeout`.
use std::time::Duration;

use kvd::proto::etcdserverpb::{
    cluster_client::ClusterClient, kv_client::KvClient, maintenance_client::MaintenanceClient,
};
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use crate::error::CliError;

/// etcd's clientv3 default limit for requests it sends (`MaxCallSendMsgSize`).
pub const MAX_SEND_MSG_SIZE: usize = 2 * 1024 * 1024;

/// Turns an etcdctl endpoint (`host:port` or an `http://` URL) into a URL tonic accepts.
/// TLS is not supported.
pub fn endpoint_url(ep: &str) -> Result<String, CliError> {
    if ep.starts_with("https://") || ep.starts_with("unixs://") {
        return Err(CliError::new(
            crate::error::EXIT_ERROR,
            format!("kvctl does not support TLS endpoints: {ep}"),
        ));
    }
    if ep.contains("://") {
        Ok(ep.to_string())
    } else {
        Ok(format!("http://{ep}"))
    }
}

/// A connection to one of the endpoints, used by a single command.
#[derive(Clone)]
pub struct Conn {
    pub channel: Channel,
}

impl Conn {
    /// Connects to the first endpoint that answers, cycling through all of them until `deadline`.
    pub async fn connect(
        endpoints: &[String],
        dial_timeout: Duration,
        deadline: Instant,
    ) -> Result<Conn, CliError> {
        if endpoints.is_empty() {
            return Err(CliError::bad_args("no endpoints given"));
        }
        loop {
            for ep in endpoints {
                let now = Instant::now();
                if now >= deadline {
                    return Err(CliError::deadline());
                }
                let url = endpoint_url(ep.trim())?;
                let endpoint = match Endpoint::from_shared(url) {
                    Ok(e) => e,
                    Err(e) => return Err(CliError::bad_args(e.to_string())),
                };
                let timeout = dial_timeout.min(deadline - now);
                let endpoint = endpoint.connect_timeout(timeout);
                if let Ok(Ok(channel)) = tokio::time::timeout(timeout, endpoint.connect()).await {
                    return Ok(Conn { channel });
                }
            }
            let pause = Duration::from_millis(100);
            if Instant::now() + pause >= deadline {
                tokio::time::sleep_until(deadline).await;
                return Err(CliError::deadline());
            }
            tokio::time::sleep(pause).await;
        }
    }

    pub fn kv(&self) -> KvClient<Channel> {
        KvClient::new(self.channel.clone()).max_decoding_message_size(i32::MAX as usize)
    }

    pub fn lease(&self) -> kvd::proto::etcdserverpb::lease_client::LeaseClient<Channel> {
        kvd::proto::etcdserverpb::lease_client::LeaseClient::new(self.channel.clone())
            .max_decoding_message_size(i32::MAX as usize)
    }

    pub fn cluster(&self) -> ClusterClient<Channel> {
        ClusterClient::new(self.channel.clone()).max_decoding_message_size(i32::MAX as usize)
    }

    pub fn maintenance(&self) -> MaintenanceClient<Channel> {
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
            endpoint_url("127.0.0.1:2379").unwrap(),
            "http://127.0.0.1:2379"
        );
        assert_eq!(endpoint_url("http://a:1").unwrap(), "http://a:1");
        assert!(endpoint_url("https://a:1").is_err());
    }
}
