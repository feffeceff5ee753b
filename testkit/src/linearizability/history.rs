//! What a client records about one operation, and a thread-safe recorder for many clients.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// A key's value and the revision of the write that set it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Kv {
    pub value: Vec<u8>,
    pub mod_revision: i64,
}

/// What a compare-and-set compares (etcd's `Compare` on one key, `EQUAL`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Compare {
    /// value == X; always false when the key is absent (as etcd).
    Value(Vec<u8>),
    /// mod_revision == X; an absent key has mod_revision 0 (as etcd).
    ModRevision(i64),
}

/// The request, on the operation's key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    Put {
        value: Vec<u8>,
    },
    Get,
    Delete,
    /// `Txn(If compare Then Put(value) Else Get)`.
    Cas {
        compare: Compare,
        value: Vec<u8>,
    },
}

impl Input {
    pub fn is_write(&self) -> bool {
        !matches!(self, Input::Get)
    }
}

/// The response of an operation that returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// The header revision: the put's mod_revision.
    Put {
        revision: i64,
    },
    Get {
        kv: Option<Kv>,
    },
    /// `revision` (the header revision) is the delete's revision when `deleted`.
    Delete {
        deleted: bool,
        revision: i64,
    },
    /// `revision` is the put's mod_revision when `succeeded`; `current` is the Else branch's
    /// read when not.
    Cas {
        succeeded: bool,
        revision: i64,
        current: Option<Kv>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok(Output),
    /// Definitely no effect.
    Failed,
    /// Maybe applied, at any time after the call.
    Unknown,
}

/// Nanoseconds on one monotonic clock.
pub type Time = u64;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operation {
    pub client: u64,
    pub key: Vec<u8>,
    pub input: Input,
    pub call: Time,
    /// Meaningful only for `Outcome::Ok`.
    pub ret: Time,
    pub outcome: Outcome,
}

fn show(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn show_kv(kv: &Option<Kv>) -> String {
    match kv {
        Some(kv) => format!("{:?}@{}", show(&kv.value), kv.mod_revision),
        None => "<absent>".into(),
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |t: Time| t as f64 / 1e6;
        write!(f, "client {} [{:.3} ms, ", self.client, ms(self.call))?;
        match self.outcome {
            Outcome::Ok(_) => write!(f, "{:.3} ms] ", ms(self.ret))?,
            _ => write!(f, "inf] ")?,
        }
        match &self.input {
            Input::Put { value } => write!(f, "put {:?}", show(value))?,
            Input::Get => write!(f, "get")?,
            Input::Delete => write!(f, "delete")?,
            Input::Cas { compare, value } => match compare {
                Compare::Value(v) => write!(f, "cas(value=={:?}) put {:?}", show(v), show(value))?,
                Compare::ModRevision(r) => write!(f, "cas(mod=={r}) put {:?}", show(value))?,
            },
        }
        match &self.outcome {
            Outcome::Failed => write!(f, " -> failed"),
            Outcome::Unknown => write!(f, " -> unknown"),
            Outcome::Ok(o) => match o {
                Output::Put { revision } => write!(f, " -> ok@{revision}"),
                Output::Get { kv } => write!(f, " -> {}", show_kv(kv)),
                Output::Delete { deleted, revision } => {
                    write!(f, " -> deleted={deleted}@{revision}")
                }
                Output::Cas {
                    succeeded: true,
                    revision,
                    ..
                } => write!(f, " -> succeeded@{revision}"),
                Output::Cas { current, .. } => write!(f, " -> failed, read {}", show_kv(current)),
            },
        }
    }
}

/// Collects operations from concurrent clients against one clock.
#[derive(Clone)]
pub struct Recorder {
    start: Instant,
    ops: Arc<Mutex<Vec<Operation>>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            start: Instant::now(),
            ops: Arc::default(),
        }
    }
}

impl Recorder {
    /// Now, on the history's clock.
    pub fn now(&self) -> Time {
        self.start.elapsed().as_nanos() as Time
    }

    /// Records an operation called at `call` that just ended with `outcome`.
    pub fn record(&self, client: u64, key: &[u8], input: Input, call: Time, outcome: Outcome) {
        let ret = self.now();
        self.ops.lock().unwrap().push(Operation {
            client,
            key: key.to_vec(),
            input,
            call,
            ret,
            outcome,
        });
    }

    pub fn operations(&self) -> Vec<Operation> {
        self.ops.lock().unwrap().clone()
    }
}
