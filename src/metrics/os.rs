//! The descriptor figures etcd exports as `os_fd_used` and `os_fd_limit`, read from `/proc`
//! (0 where it is not mounted).

/// Open file descriptors of this process.
pub fn fd_used() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64)
}

/// The soft limit on open file descriptors.
pub fn fd_limit() -> u64 {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|s| soft_limit(&s))
        .unwrap_or(0)
}

/// The soft limit on the address space, `u64::MAX` when unlimited (Go's client reports
/// unlimited the same way, as 1.8446744073709552e+19).
pub fn address_space_limit() -> u64 {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|s| limit_of(&s, "Max address space"))
        .unwrap_or(u64::MAX)
}

/// The soft limit in `/proc/self/limits`' "Max open files" line.
fn soft_limit(limits: &str) -> Option<u64> {
    limit_of(limits, "Max open files")
}

/// The soft limit of the line named `name`; `unlimited` is `u64::MAX`.
fn limit_of(limits: &str, name: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with(name))?;
    match line[name.len()..].split_whitespace().next()? {
        "unlimited" => Some(u64::MAX),
        n => n.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_soft_limit_is_read_from_the_limits_table() {
        let t = "Limit                     Soft Limit           Hard Limit           Units\n\
                 Max processes             95671                95671                processes\n\
                 Max open files            1024                 524288               files\n";
        assert_eq!(super::soft_limit(t), Some(1024));
        assert_eq!(super::soft_limit("nothing"), None);
        let t = "Max address space         unlimited            unlimited            bytes\n";
        assert_eq!(super::limit_of(t, "Max address space"), Some(u64::MAX));
        let t = "Max address space         unlimited            unlimited            bytes\n";
        assert_eq!(super::limit_of(t, "Max address space"), Some(u64::MAX));
    }
}
