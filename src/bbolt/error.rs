//! The one error type of the bbolt module. Every way a file can be wrong has its own variant
//! or reason, so callers match on kinds, never on text.

/// Why a meta page was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MetaFault {
    #[error("the file ends before this meta page")]
    Missing,
    #[error("wrong magic number {0:#010x}")]
    Magic(u32),
    #[error("unsupported version {0} (only 2 is known)")]
    Version(u32),
    #[error("checksum mismatch")]
    Checksum,
    #[error("page size {0} is not a power of two in [512, 1 MiB]")]
    PageSize(u32),
    #[error("page type flags {0:#06x}, not a meta page")]
    NotMeta(u16),
    #[error("a page id in the meta page is out of range")]
    Bounds,
}

/// Why a branch, leaf or bucket page was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PageFault {
    #[error("page id is at or beyond the high-water mark")]
    OutOfBounds,
    #[error("{0} overflow pages reach beyond the high-water mark")]
    Overflow(u32),
    #[error("the page header names page {0}")]
    IdMismatch(u64),
    #[error("page type flags {0:#06x} where a branch or leaf page was expected")]
    WrongType(u16),
    #[error("a branch page with no elements")]
    EmptyBranch,
    #[error("element {0} lies outside its page")]
    ElementBounds(u16),
    #[error("keys are not in strictly ascending order")]
    KeyOrder,
    #[error("a bucket value is not a valid bucket header")]
    BucketValue,
    #[error("the tree is deeper than any real one: a cycle or corruption")]
    TooDeep,
    #[error("more pages read than the file holds: a cycle")]
    Cycle,
}

#[derive(Debug, thiserror::Error)]
pub enum BoltError {
    #[error("bbolt file i/o: {0}")]
    Io(#[from] std::io::Error),
    /// Neither meta page carries the bbolt magic number.
    #[error("not a bbolt database file")]
    NotBolt,
    /// Both meta pages carry the magic but neither validates.
    #[error("no valid meta page: meta 0: {meta0}; meta 1: {meta1}")]
    BadMeta { meta0: MetaFault, meta1: MetaFault },
    #[error("page {pgid}: {reason}")]
    BadPage { pgid: u64, reason: PageFault },
    /// The file is shorter than its meta page says (or than a meta page).
    #[error("bbolt file is truncated")]
    Truncated,
    /// The writer was given a key or bucket name not above the previous one.
    #[error("keys or bucket names out of order: each must be above the previous one")]
    Unsorted,
    #[error("no such bucket")]
    NoBucket,
    /// `Writer::put` before any `Writer::bucket`.
    #[error("put outside a bucket")]
    NoCurrentBucket,
    #[error("keys and bucket names must not be empty")]
    EmptyKey,
    #[error("key of {0} bytes is above bbolt's limit of 32768")]
    KeyTooLarge(usize),
    #[error("value of {0} bytes is above bbolt's limit of 2^31 - 2")]
    ValueTooLarge(usize),
}
