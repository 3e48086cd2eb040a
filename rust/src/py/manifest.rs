//! The manifest as bytes (`crate::manifest`): counts, keys, deltas, without one
//! Python object per entry. Every function releases the GIL while it works.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::bytes::moved_into_bytes;
use crate::manifest::{self as core, ManifestError};

fn invalid(e: ManifestError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

fn flat(digests: &[[u8; 32]]) -> Vec<u8> {
    digests.concat()
}

/// Each of `lists` is a flat list of 32-byte digests (ValueError if not).
fn digest_lists(lists: &[&[u8]]) -> PyResult<()> {
    if lists.iter().any(|list| list.len() % 32 != 0) {
        return Err(PyValueError::new_err(
            "digest list length is not a multiple of 32",
        ));
    }
    Ok(())
}

fn split(bytes: &[u8]) -> PyResult<Vec<[u8; 32]>> {
    digest_lists(&[bytes])?;
    Ok(bytes
        .chunks_exact(32)
        .map(|c| c.try_into().expect("32 bytes"))
        .collect())
}

/// See `_native.pyi`.
#[pyfunction]
pub fn manifest_totals(py: Python<'_>, data: &[u8]) -> PyResult<(u64, u64, u64)> {
    py.allow_threads(|| core::totals(data)).map_err(invalid)
}

/// See `_native.pyi`.
#[pyfunction]
pub fn manifest_digests<'py>(py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
    let digests = py.allow_threads(|| core::digests(data)).map_err(invalid)?;
    Ok(PyBytes::new(py, &flat(&digests)))
}

/// See `_native.pyi`.
#[pyfunction]
pub fn digest_difference<'py>(
    py: Python<'py>,
    a: &[u8],
    b: &[u8],
) -> PyResult<Bound<'py, PyBytes>> {
    digest_lists(&[a, b])?;
    let out = py.allow_threads(|| core::difference(a, b));
    Ok(PyBytes::new(py, &out))
}

/// A file row's `(path, digest, size)` for Python.
type PyFile = (String, Py<PyBytes>, u64);

/// See `_native.pyi`.
#[pyfunction]
pub fn manifest_files_with_digests(
    py: Python<'_>,
    data: &[u8],
    digests: &[u8],
) -> PyResult<Vec<PyFile>> {
    let wanted = split(digests)?;
    let found = py
        .allow_threads(|| core::files_with_digests(data, &wanted))
        .map_err(invalid)?;
    Ok(found
        .into_iter()
        .map(|(path, digest, size)| (path, PyBytes::new(py, &digest).unbind(), size))
        .collect())
}

/// See `_native.pyi`.
#[pyfunction]
pub fn manifest_new_files<'py>(
    py: Python<'py>,
    data: &[u8],
    known: &[u8],
    fed: &[u8],
) -> PyResult<(Bound<'py, PyBytes>, Vec<PyFile>)> {
    digest_lists(&[known, fed])?;
    let found = py
        .allow_threads(|| core::new_files(data, known, fed))
        .map_err(invalid)?;
    Ok(new_files_to_py(py, found))
}

/// See `_native.pyi`.
#[pyfunction]
pub fn manifest_delta_new_files<'py>(
    py: Python<'py>,
    ops: &[u8],
    known: &[u8],
    fed: &[u8],
) -> PyResult<Option<(Bound<'py, PyBytes>, Vec<PyFile>)>> {
    digest_lists(&[known, fed])?;
    let found = py
        .allow_threads(|| match core::inserted_rows(ops)? {
            Some(rows) => core::new_files(&rows, known, fed).map(Some),
            None => Ok(None),
        })
        .map_err(invalid)?;
    Ok(found.map(|found| new_files_to_py(py, found)))
}

fn new_files_to_py(py: Python<'_>, found: core::NewFiles) -> (Bound<'_, PyBytes>, Vec<PyFile>) {
    let files = found
        .files
        .into_iter()
        .map(|(path, digest, size)| (path, PyBytes::new(py, &digest).unbind(), size))
        .collect();
    (PyBytes::new(py, &found.digests), files)
}

/// See `_native.pyi`.
#[pyfunction]
pub fn manifest_delta<'py>(
    py: Python<'py>,
    base: &[u8],
    new: &[u8],
) -> PyResult<(Bound<'py, PyBytes>, usize)> {
    let (ops, added) = py
        .allow_threads(|| core::delta(base, new))
        .map_err(invalid)?;
    Ok((PyBytes::new(py, &ops), added))
}

/// See `_native.pyi`.
#[pyfunction]
pub fn manifest_delta_inserts_long_rows(ops: &[u8]) -> PyResult<bool> {
    crate::manifest::delta_inserts_long_rows(ops).map_err(invalid)
}

/// See `_native.pyi`.
#[pyfunction]
pub fn manifest_delta_compact<'py>(
    py: Python<'py>,
    base: &[u8],
    ops: &[u8],
) -> PyResult<(Bound<'py, PyBytes>, usize)> {
    let (ops, added) = py
        .allow_threads(|| crate::manifest::compact_delta(base, ops))
        .map_err(invalid)?;
    Ok((PyBytes::new(py, &ops), added))
}

/// See `_native.pyi`.
#[pyfunction]
pub fn manifest_apply<'py>(
    py: Python<'py>,
    base: &[u8],
    chain: Vec<Vec<u8>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let out = py
        .allow_threads(|| {
            let chain: Vec<&[u8]> = chain.iter().map(Vec::as_slice).collect();
            core::apply_chain(base, &chain)
        })
        .map_err(invalid)?;
    moved_into_bytes(py, out)
}

/// See `_native.pyi`.
#[pyfunction]
pub fn manifest_row<'py>(
    py: Python<'py>,
    data: &[u8],
    path: &str,
) -> PyResult<Option<Bound<'py, PyBytes>>> {
    let found = py.allow_threads(|| {
        let parent = crate::journal::splice::Parent::new(data)?;
        Ok::<_, ManifestError>(parent.find(path)?.map(|(span, _)| parent.rows(span)))
    });
    Ok(found.map_err(invalid)?.map(|row| PyBytes::new(py, row)))
}
