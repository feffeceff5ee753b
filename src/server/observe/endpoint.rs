//! The metrics HTTP listener: `GET /metrics` and the health endpoints (`/health`, `/livez`,
//! `/readyz`, see [`super::health`]), as etcd serves them on `--listen-metrics-urls`; and
//! `GET /metrics` for the client port.

use std::future::Future;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

use super::collect::{render, Scrape};

pub fn router(s: Scrape) -> Router {
    metrics_router(s.clone()).merge(super::health::router(s.node))
}

/// `GET /metrics` alone: the client port serves it too, as etcd's does (with the client
/// port's TLS and client certificates).
pub fn metrics_router(s: Scrape) -> Router {
    Router::new().route("/metrics", get(metrics)).with_state(s)
}

/// Serves until `shutdown` resolves.
pub async fn serve(
    l: TcpListener,
    s: Scrape,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(l, router(s))
        .with_graceful_shutdown(shutdown)
        .await
}

async fn metrics(State(s): State<Scrape>) -> impl IntoResponse {
    let _scrape = crate::metrics::Scrape::start();
    // The live records' bytes: a scan at most every 30 s, shared with Maintenance.Status.
    let in_use = crate::server::duties::defrag::size_in_use(&s.node).await;
    // Sizing the db dir walks the file system: keep it off the async workers.
    let body = tokio::task::spawn_blocking(move || render(&s, in_use))
        .await
        .unwrap_or_default();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
}
