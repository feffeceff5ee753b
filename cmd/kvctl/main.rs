//! kvctl: a command line client for kvd, compatible with etcdctl 3.4 (same commands, flags,
//! output formats and exit codes).
mod cli;
mod client;
mod commands;
mod error;
mod gofmt;
mod ops;
mod output;
mod password;
mod progress;
mod table;
mod tls;
mod token;
mod txn_parse;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::Parser;

use crate::error::EXIT_ERROR;

/// cobra's wording for command line errors, as far as it can be derived from clap's error.
fn usage_error(e: &clap::Error) -> String {
    let ctx = |k| match e.get(k) {
        Some(ContextValue::String(s)) => s.clone(),
        Some(ContextValue::Strings(v)) => v.join(" "),
        _ => String::new(),
    };
    match e.kind() {
        ErrorKind::UnknownArgument => {
            let arg = ctx(ContextKind::InvalidArg);
            match arg.strip_prefix('-') {
                Some(s) if !s.starts_with('-') => {
                    let c = s.chars().next().unwrap_or('-');
                    format!("unknown shorthand flag: '{c}' in {arg}")
                }
                _ => format!("unknown flag: {}", arg.split('=').next().unwrap_or(&arg)),
            }
        }
        ErrorKind::InvalidSubcommand => format!(
            "unknown command \"{}\" for \"etcdctl\"",
            ctx(ContextKind::InvalidSubcommand)
        ),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation => {
            let flag = ctx(ContextKind::InvalidArg);
            let flag = flag.split([' ', '[', '=']).next().unwrap_or_default();
            let mut msg = format!(
                "invalid argument \"{}\" for \"{flag}\" flag",
                ctx(ContextKind::InvalidValue)
            );
            // clap renders "invalid value 'V' for 'FLAG': REASON"; REASON is the Go-style text.
            let rendered = e.to_string();
            let first = rendered.lines().next().unwrap_or_default();
            if let Some((_, reason)) = first.split_once("': ") {
                msg.push_str(&format!(": {reason}"));
            }
            msg
        }
        _ => {
            let rendered = e.to_string();
            let first = rendered.lines().next().unwrap_or_default();
            first.strip_prefix("error: ").unwrap_or(first).to_string()
        }
    }
}

fn main() {
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => match e.kind() {
            ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            | ErrorKind::MissingSubcommand => {
                let _ = e.print();
                std::process::exit(0);
            }
            _ => {
                // cobra reports the error, then the usage (stdout; not reproduced), then the
                // error again.
                let msg = usage_error(&e);
                if e.kind() == ErrorKind::InvalidSubcommand {
                    eprint!("Error: {msg}\nRun 'etcdctl --help' for usage.\nError: {msg}\n");
                } else {
                    eprint!("Error: {msg}\n\nError: {msg}\n");
                }
                std::process::exit(EXIT_ERROR);
            }
        },
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("Error: {e}");
            std::process::exit(EXIT_ERROR);
        }
    };
    let code = match runtime.block_on(commands::run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("Error: {}", e.msg);
            e.code
        }
    };
    runtime.shutdown_background();
    std::process::exit(code);
}
