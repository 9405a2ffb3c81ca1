//! Support for the whole-system tests: private servers, worker processes, partitions.

pub(crate) mod partition;
pub(crate) mod servers;
pub(crate) mod worker;

use std::process::Command;

/// Whether this process runs as root (needed for iptables).
pub(crate) fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}
