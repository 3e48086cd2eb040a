//! Converting Python arguments into owned Rust values (before the GIL is released).

use std::borrow::Cow;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyString;

/// A sequence of bytes-like secrets, copied. A lone `bytes` or `str` is refused
/// (iterating it would silently give single bytes or characters).
pub fn secrets(value: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<Vec<u8>>> {
    let Some(value) = value else {
        return Ok(Vec::new());
    };
    if value.is_instance_of::<PyString>() || value.extract::<Cow<[u8]>>().is_ok() {
        return Err(PyTypeError::new_err(
            "secrets must be a sequence of bytes, not a single value",
        ));
    }
    let mut out = Vec::new();
    for item in value.try_iter()? {
        let item = item?;
        let bytes: Cow<[u8]> = item
            .extract()
            .map_err(|_| PyTypeError::new_err("every secret must be bytes"))?;
        out.push(bytes.into_owned());
    }
    Ok(out)
}

/// A sequence of pattern strings. A lone `str` is refused.
pub fn patterns(value: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<String>> {
    let Some(value) = value else {
        return Ok(Vec::new());
    };
    if value.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(
            "patterns must be a sequence of str, not a single str",
        ));
    }
    let mut out = Vec::new();
    for item in value.try_iter()? {
        out.push(item?.extract::<String>()?);
    }
    Ok(out)
}

/// Chunking of files above `threshold` bytes into chunks of `average` bytes
/// on average (`crate::chunk::ChunkParams`); None when `threshold` is None.
/// ValueError naming the setting and the rule.
pub fn chunk_params(
    threshold: Option<u64>,
    average: u32,
) -> PyResult<Option<crate::chunk::ChunkParams>> {
    threshold
        .map(|threshold| crate::chunk::ChunkParams::new(threshold, average))
        .transpose()
        .map_err(pyo3::exceptions::PyValueError::new_err)
}
