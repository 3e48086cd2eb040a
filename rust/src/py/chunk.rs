//! Chunks of files stored as content-defined chunks (`crate::chunk`): which a
//! capture still has to upload, and their bytes read back from the files.

use std::os::fd::RawFd;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::args;
use super::errors::{to_py, FileChangedError};
use crate::chunk;
use crate::error::ScanError;
use crate::redact::SecretSet;

/// A chunk to read: offset in its file, length, digest.
type ChunkRead<'py> = (u64, u32, Bound<'py, PyBytes>);

/// See `_native.pyi`.
#[pyfunction]
pub fn manifest_chunk_reads<'py>(
    py: Python<'py>,
    data: &[u8],
    wanted: &[u8],
) -> PyResult<Vec<(String, Vec<ChunkRead<'py>>)>> {
    if wanted.len() % 32 != 0 {
        return Err(PyValueError::new_err(
            "digest list length is not a multiple of 32",
        ));
    }
    let found = py
        .allow_threads(|| -> Result<_, crate::manifest::ManifestError> {
            let mut wanted: Vec<[u8; 32]> = wanted
                .chunks_exact(32)
                .map(|c| c.try_into().expect("32 bytes"))
                .collect();
            wanted.sort_unstable();
            let mut out = Vec::new();
            for file in crate::manifest::chunked_files(data)? {
                let mut reads = Vec::new();
                let mut offset = 0u64;
                for c in &file.chunks {
                    if wanted.binary_search(&c.digest).is_ok() {
                        reads.push((offset, c.len, c.digest));
                    }
                    offset += u64::from(c.len);
                }
                if !reads.is_empty() {
                    out.push((file.path, reads));
                }
            }
            Ok(out)
        })
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(found
        .into_iter()
        .map(|(path, reads)| {
            let reads = reads
                .into_iter()
                .map(|(offset, len, digest)| (offset, len, PyBytes::new(py, &digest)))
                .collect();
            (path, reads)
        })
        .collect())
}

/// See `_native.pyi`.
#[pyfunction]
#[pyo3(signature = (root_fd, path, reads, secrets=None))]
pub fn read_chunks_beneath<'py>(
    py: Python<'py>,
    root_fd: RawFd,
    path: String,
    reads: Vec<(u64, u32, Vec<u8>)>,
    secrets: Option<&Bound<'_, PyAny>>,
) -> PyResult<Vec<Bound<'py, PyBytes>>> {
    let secrets =
        SecretSet::new(&args::secrets(secrets)?).map_err(|e| to_py(ScanError::ShortSecret(e)))?;
    let read = py.allow_threads(|| -> std::io::Result<Option<Vec<Vec<u8>>>> {
        let fd = crate::fs::open_to_read(root_fd, path.as_bytes())?;
        let file = std::fs::File::from(fd);
        let mut out = Vec::with_capacity(reads.len());
        for (offset, len, digest) in &reads {
            let data = chunk::read_zeroed_range(&file, *offset, *len as usize, &secrets)?;
            if blake3::hash(&data).as_bytes().as_slice() != digest.as_slice() {
                return Ok(None);
            }
            out.push(data);
        }
        Ok(Some(out))
    });
    match read {
        Ok(Some(datas)) => Ok(datas.iter().map(|d| PyBytes::new(py, d)).collect()),
        Ok(None) | Err(_) => Err(FileChangedError::new_err((
            path.clone(),
            "no longer holds the chunks the capture read",
        ))),
    }
}
