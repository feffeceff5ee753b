//! One module per etcdctl command. Each returns the process exit code, or an error that
//! `main` prints as `Error: <message>`.
mod alarm;
mod check_disk;
mod check_perf;
mod compaction;
mod defrag;
mod elect;
mod endpoint;
mod kv;
mod lease;
mod lock;
mod member;
mod session;
mod snapshot;
mod txn;
mod watch;

use std::io::Write;

use tokio::time::Instant;

use crate::cli::{
    AlarmCommand, CheckCommand, Cli, Command, EndpointCommand, GlobalArgs, LeaseCommand,
    MemberCommand, SnapshotCommand,
};
use crate::client::Conn;
use crate::error::CliError;
use crate::output::{Format, Output, Printer};

/// The emulated etcdctl version printed by `version`.
pub const ETCDCTL_VERSION: &str = "3.4.23";
pub const API_VERSION: &str = "3.4";

/// Settings shared by all commands.
pub struct Ctx {
    pub global: GlobalArgs,
    pub printer: Printer,
}

impl Ctx {
    /// The deadline of one request (etcdctl's `commandCtx`): connecting counts against it.
    pub fn deadline(&self) -> Instant {
        Instant::now() + self.global.command_timeout
    }

    /// Connects to the configured endpoints.
    pub async fn connect(&self, deadline: Instant) -> Result<Conn, CliError> {
        Conn::connect(&self.global.endpoints, self.global.dial_timeout, deadline).await
    }
}

/// Writes an output to stdout/stderr.
pub fn emit(o: &Output) {
    if !o.stdout.is_empty() {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(&o.stdout);
        let _ = out.flush();
    }
    if !o.stderr.is_empty() {
        let mut err = std::io::stderr().lock();
        let _ = err.write_all(&o.stderr);
        let _ = err.flush();
    }
}

pub async fn run(cli: Cli) -> Result<i32, CliError> {
    let format = Format::parse(&cli.global.write_out)?;
    let ctx = Ctx {
        printer: Printer::new(format, cli.global.hex),
        global: cli.global,
    };
    match cli.command {
        Command::Put(a) => kv::put(&ctx, a).await,
        Command::Get(a) => kv::get(&ctx, a).await,
        Command::Del(a) => kv::del(&ctx, a).await,
        Command::Txn(a) => txn::txn(&ctx, a).await,
        Command::Compaction(a) => compaction::compaction(&ctx, a).await,
        Command::Defrag(a) => defrag::defrag(&ctx, a).await,
        Command::Endpoint(e) => match e.command {
            EndpointCommand::Status(a) => endpoint::status(&ctx, e.cluster, a).await,
            EndpointCommand::Health => endpoint::health(&ctx, e.cluster).await,
            EndpointCommand::Hashkv(a) => endpoint::hashkv(&ctx, e.cluster, a).await,
        },
        Command::Alarm(a) => match a.command {
            AlarmCommand::List(a) => alarm::list(&ctx, a).await,
            AlarmCommand::Disarm(a) => alarm::disarm(&ctx, a).await,
        },
        Command::Member(m) => match m.command {
            MemberCommand::List => member::list(&ctx).await,
            MemberCommand::Add(a) => member::add(&ctx, a).await,
            MemberCommand::Remove(a) => member::remove(&ctx, a).await,
            MemberCommand::Update(a) => member::update(&ctx, a).await,
            MemberCommand::Promote(a) => member::promote(&ctx, a).await,
        },
        Command::Watch(a) => watch::watch(&ctx, a).await,
        Command::Lease(l) => match l.command {
            LeaseCommand::Grant(a) => lease::grant(&ctx, a).await,
            LeaseCommand::Revoke(a) => lease::revoke(&ctx, a).await,
            LeaseCommand::TimeToLive(a) => lease::time_to_live(&ctx, a).await,
            LeaseCommand::List => lease::list(&ctx).await,
            LeaseCommand::KeepAlive(a) => lease::keep_alive(&ctx, a).await,
        },
        Command::MoveLeader(a) => member::move_leader(&ctx, a).await,
        Command::Snapshot(s) => match s.command {
            SnapshotCommand::Save(a) => snapshot::save(&ctx, a).await,
            SnapshotCommand::Restore(a) => snapshot::restore(&ctx, a),
            SnapshotCommand::Status(a) => snapshot::status(&ctx, a),
        },
        Command::Lock(a) => lock::lock(&ctx, a).await,
        Command::Elect(a) => elect::elect(&ctx, a).await,
        Command::Check(c) => match c.command {
            CheckCommand::Perf(a) => check_perf::perf(&ctx, a).await,
            CheckCommand::Disk(a) => check_disk::disk(&ctx, a).await,
        },
        Command::Version => {
            println!("etcdctl version: {ETCDCTL_VERSION}");
            println!("API version: {API_VERSION}");
            Ok(0)
        }
    }
}
