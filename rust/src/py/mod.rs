//! The PyO3 binding: owns inputs, releases the GIL, calls the core, converts results.
//! The only place in the crate that imports pyo3.

mod args;
mod blobdir;
mod bytes;
mod cancel;
mod chunk;
mod errors;
mod feed;
mod journal;
mod keywords;
mod manifest;
mod pack;
mod policy;
mod recycle;
mod restore;
mod scan;
mod stream;
mod verify;

use pyo3::prelude::*;
use pyo3::types::PyTuple;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // Benchmarks refuse debug builds by reading this.
    m.add(
        "BUILD_PROFILE",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
    )?;
    errors::add_to(m)?;
    m.add_class::<blobdir::PyBlobDir>()?;
    m.add_class::<feed::PyBlobFeed>()?;
    m.add_class::<feed::FedBatch>()?;
    m.add_class::<cancel::CancelToken>()?;
    m.add_class::<scan::ScanResult>()?;
    m.add_class::<journal::PyJournal>()?;
    m.add_class::<journal::PyTicket>()?;
    m.add_function(wrap_pyfunction!(journal::journal_differences, m)?)?;
    m.add_class::<scan::PyScanProgress>()?;
    m.add_class::<policy::PyPolicyMatcher>()?;
    m.add_class::<verify::PyVerifyingReader>()?;
    m.add_function(wrap_pyfunction!(verify::rehash_beneath, m)?)?;
    m.add_function(wrap_pyfunction!(verify::stat_beneath, m)?)?;
    m.add_function(wrap_pyfunction!(verify::open_beneath, m)?)?;
    m.add_class::<restore::RestoreSession>()?;
    m.add_function(wrap_pyfunction!(restore::remove_stale_staging, m)?)?;
    m.add_class::<pack::PyPackWriter>()?;
    m.add_class::<pack::DigestSet>()?;
    m.add("PACK_FOOTER_LEN", crate::pack::FOOTER_LEN)?;
    m.add("STAGING_PREFIX", crate::restore::STAGING_PREFIX)?;
    m.add("CHUNK_CACHE_SUFFIX", crate::chunking::CACHE_SUFFIX)?;
    m.add("MIN_SECRET_LEN", crate::redact::MIN_SECRET_LEN)?;
    m.add("DECIMAL_ROW_CHARS", pack::ROW_CHARS)?;
    m.add(
        "DEFAULT_EXCLUDES",
        PyTuple::new(m.py(), crate::policy::DEFAULT_EXCLUDES)?,
    )?;
    m.add_function(wrap_pyfunction!(pack::unpack_many, m)?)?;
    m.add_function(wrap_pyfunction!(pack::digests_sorted_distinct, m)?)?;
    m.add_function(wrap_pyfunction!(pack::digests_without, m)?)?;
    m.add_function(wrap_pyfunction!(pack::sort_digests, m)?)?;
    m.add_function(wrap_pyfunction!(pack::u32_bounds, m)?)?;
    m.add_function(wrap_pyfunction!(pack::decimal_rows, m)?)?;
    m.add_function(wrap_pyfunction!(pack::pack_trailer_len, m)?)?;
    m.add_function(wrap_pyfunction!(pack::plan_pack_reads, m)?)?;
    m.add_function(wrap_pyfunction!(pack::read_pack_trailer, m)?)?;
    m.add_function(wrap_pyfunction!(pack::verify_pack_file, m)?)?;
    m.add_function(wrap_pyfunction!(scan::scan, m)?)?;
    m.add_function(wrap_pyfunction!(scan::release_freed_memory, m)?)?;
    m.add_function(wrap_pyfunction!(stream::hash_file, m)?)?;
    m.add_function(wrap_pyfunction!(stream::secrets_fingerprint, m)?)?;
    m.add_function(wrap_pyfunction!(chunk::manifest_chunk_reads, m)?)?;
    m.add_function(wrap_pyfunction!(chunk::read_chunks_beneath, m)?)?;
    m.add_function(wrap_pyfunction!(manifest::manifest_totals, m)?)?;
    m.add_function(wrap_pyfunction!(manifest::manifest_digests, m)?)?;
    m.add_function(wrap_pyfunction!(manifest::digest_difference, m)?)?;
    m.add_function(wrap_pyfunction!(manifest::manifest_files_with_digests, m)?)?;
    m.add_function(wrap_pyfunction!(manifest::manifest_delta, m)?)?;
    m.add_function(wrap_pyfunction!(manifest::manifest_new_files, m)?)?;
    m.add_function(wrap_pyfunction!(manifest::manifest_delta_new_files, m)?)?;
    m.add_function(wrap_pyfunction!(
        manifest::manifest_delta_inserts_long_rows,
        m
    )?)?;
    m.add_function(wrap_pyfunction!(manifest::manifest_delta_compact, m)?)?;
    m.add_function(wrap_pyfunction!(manifest::manifest_apply, m)?)?;
    m.add_function(wrap_pyfunction!(manifest::manifest_row, m)?)?;
    Ok(())
}
