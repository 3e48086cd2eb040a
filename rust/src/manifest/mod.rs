//! The manifest in `checkpointd.codec`'s compact encoding: one UTF-8 JSON array
//! of rows `["f", path, hex, size, mode, mtime_ns]`, `["d", path, mode]`,
//! `["l", path, target]` (a file row where secrets were zeroed goes on with
//! `offset, length, secret index` triples), written byte-for-byte as Python's
//! `json.dumps(rows, separators=(",", ":"), ensure_ascii=False)` would.
//!
//! A file stored as content-defined chunks (`crate::chunk`) has its chunk list
//! as one string right after the mtime, before any secret triple:
//! `["f", path, hex, size, mode, mtime_ns, "<chunks>", ...]` (a secret triple
//! starts with a number, so a string there is always the chunk list). Its
//! `hex` stays the whole file's digest; its blobs are the chunks.

mod decode;
mod delta;
mod digests;
mod files;
mod rowpatch;
mod rows;
mod writer;

pub use decode::{decode, ManifestRow};
pub use delta::{apply, apply_chain, delta, inserted_rows, DeltaWriter};
pub use digests::{
    difference, digests, digests_counted, files_with_digests, new_files, search, Counted, NewFiles,
};
pub use files::{
    chunked_files, file_chunks, spanned_files, totals, ChunkedFile, SecretRef, Span, SpannedFile,
};
pub use rowpatch::{compact_delta, delta_inserts_long_rows};
pub use rows::{file_row, json_string, row_chunks, row_path, rows, FileRow, ManifestError};
pub use writer::{
    write_json_string, Counter, FileFields, JsonPath, ManifestWriter, Sink, SliceWriter,
};

#[cfg(test)]
mod tests;
