//! A directory's raw listing as the cache encodes it.

/// A directory's raw listing in the cache's encoding: per name `d_type u8,
/// name_len u16, name, NUL` (the NUL lets a reused name go to `fstatat` as is).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    pub bytes: Vec<u8>,
}

impl Listing {
    /// Append one name as `readdir` gave it (`d_type` raw: `DT_*`).
    pub fn push(&mut self, name: &[u8], d_type: u8) {
        debug_assert!(name.len() <= u16::MAX as usize && !name.contains(&0));
        self.bytes.push(d_type);
        self.bytes
            .extend_from_slice(&(name.len() as u16).to_le_bytes());
        self.bytes.extend_from_slice(name);
        self.bytes.push(0);
    }
}

/// The names of an encoded listing with their raw `d_type`, in listing order.
/// The bytes were validated when the cache was decoded (or built by us).
pub fn listing_names(bytes: &[u8]) -> impl Iterator<Item = (&std::ffi::CStr, u8)> + '_ {
    let mut at = 0usize;
    std::iter::from_fn(move || {
        let (name, d_type, next) = listing_entry(bytes, at)?;
        at = next;
        Some((name, d_type))
    })
}

/// The entry of `bytes` at `at`: name, `d_type` and where the next starts;
/// None at the end or when the bytes do not hold a well-formed entry.
fn listing_entry(bytes: &[u8], at: usize) -> Option<(&std::ffi::CStr, u8, usize)> {
    let d_type = *bytes.get(at)?;
    let len = u16::from_le_bytes(bytes.get(at + 1..at + 3)?.try_into().ok()?) as usize;
    let end = at + 3 + len + 1;
    let name = std::ffi::CStr::from_bytes_with_nul(bytes.get(at + 3..end)?).ok()?;
    Some((name, d_type, end))
}

/// Whether `bytes` is a well-formed listing of real names (no empty name,
/// no `.`/`..`, no `/`; the NUL placement is checked by `CStr`).
pub(super) fn valid_listing(bytes: &[u8]) -> bool {
    let mut at = 0;
    while at < bytes.len() {
        let Some((name, _, next)) = listing_entry(bytes, at) else {
            return false;
        };
        let name = name.to_bytes();
        if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
            return false;
        }
        at = next;
    }
    true
}
