//! Writing staged data back to disk while staging still runs.

use std::os::fd::{AsRawFd, OwnedFd};

use crate::fs;

/// A thread that calls `syncfs` on the workspace's filesystem every
/// [`Writeback::EVERY`] until dropped, so the disk writes what staging made
/// while staging keeps the CPUs busy: the final `syncfs` of
/// [`Restore::finish`] then waits for the last interval's data only. (The
/// kernel itself would start only after `dirty_expire_centisecs`, 30 s, or once
/// a tenth of memory is dirty, so without this every byte of a restore waits
/// for the end.)
pub(super) struct Writeback {
    /// Dropping it wakes and ends the thread (its `recv_timeout` disconnects).
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writeback {
    pub(super) const EVERY: std::time::Duration = std::time::Duration::from_millis(300);
    /// Below this many bytes to write, the final sync alone is short.
    pub(super) const MIN_BYTES: u64 = 32 << 20;

    pub(super) fn start(fd: OwnedFd) -> Writeback {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("restore-writeback".into())
            .spawn(move || {
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(Writeback::EVERY)
                {
                    // An error here is the final sync's to report.
                    let _ = fs::syncfs(fd.as_raw_fd());
                }
            })
            .ok();
        Writeback {
            stop: Some(stop),
            thread,
        }
    }
}

impl Drop for Writeback {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
