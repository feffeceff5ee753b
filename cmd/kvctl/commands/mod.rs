//! One module per etcdctl command. Each returns the process exit code, or an error that
//! `main` prints as `Error: <message>`.
mod alarm;
mod auth;
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
mod mirror;
mod role;
mod session;
mod snapshot;
mod txn;
mod user;
mod watch;

use std::io::Write;

use tokio::time::Instant;

use crate::cli::{
    AlarmCommand, AuthCommand, CheckCommand, Cli, Command, EndpointCommand, GlobalArgs,
    LeaseCommand, MemberCommand, RoleCommand, SnapshotCommand, UserCommand,
};
use std::sync::OnceLock;

use crate::client::{Conn, Dial};
use crate::error::CliError;
use crate::output::{Format, Output, Printer};
use crate::tls::TlsSettings;

/// The emulated etcdctl version printed by `version`.
pub const ETCDCTL_VERSION: &str = "3.4.23";
pub const API_VERSION: &str = "3.4";

/// Settings shared by all commands.
pub struct Ctx {
    pub global: GlobalArgs,
    pub printer: Printer,
    /// Built on first use, as etcdctl builds its client config only once a command connects
    /// (so argument errors come before a password prompt).
    dial: OnceLock<Dial>,
}

impl Ctx {
    /// The deadline of one request (etcdctl's `commandCtx`): connecting counts against it.
    pub fn deadline(&self) -> Instant {
        Instant::now() + self.global.command_timeout
    }

    /// The connection settings: TLS from the flags, and `--user`'s credentials (prompting
    /// for the password when `--user` has none).
    pub fn dial(&self) -> Result<&Dial, CliError> {
        if let Some(d) = self.dial.get() {
            return Ok(d);
        }
        let g = &self.global;
        let tls = TlsSettings::from_args(g)?;
        // clientv3 authenticates only with both a name and a password.
        let auth = crate::password::credentials(&g.user, &g.password)?
            .filter(|(u, p)| !u.is_empty() && !p.is_empty());
        let d = Dial {
            dial_timeout: g.dial_timeout,
            tls,
            auth,
        };
        Ok(self.dial.get_or_init(|| d))
    }

    /// Connects to the configured endpoints.
    pub async fn connect(&self, deadline: Instant) -> Result<Conn, CliError> {
        Conn::connect(&self.global.endpoints, self.dial()?, deadline).await
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
        dial: OnceLock::new(),
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
            EndpointCommand::Diagnose => endpoint::diagnose(&ctx).await,
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
            MemberCommand::Replace(a) => member::replace(&ctx, a).await,
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
        Command::MakeMirror(a) => mirror::make_mirror(&ctx, a).await,
        Command::Check(c) => match c.command {
            CheckCommand::Perf(a) => check_perf::perf(&ctx, a).await,
            CheckCommand::Disk(a) => check_disk::disk(&ctx, a).await,
        },
        Command::Auth(a) => match a.command {
            AuthCommand::Enable(a) => auth::enable(&ctx, a).await,
            AuthCommand::Disable(a) => auth::disable(&ctx, a).await,
        },
        Command::User(u) => match u.command {
            UserCommand::Add(a) => user::add(&ctx, a).await,
            UserCommand::Delete(a) => user::delete(&ctx, a).await,
            UserCommand::Get(a) => user::get(&ctx, a).await,
            UserCommand::List(a) => user::list(&ctx, a).await,
            UserCommand::Passwd(a) => user::passwd(&ctx, a).await,
            UserCommand::GrantRole(a) => user::grant_role(&ctx, a).await,
            UserCommand::RevokeRole(a) => user::revoke_role(&ctx, a).await,
        },
        Command::Role(r) => match r.command {
            RoleCommand::Add(a) => role::add(&ctx, a).await,
            RoleCommand::Delete(a) => role::delete(&ctx, a).await,
            RoleCommand::Get(a) => role::get(&ctx, a).await,
            RoleCommand::List(a) => role::list(&ctx, a).await,
            RoleCommand::GrantPermission(a) => role::grant_permission(&ctx, a).await,
            RoleCommand::RevokePermission(a) => role::revoke_permission(&ctx, a).await,
        },
        Command::Version(a) => {
            println!("etcdctl version: {ETCDCTL_VERSION}");
            println!("API version: {API_VERSION}");
            // Only on request: scripts written for etcdctl read these lines, and the
            // etcdctl differential test compares them byte for byte.
            if a.kvd {
                println!("kvd version: {}", kvd::server::version::long());
            }
            Ok(0)
        }
    }
}
