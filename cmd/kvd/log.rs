//! The server's log output: plain text (coloured only on a terminal) or etcd's JSON lines.
//!
//! JSON lines carry zap's keys as etcd writes them (`level`, `ts`, `caller`, `msg`, then the
//! event's fields), so log pipelines built for etcd read kvd's unchanged.

use std::fmt::{self, Write as _};
use std::io::IsTerminal;
use std::time::{SystemTime, UNIX_EPOCH};

use kvd::server::config::{LogConfig, LogFormat, LogOutput};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

/// Noisy dependencies, down to what an operator acts on. openraft warns on every failed RPC
/// (thousands a second while a peer is down); kvd's own `raft::net::links` reports peers instead.
/// rustls warns from its ClientHello parser on every connection whose client sends an IP
/// address as SNI (Node's etcd3 does), which it then ignores as RFC 6066 says; a handshake that
/// fails still reaches the log through kvd's acceptor ("rejected connection"), and rustls'
/// other warnings stay.
const QUIET: &str =
    "openraft=error,sled=warn,h2=warn,tower=warn,hyper=warn,rustls::msgs::handshake=error";

/// Installs the global subscriber. `KVD_LOG` (an EnvFilter) replaces the level filter.
pub fn init(cfg: &LogConfig) {
    let filter = EnvFilter::try_from_env("KVD_LOG")
        .unwrap_or_else(|_| EnvFilter::new(format!("{},{QUIET}", cfg.level)));
    let (writer, tty) = match cfg.output {
        LogOutput::Stderr => (
            BoxMakeWriter::new(std::io::stderr),
            std::io::stderr().is_terminal(),
        ),
        LogOutput::Stdout => (
            BoxMakeWriter::new(std::io::stdout),
            std::io::stdout().is_terminal(),
        ),
    };
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(tty);
    match cfg.format {
        LogFormat::Text => b.init(),
        LogFormat::Json => b.event_format(ZapJson).init(),
    }
}

/// zap's production encoder, as etcd configures it.
struct ZapJson;

impl<S, N> FormatEvent<S, N> for ZapJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        ev: &Event<'_>,
    ) -> fmt::Result {
        let meta = ev.metadata();
        let mut f = Fields::default();
        ev.record(&mut f);
        let caller = match (meta.file(), meta.line()) {
            (Some(file), Some(line)) => format!("{file}:{line}"),
            _ => meta.target().to_string(),
        };
        let mut line = String::with_capacity(160);
        line.push_str("{\"level\":");
        push_json(&mut line, &meta.level().as_str().to_ascii_lowercase());
        line.push_str(",\"ts\":");
        push_json(&mut line, &rfc3339_utc(SystemTime::now()));
        line.push_str(",\"caller\":");
        push_json(&mut line, &caller);
        line.push_str(",\"msg\":");
        push_json(&mut line, &f.msg);
        for (k, v) in &f.rest {
            line.push(',');
            push_json(&mut line, k);
            line.push(':');
            line.push_str(v);
        }
        line.push('}');
        writeln!(w, "{line}")
    }
}

fn push_json(out: &mut String, s: &str) {
    out.push_str(&serde_json::to_string(s).expect("a string serializes"));
}

/// The event's message and its other fields, each value already JSON.
#[derive(Default)]
struct Fields {
    msg: String,
    rest: Vec<(&'static str, String)>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.msg = value.to_string();
        } else {
            let mut v = String::new();
            push_json(&mut v, value);
            self.rest.push((field.name(), v));
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.rest.push((field.name(), value.to_string()));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.rest.push((field.name(), value.to_string()));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.rest.push((field.name(), value.to_string()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let mut s = String::new();
        let _ = write!(s, "{value:?}");
        self.record_str(field, &s);
    }
}

/// `2006-01-02T15:04:05.000000Z`.
fn rfc3339_utc(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_micros()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamps_are_utc_rfc3339() {
        let t = UNIX_EPOCH + Duration::from_micros(1_764_565_200_123_456);
        assert_eq!(rfc3339_utc(t), "2025-12-01T05:00:00.123456Z");
        assert_eq!(rfc3339_utc(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339_utc(leap), "2000-02-29T00:00:00.000000Z");
    }
}
