//! The racy-clean reference time, read from the workspace filesystem's own
//! clock.

use std::io::{self};
use std::path::Path;

/// One timestamp tick of a filesystem whose clock reading had no sub-second
/// part (ext4 with 128-byte inodes, ext3, FAT, overlays on those: 1 s), and of
/// one with fine timestamps (the kernel's coarse clock advances per jiffy,
/// at most 10 ms).
const COARSE_TICK_NS: i64 = 1_000_000_000;

const FINE_TICK_NS: i64 = 10_000_000;

/// The racy-clean reference for a scan of the workspace whose root is
/// `root_fd`: the workspace filesystem's own clock (the mtime of an unnamed
/// file made in the root with `O_TMPFILE`, so nothing appears in the
/// workspace; else a reserved top-level `.checkpointd-clock-*` name, which
/// capture and restore never touch), minus one timestamp tick of that
/// filesystem. A cache entry is trusted only when its mtime is before this, so
/// a rewrite within the same tick as the scan is always hashed again.
///
/// A workspace we cannot write to falls back to `fallback_dir`'s clock minus a
/// whole coarse tick (its granularity is unknown to us).
pub fn racy_reference_ns(root_fd: std::os::fd::RawFd, fallback_dir: &Path) -> io::Result<i64> {
    match workspace_clock_ns(root_fd) {
        Ok(now) => {
            let tick = if now % 1_000_000_000 == 0 {
                COARSE_TICK_NS
            } else {
                FINE_TICK_NS
            };
            Ok(now - tick)
        }
        Err(_) => Ok(crate::fs::filesystem_now(fallback_dir)? - COARSE_TICK_NS),
    }
}

fn workspace_clock_ns(root_fd: std::os::fd::RawFd) -> io::Result<i64> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let open = |name: &std::ffi::CStr, flags: libc::c_int| -> io::Result<OwnedFd> {
        // SAFETY: a valid fd and C string; the result is owned below.
        let fd = unsafe { libc::openat(root_fd, name.as_ptr(), flags | libc::O_CLOEXEC, 0o600) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: just opened, owned here.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    };
    let unnamed = open(c".", libc::O_TMPFILE | libc::O_WRONLY);
    let file = match unnamed {
        Ok(file) => file,
        Err(_) => {
            static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let name =
                std::ffi::CString::new(format!(".checkpointd-clock-{}-{n}", std::process::id()))
                    .expect("no NUL");
            let file = open(
                &name,
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
            )?;
            // SAFETY: valid fd and C string.
            unsafe { libc::unlinkat(root_fd, name.as_ptr(), 0) };
            file
        }
    };
    use std::os::fd::AsRawFd;
    Ok(crate::fs::fstat(file.as_raw_fd())?.mtime_ns)
}
