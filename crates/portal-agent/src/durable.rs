//! What the agent's state files share: they are written whole or not at
//! all, and their times are RFC 3339 with nanoseconds. Used by the shim,
//! the runtime, the image store and the pod network, so none of them has
//! to reach into another for it.

use std::path::Path;

/// Now in RFC 3339 with nanoseconds.
pub(crate) fn now() -> String {
    jiff::Timestamp::now().to_string()
}

/// Writes a file whole or not at all (write to a temporary beside it, then
/// rename); concurrent writers never share a temporary.
pub(crate) fn write_atomic(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let temporary = path.with_file_name(format!(".{name}.{}.{n}.tmp", std::process::id()));
    std::fs::write(&temporary, contents)?;
    std::fs::rename(&temporary, path)
}
