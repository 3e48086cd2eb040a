//! checkpointd's native core: tree walk, policy, secret zeroing, hashing, stat cache.
//! Core modules never import pyo3; `py/` is the only binding layer.

pub mod blobdir;
pub mod cancel;
pub mod chunk;
pub mod chunking;
pub mod classify;
pub mod error;
pub mod feed;
pub mod fs;
pub mod hash;
pub mod journal;
pub mod manifest;
pub mod pack;
pub mod packcheck;
pub mod policy;
pub mod redact;
pub mod restore;
pub mod restore_chunks;
pub mod scan;
pub mod spans;
pub mod statcache;
pub mod verify;
pub mod walk;

pub mod py;
