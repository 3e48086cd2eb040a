//! checkpointd's native core: tree walk, policy, secret zeroing, hashing, stat cache.
//! Core modules never import pyo3; `py/` is the only binding layer.

pub mod py;
