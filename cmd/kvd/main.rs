//! kvd: the server binary. Parses etcd-compatible flags and runs a member until SIGINT/SIGTERM.
use clap::FromArgMatches;
use kvd::server::config::{self, Flags};
use kvd::server::config::{compat as config_compat, env as config_env, file as config_file};

mod alloc;
mod log;

fn main() {
    alloc::apply_defaults();
    let cli = config::command().get_matches();
    // etcd's --config-file replaces the command line and the environment.
    let file = cli.get_one::<std::path::PathBuf>("config_file").cloned();
    let (matches, env, file_note) = match &file {
        None => match config_env::check_env(&cli, std::env::vars_os()) {
            Ok(r) => (cli, r.unrecognized, None),
            Err(e) => {
                eprintln!("kvd: {e}");
                std::process::exit(1);
            }
        },
        Some(path) => match config_file::matches(path) {
            Ok((m, unknown)) => {
                let ignored = config_file::ignored(&cli, std::env::vars_os());
                (m, Vec::new(), Some((path, unknown, ignored)))
            }
            Err(e) => {
                eprintln!("kvd: {e}");
                std::process::exit(2);
            }
        },
    };
    let flags = Flags::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let cfg = match flags.validate() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("kvd: {e}");
            std::process::exit(2);
        }
    };
    log::init(&cfg.log);
    if let Some((path, unknown, ignored)) = file_note {
        tracing::info!(
            path = %path.display(),
            "loaded server configuration, other configuration command line flags and \
             environment variables will be ignored if provided"
        );
        if !ignored.is_empty() {
            tracing::warn!(
                "ignored because --config-file is given: {}",
                ignored.join(", ")
            );
        }
        for key in unknown {
            tracing::warn!(path = %path.display(), "unknown key {key:?} in the config file, ignored");
        }
    }
    for var in &env {
        // etcd 3.4's capnslog line, or etcd 3.5's zap message with the variable as a field.
        match cfg.log.format {
            config::LogFormat::Text => tracing::warn!("unrecognized environment variable {var}"),
            config::LogFormat::Json => tracing::warn!(
                "environment-variable" = var.as_str(),
                "unrecognized environment variable"
            ),
        }
    }
    // Flags and feature gates kvd accepts for etcd's command lines but does not act on: one
    // warning each, so an operator learns what had no effect.
    for f in config_compat::given(&matches) {
        tracing::warn!("{f}");
    }
    for w in &cfg.without_effect {
        tracing::warn!("{w}");
    }
    let rt = runtime(cfg.worker_threads);
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

/// The member's async runtime.
///
/// tokio's LIFO slot runs a task woken by the running task next, ahead of everything queued.
/// When an apply completes a batch of puts, each handler sends its response and wakes its
/// connection's task, which then runs at once and writes that one response. Without the slot
/// the handlers woken by the apply all run first, and each connection then writes every
/// ready response in one call (docs/decisions/0006-tokio-lifo-slot-off.md has the numbers).
/// The switch is behind `--cfg tokio_unstable`, which `.cargo/config.toml` sets; a
/// build without it keeps tokio's default. `KVD_TOKIO_LIFO_SLOT=on` keeps the slot, for A/B
/// runs.
fn runtime(worker_threads: usize) -> tokio::runtime::Runtime {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    // Decoding, validating and applying a txn nested as deep as etcd allows recurses a few
    // hundred levels (kvd::proto::depth bounds it); 8 MiB leaves a wide margin over tokio's
    // 2 MiB default. Untouched stack pages cost no memory.
    b.worker_threads(worker_threads)
        .thread_stack_size(8 << 20)
        .enable_all();
    let lifo = std::env::var("KVD_TOKIO_LIFO_SLOT").is_ok_and(|v| v == "on");
    #[cfg(tokio_unstable)]
    if !lifo {
        b.disable_lifo_slot();
    }
    let rt = b.build().expect("tokio runtime");
    if cfg!(not(tokio_unstable)) {
        tracing::warn!(
            "built without --cfg tokio_unstable (a RUSTFLAGS variable replaces \
             .cargo/config.toml): tokio's LIFO slot stays on and puts under load are slower; \
             see docs/operations.md"
        );
    } else if lifo {
        tracing::info!("KVD_TOKIO_LIFO_SLOT=on: tokio's LIFO slot stays on");
    }
    tracing::debug!(worker_threads, "runtime started");
    rt
}
