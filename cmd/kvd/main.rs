//! kvd: the server binary. Parses etcd-compatible flags and runs a member until SIGINT/SIGTERM.
use clap::Parser;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let flags = kvd::config::Flags::parse();
    let cfg = match flags.validate() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("kvd: {e}");
            std::process::exit(2);
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("KVD_LOG").unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!(
            "{},openraft=warn,sled=warn,h2=warn,tower=warn,hyper=warn",
            cfg.log_level
        ))
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.worker_threads)
        .enable_all()
        .build()
        .expect("tokio runtime");
    tracing::debug!(worker_threads = cfg.worker_threads, "runtime started");
    let res = rt.block_on(kvd::server::run(cfg, async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("signal");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }));
    if let Err(e) = res {
        eprintln!("kvd: {e}");
        std::process::exit(1);
    }
}
