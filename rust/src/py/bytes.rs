//! Large results handed to Python as `bytes` without holding two copies.

use pyo3::exceptions::PyMemoryError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// Bytes copied at a time, from the end, before the source shrinks.
const PIECE: usize = 4 << 20;

/// `data` as a Python `bytes`, moved rather than copied whole: the `bytes`
/// is allocated untouched (its pages cost nothing until written), then filled
/// from the end a piece at a time while `data` is cut and shrunk behind each
/// piece, so the process holds about one copy at any moment (a 16 MiB pack, a
/// 150 MB manifest at a million files), not two. The GIL is held for the copy.
pub fn moved_into_bytes(py: Python<'_>, mut data: Vec<u8>) -> PyResult<Bound<'_, PyBytes>> {
    if data.len() <= PIECE {
        return Ok(PyBytes::new(py, &data));
    }
    let (bytes, out) = uninit_bytes(py, data.len())?;
    let mut end = data.len();
    while end > 0 {
        let start = end.saturating_sub(PIECE);
        // SAFETY: `out` is the buffer of `bytes`, `data.len()` bytes long,
        // and `start..end` lies within both.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr().add(start), out.add(start), end - start);
        }
        data.truncate(start);
        data.shrink_to_fit();
        end = start;
    }
    Ok(bytes)
}

/// A new `bytes` of `len` bytes left uninitialised (and so untouched), and
/// its buffer. The caller must write every byte before Python code sees it.
pub fn uninit_bytes(py: Python<'_>, len: usize) -> PyResult<(Bound<'_, PyBytes>, *mut u8)> {
    let size = ffi::Py_ssize_t::try_from(len).map_err(|_| PyMemoryError::new_err(len))?;
    // SAFETY: a NULL source asks CPython for an uninitialised bytes object;
    // the new reference is owned by the Bound, and its buffer lives as long.
    unsafe {
        let object = ffi::PyBytes_FromStringAndSize(std::ptr::null(), size);
        let bytes = Bound::from_owned_ptr_or_err(py, object)?.downcast_into_unchecked::<PyBytes>();
        Ok((bytes, ffi::PyBytes_AsString(object).cast::<u8>()))
    }
}
