//! The manifest in `checkpointd.codec`'s compact encoding: one UTF-8 JSON array
//! of rows `["f", path, hex, size, mode, mtime_ns]`, `["d", path, mode]`,
//! `["l", path, target]`, written byte-for-byte as Python's
//! `json.dumps(rows, separators=(",", ":"), ensure_ascii=False)` would.

/// Appends rows to one growing buffer; `finish` closes the array.
pub struct ManifestWriter {
    out: Vec<u8>,
    rows: usize,
}

impl ManifestWriter {
    pub fn with_capacity(bytes: usize) -> ManifestWriter {
        let mut out = Vec::with_capacity(bytes.max(2));
        out.push(b'[');
        ManifestWriter { out, rows: 0 }
    }

    fn begin_row(&mut self, tag: u8) {
        if self.rows > 0 {
            self.out.push(b',');
        }
        self.rows += 1;
        self.out.extend_from_slice(&[b'[', b'"', tag, b'"', b',']);
    }

    pub fn file(&mut self, path: &str, hash: &[u8; 32], size: u64, mode: u32, mtime_ns: i64) {
        self.begin_row(b'f');
        write_json_string(&mut self.out, path);
        self.out.extend_from_slice(b",\"");
        write_hex(&mut self.out, hash);
        self.out.extend_from_slice(b"\",");
        write_int(&mut self.out, size as i128);
        self.out.push(b',');
        write_int(&mut self.out, mode as i128);
        self.out.push(b',');
        write_int(&mut self.out, mtime_ns as i128);
        self.out.push(b']');
    }

    pub fn dir(&mut self, path: &str, mode: u32) {
        self.begin_row(b'd');
        write_json_string(&mut self.out, path);
        self.out.push(b',');
        write_int(&mut self.out, mode as i128);
        self.out.push(b']');
    }

    pub fn symlink(&mut self, path: &str, target: &str) {
        self.begin_row(b'l');
        write_json_string(&mut self.out, path);
        self.out.push(b',');
        write_json_string(&mut self.out, target);
        self.out.push(b']');
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn finish(mut self) -> Vec<u8> {
        self.out.push(b']');
        self.out
    }
}

/// Lowercase hex, straight into the buffer (no temporary String per row).
fn write_hex(out: &mut Vec<u8>, digest: &[u8; 32]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut text = [0u8; 64];
    for (i, b) in digest.iter().enumerate() {
        text[2 * i] = HEX[(b >> 4) as usize];
        text[2 * i + 1] = HEX[(b & 15) as usize];
    }
    out.extend_from_slice(&text);
}

/// A decimal integer, straight into the buffer.
fn write_int(out: &mut Vec<u8>, value: i128) {
    let mut digits = [0u8; 40];
    let mut n = value.unsigned_abs();
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if value < 0 {
        out.push(b'-');
    }
    out.extend_from_slice(&digits[at..]);
}

/// A JSON string as Python's `json` module writes it with `ensure_ascii=False`:
/// `"` and `\` escaped, `\n \r \t \b \f` short forms, other control characters
/// below U+0020 as `\u00xx` (lowercase hex), everything else verbatim.
pub fn write_json_string(out: &mut Vec<u8>, text: &str) {
    out.push(b'"');
    let bytes = text.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if !NEEDS_ESCAPE[b as usize] {
            continue;
        }
        out.extend_from_slice(&bytes[start..i]);
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            _ => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[(b >> 4) as usize]);
                out.push(HEX[(b & 15) as usize]);
            }
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// Bytes that JSON (as Python writes it) escapes: `"`, `\`, and below U+0020.
static NEEDS_ESCAPE: [bool; 256] = {
    let mut table = [false; 256];
    let mut i = 0;
    while i < 0x20 {
        table[i] = true;
        i += 1;
    }
    table[b'"' as usize] = true;
    table[b'\\' as usize] = true;
    table
};

#[cfg(test)]
mod tests {
    use super::*;

    fn json(text: &str) -> String {
        let mut out = Vec::new();
        write_json_string(&mut out, text);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn escaping_matches_python() {
        assert_eq!(json("plain"), "\"plain\"");
        assert_eq!(json("q\"b\\s"), "\"q\\\"b\\\\s\"");
        assert_eq!(json("a\nb\tc\r\u{8}\u{c}"), "\"a\\nb\\tc\\r\\b\\f\"");
        assert_eq!(json("\u{1}\u{1f}\u{7f}"), "\"\\u0001\\u001f\u{7f}\"");
        assert_eq!(json("é→😀\u{2028}"), "\"é→😀\u{2028}\"");
    }

    #[test]
    fn rows() {
        let mut w = ManifestWriter::with_capacity(0);
        w.dir("d", 0o755);
        w.file("d/f", &[0u8; 32], 3, 0o644, -5);
        w.symlink("d/l", "f");
        assert_eq!(w.rows(), 3);
        let text = String::from_utf8(w.finish()).unwrap();
        let zeros = "0".repeat(64);
        assert_eq!(
            text,
            format!(
                "[[\"d\",\"d\",493],[\"f\",\"d/f\",\"{zeros}\",3,420,-5],[\"l\",\"d/l\",\"f\"]]"
            )
        );
        assert_eq!(
            String::from_utf8(ManifestWriter::with_capacity(0).finish()).unwrap(),
            "[]"
        );
    }
}
