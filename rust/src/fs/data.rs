//! File data: whole and positioned writes, holes kept as holes, extents
//! found with `SEEK_DATA`, and copies between fds.

use std::io;
use std::os::fd::RawFd;

use super::check;

/// A read or write system call's result, called again while it fails with
/// EINTR: the bytes it moved, or the error.
fn retried(mut call: impl FnMut() -> isize) -> io::Result<usize> {
    loop {
        let n = call();
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Write all of `data` (retrying short writes and EINTR).
pub fn write_all(fd: RawFd, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        // SAFETY: `data` is a live slice; write reads at most its length.
        let n = retried(|| unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) })?;
        if n == 0 {
            return Err(io::Error::from(io::ErrorKind::WriteZero));
        }
        data = &data[n..];
    }
    Ok(())
}

/// The size of the blocks [`write_sparse_at`] leaves unwritten when they
/// hold only zeros (a filesystem's usual block: smaller holes save nothing).
pub const HOLE_BLOCK: usize = 4096;

/// Write `data` at `offset` of `fd` as [`write_all`] would, except that the
/// part of each [`HOLE_BLOCK`]-aligned block of the file that `data` holds
/// is left unwritten when it is all zeros: in a file created empty it stays
/// a hole, which reads as zeros and takes no space (a stream's pieces may
/// cut a block anywhere). Returns whether a part was left out (the caller
/// then sets the file's length, [`set_len`], in case the last ones were).
pub fn write_sparse_at(fd: RawFd, offset: u64, data: &[u8]) -> io::Result<bool> {
    let mut skipped = false;
    let mut at = 0usize;
    while at < data.len() {
        // From `at` to the next block boundary of the file, or a whole block.
        let into_block = ((offset + at as u64) % HOLE_BLOCK as u64) as usize;
        let end = (at + HOLE_BLOCK - into_block).min(data.len());
        let block = &data[at..end];
        if all_zero(block) {
            skipped = true;
            at = end;
            continue;
        }
        // A run of blocks with data, written at once.
        let mut run_end = end;
        while run_end < data.len() {
            let next = (run_end + HOLE_BLOCK).min(data.len());
            if all_zero(&data[run_end..next]) {
                break;
            }
            run_end = next;
        }
        pwrite_all(fd, &data[at..run_end], offset + at as u64)?;
        at = run_end;
    }
    Ok(skipped)
}

/// Whether `bytes` are all zero (16 at a time; most data fails on the first).
fn all_zero(bytes: &[u8]) -> bool {
    let mut words = bytes.chunks_exact(16);
    let whole = words
        .by_ref()
        .all(|w| u128::from_ne_bytes(w.try_into().unwrap_or([1; 16])) == 0);
    whole && words.remainder().iter().all(|&b| b == 0)
}

/// `pread` into `buf` from `offset` until it is full or the file ends
/// (retrying short reads and EINTR); returns the bytes read.
pub fn read_full_at(fd: RawFd, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        let rest = &mut buf[got..];
        let at = (offset + got as u64) as libc::off_t;
        // SAFETY: `rest` is a live, writable slice; pread writes at most its length.
        let n = retried(|| unsafe { libc::pread(fd, rest.as_mut_ptr().cast(), rest.len(), at) })?;
        if n == 0 {
            break;
        }
        got += n;
    }
    Ok(got)
}

/// `pwrite` all of `data` at `offset` (retrying short writes and EINTR).
fn pwrite_all(fd: RawFd, mut data: &[u8], mut offset: u64) -> io::Result<()> {
    while !data.is_empty() {
        let at = offset as libc::off_t;
        // SAFETY: `data` is a live slice; pwrite reads at most its length.
        let n = retried(|| unsafe { libc::pwrite(fd, data.as_ptr().cast(), data.len(), at) })?;
        if n == 0 {
            return Err(io::Error::from(io::ErrorKind::WriteZero));
        }
        data = &data[n..];
        offset += n as u64;
    }
    Ok(())
}

/// `ftruncate`: the file's length becomes `len` (a hole where it grows).
pub fn set_len(fd: RawFd, len: u64) -> io::Result<()> {
    // SAFETY: valid fd.
    check(unsafe { libc::ftruncate(fd, len as libc::off_t) }).map(drop)
}

/// Where the data or the hole that `offset` of `fd` lies in ends: `lseek`
/// with SEEK_HOLE (`hole`) or SEEK_DATA. None past the last data (ENXIO).
pub fn seek_extent(fd: RawFd, offset: u64, hole: bool) -> io::Result<Option<u64>> {
    let whence = if hole {
        libc::SEEK_HOLE
    } else {
        libc::SEEK_DATA
    };
    // SAFETY: valid fd; lseek only moves the file's offset.
    let at = unsafe { libc::lseek(fd, offset as libc::off_t, whence) };
    if at < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENXIO) => Ok(None),
            _ => Err(e),
        };
    }
    Ok(Some(at as u64))
}

/// Copy all of `src` (from offset 0) into `dst`.
pub fn copy_fd(src: RawFd, dst: RawFd) -> io::Result<()> {
    loop {
        // SAFETY: valid fds; null offsets use (and advance) the file positions.
        let n = unsafe {
            libc::copy_file_range(
                src,
                std::ptr::null_mut(),
                dst,
                std::ptr::null_mut(),
                1 << 30,
                0,
            )
        };
        if n == 0 {
            return Ok(());
        }
        if n > 0 {
            continue;
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EXDEV)
            | Some(libc::ENOSYS)
            | Some(libc::EOPNOTSUPP)
            | Some(libc::EINVAL) => break,
            _ => return Err(e),
        }
    }
    let mut buf = vec![0u8; 1 << 20];
    loop {
        // SAFETY: `buf` is writable for its length.
        let n = unsafe { libc::read(src, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Ok(());
        }
        write_all(dst, &buf[..n as usize])?;
    }
}
