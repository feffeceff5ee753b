//! Authentication and role-based access control with etcd's semantics (etcd's `auth`
//! package): the replicated auth store, key-range permissions and simple tokens.
//!
//! Invariants:
//! - The store changes only by applying `AuthRequest` log entries, so every member holds the
//!   same users, roles, enabled flag and revision at the same log index.
//! - Reads are checked where they are served (the server layer), writes where they are applied
//!   (the state machine, with the identity carried in the entry), as etcd does.
//! - No clear password crosses this module: it holds bcrypt hashes made by the proposer.

pub mod error;
pub mod etcd_buckets;
pub mod jwt_es512;
pub mod jwt_pem;
pub mod perms;
pub mod store;
pub mod token;
pub mod token_jwt;

pub use error::AuthError;
pub use store::{AuthInfo, AuthStore, KeyCheck, META_AUTH_PREFIX, ROOT};
