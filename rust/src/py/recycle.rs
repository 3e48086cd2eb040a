//! Manifest and digest buffers kept for the next directed scan.
//!
//! A scan the change journal directs writes a whole new manifest (the
//! parent's rows with the changed ones spliced in). At a million files a new
//! ~180 MB `bytes` costs ~46,000 page faults before it can be written, and
//! freeing the manifest it replaces costs about half as much again: most of
//! a capture after a few edits. So the `bytes` those scans hand to Python are
//! kept here too, with room to grow, and one that nobody else holds any more
//! (Python let go of it: the only reference left is ours) becomes the next
//! directed scan's buffer, its pages still resident. Nothing can observe it
//! then, so giving it new contents and a new length is invisible. The
//! scan's sorted blob digests (~32 MB at a million files) are kept likewise.
//!
//! At most [`KEPT`] are kept; one nobody holds stays only until the next
//! scan asks for a buffer (a full scan lets the large ones go first). Where
//! the interpreter's `bytes` layout is not the one checked in
//! [`hash_slot_known`], nothing is kept.

use std::sync::{Mutex, OnceLock, PoisonError};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::bytes::uninit_bytes;

/// Buffers kept at most for each purpose (a daemon's workspace keeps two:
/// the parent's and the one before, which the next directed scan reuses).
const KEPT: usize = 4;

/// Kept buffers from this size on go before a full scan (smaller ones wait
/// for the next directed scan, which reuses one or lets them go).
const RELEASED_BEFORE_FULL_SCANS: usize = 16 << 20;

/// The least room a kept buffer leaves for its manifest to grow.
const ROOM_MIN: usize = 64 << 10;

/// What a kept buffer holds: each is reused only for its own kind.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Purpose {
    /// A directed scan's manifest.
    Manifest,
    /// A directed scan's sorted blob digests.
    Digests,
}

struct Kept {
    object: Py<PyBytes>,
    capacity: usize,
    purpose: Purpose,
}

static BUFFERS: Mutex<Vec<Kept>> = Mutex::new(Vec::new());

/// The bytes allocated for a manifest of `len`: 1/256 more, at least 64 KiB.
fn capacity_for(len: usize) -> usize {
    len.saturating_add((len / 256).max(ROOM_MIN))
}

/// Nobody but this module holds it (the GIL is held: that cannot change).
fn unheld(_py: Python<'_>, kept: &Kept) -> bool {
    // SAFETY: a live object (our reference keeps it alive), read under the GIL.
    unsafe { ffi::Py_REFCNT(kept.object.as_ptr()) == 1 }
}

/// Whether a `bytes` keeps its cached hash in the word just before its data
/// (CPython's layout): a reused buffer must forget the hash of its old bytes.
/// Checked once on a probe: the word is -1 while unhashed, the hash after.
fn hash_slot_known(py: Python<'_>) -> bool {
    static KNOWN: OnceLock<bool> = OnceLock::new();
    *KNOWN.get_or_init(|| {
        let probe = PyBytes::new(py, b"checkpointd layout probe");
        // SAFETY: the probe's data is 8-byte aligned after its header's
        // words, and the word before it lies inside the object; both are
        // read under the GIL while `probe` keeps the object alive.
        unsafe {
            let data = ffi::PyBytes_AsString(probe.as_ptr());
            let slot = data.cast::<ffi::Py_hash_t>().sub(1);
            if (data as usize) % std::mem::align_of::<ffi::Py_hash_t>() != 0 || *slot != -1 {
                return false;
            }
            let hash = ffi::PyObject_Hash(probe.as_ptr());
            hash != -1 && *slot == hash
        }
    })
}

/// Give the `bytes` at `object` the length `len` (at most its capacity) and
/// no cached hash; returns its data.
///
/// # Safety
/// `object` is a `bytes` allocated with at least `len` bytes of data, that
/// no other code holds; the GIL is held and [`hash_slot_known`] is true.
unsafe fn reshape(object: *mut ffi::PyObject, len: usize) -> *mut u8 {
    let data = ffi::PyBytes_AsString(object).cast::<u8>();
    (*object.cast::<ffi::PyVarObject>()).ob_size = len as ffi::Py_ssize_t;
    *data.add(len) = 0; // (a bytes ends with a NUL past its length)
    *data.cast::<ffi::Py_hash_t>().sub(1) = -1;
    data
}

/// A `bytes` of exactly `len` bytes for a manifest about to be written whole,
/// its data, and whether its pages are resident already (a kept one reused).
/// The caller writes every byte before Python code sees it.
pub fn whole_bytes(
    py: Python<'_>,
    len: usize,
    purpose: Purpose,
) -> PyResult<(Py<PyBytes>, *mut u8, bool)> {
    if !hash_slot_known(py) {
        let (object, data) = uninit_bytes(py, len)?;
        return Ok((object.unbind(), data, false));
    }
    let mut buffers = BUFFERS.lock().unwrap_or_else(PoisonError::into_inner);
    let mut unheld_now = take_unheld(py, &mut buffers, Some(purpose));
    let reuse = unheld_now
        .iter()
        .enumerate()
        .filter(|(_, kept)| kept.capacity >= len)
        .min_by_key(|(_, kept)| kept.capacity)
        .map(|(at, _)| at);
    if let Some(at) = reuse {
        let kept = unheld_now.swap_remove(at);
        // SAFETY: ours alone (unheld, under the GIL), `capacity` >= `len`.
        let data = unsafe { reshape(kept.object.as_ptr(), len) };
        let object = kept.object.clone_ref(py);
        buffers.push(kept);
        return Ok((object, data, true));
    }
    // (Every other one nobody holds goes before a new one is allocated.)
    drop(unheld_now);
    let capacity = capacity_for(len);
    let (object, _) = uninit_bytes(py, capacity)?;
    // SAFETY: new, seen by nobody, allocated with `capacity` >= `len` bytes.
    let data = unsafe { reshape(object.as_ptr(), len) };
    let object = object.unbind();
    if buffers
        .iter()
        .filter(|kept| kept.purpose == purpose)
        .count()
        < KEPT
    {
        buffers.push(Kept {
            object: object.clone_ref(py),
            capacity,
            purpose,
        });
    }
    Ok((object, data, false))
}

/// `bytes` equal to `data`, in a kept buffer when one fits (see [`whole_bytes`]).
pub fn copied_bytes(py: Python<'_>, data: &[u8], purpose: Purpose) -> PyResult<Py<PyBytes>> {
    let (object, out, _) = whole_bytes(py, data.len(), purpose)?;
    // SAFETY: `out` is the data of `object`, `data.len()` bytes, seen by no one yet.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), out, data.len()) };
    Ok(object)
}

/// Take the kept buffers nobody else holds (of `purpose`, or all) out of `buffers`.
fn take_unheld(py: Python<'_>, buffers: &mut Vec<Kept>, purpose: Option<Purpose>) -> Vec<Kept> {
    let (unheld_now, held): (Vec<Kept>, Vec<Kept>) = buffers.drain(..).partition(|kept| {
        purpose.map_or(true, |purpose| kept.purpose == purpose) && unheld(py, kept)
    });
    *buffers = held;
    unheld_now
}

/// Let go of every large kept buffer nobody else holds (before a full
/// scan, whose manifest grows while the entries it encodes are resident).
pub fn release_unheld(py: Python<'_>) {
    let mut buffers = BUFFERS.lock().unwrap_or_else(PoisonError::into_inner);
    let (large, small): (Vec<Kept>, Vec<Kept>) = take_unheld(py, &mut buffers, None)
        .into_iter()
        .partition(|kept| kept.capacity >= RELEASED_BEFORE_FULL_SCANS);
    buffers.extend(small);
    drop(buffers);
    drop(large);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_a_256th_and_at_least_64_kib() {
        assert_eq!(capacity_for(0), 64 << 10);
        assert_eq!(capacity_for(1 << 20), (1 << 20) + (64 << 10));
        assert_eq!(capacity_for(256 << 20), (256 << 20) + (1 << 20));
        assert_eq!(capacity_for(usize::MAX), usize::MAX);
    }
}
