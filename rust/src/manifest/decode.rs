//! Full decoding of a manifest into rows, accepting any JSON whitespace.

/// One decoded manifest row (the inverse of [`ManifestWriter`](super::ManifestWriter)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ManifestRow {
    File {
        path: String,
        hash: [u8; 32],
        size: u64,
        mode: u32,
        mtime_ns: i64,
        /// Capture zeroed secrets in it (the row carries their positions).
        secrets: bool,
    },
    Dir {
        path: String,
        mode: u32,
    },
    Symlink {
        path: String,
        target: String,
    },
}

impl ManifestRow {
    pub fn path(&self) -> &str {
        match self {
            ManifestRow::File { path, .. }
            | ManifestRow::Dir { path, .. }
            | ManifestRow::Symlink { path, .. } => path,
        }
    }
}

/// Parse a manifest in the codec's encoding (any JSON whitespace accepted, as
/// Python's `json.dumps` may have produced it with other separators). Errors
/// name the byte offset and what was expected.
pub fn decode(data: &[u8]) -> Result<Vec<ManifestRow>, String> {
    let mut p = Parser { data, pos: 0 };
    let mut rows = Vec::new();
    p.expect(b'[')?;
    if !p.eat(b']') {
        loop {
            rows.push(p.row()?);
            if p.eat(b']') {
                break;
            }
            p.expect(b',')?;
        }
    }
    p.skip_ws();
    if p.pos != data.len() {
        return Err(p.error("end of the manifest"));
    }
    Ok(rows)
}

struct Parser<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn error(&self, expected: &str) -> String {
        format!("manifest: expected {expected} at byte {}", self.pos)
    }

    fn skip_ws(&mut self) {
        while matches!(self.data.get(self.pos), Some(b' ' | b'\n' | b'\r' | b'\t')) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> bool {
        self.skip_ws();
        if self.data.get(self.pos) == Some(&byte) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, byte: u8) -> Result<(), String> {
        if self.eat(byte) {
            Ok(())
        } else {
            Err(self.error(&format!("{:?}", byte as char)))
        }
    }

    fn row(&mut self) -> Result<ManifestRow, String> {
        self.expect(b'[')?;
        let tag = self.string()?;
        self.expect(b',')?;
        let path = self.string()?;
        self.expect(b',')?;
        let row = match tag.as_str() {
            "f" => {
                let hex = self.string()?;
                let hash =
                    crate::hash::from_hex(&hex).ok_or_else(|| self.error("a 64-hex digest"))?;
                self.expect(b',')?;
                let size = self.int()?;
                self.expect(b',')?;
                let mode = self.int()?;
                self.expect(b',')?;
                let mtime_ns = self.int()?;
                // Secret positions (flat offset, length, index-or-name triples):
                // the restore plan only needs to know there are some
                // (`spanned_files` reads them for `crate::spans`).
                let mut secrets = false;
                let mut first = true;
                while self.eat(b',') {
                    self.skip_ws();
                    let text = self.data.get(self.pos) == Some(&b'"');
                    if std::mem::take(&mut first) && text {
                        // The chunk list of a file stored as chunks.
                        self.string()?;
                        continue;
                    }
                    secrets = true;
                    if text {
                        self.string()?;
                    } else {
                        self.int()?;
                    }
                }
                ManifestRow::File {
                    path,
                    hash,
                    size: u64::try_from(size).map_err(|_| self.error("a size >= 0"))?,
                    mode: u32::try_from(mode).map_err(|_| self.error("a mode"))?,
                    mtime_ns: i64::try_from(mtime_ns).map_err(|_| self.error("an mtime"))?,
                    secrets,
                }
            }
            "d" => {
                let mode = self.int()?;
                ManifestRow::Dir {
                    path,
                    mode: u32::try_from(mode).map_err(|_| self.error("a mode"))?,
                }
            }
            "l" => ManifestRow::Symlink {
                path,
                target: self.string()?,
            },
            _ => return Err(self.error("a row tag f, d or l")),
        };
        self.expect(b']')?;
        Ok(row)
    }

    fn int(&mut self) -> Result<i128, String> {
        self.skip_ws();
        let start = self.pos;
        if self.data.get(self.pos) == Some(&b'-') {
            self.pos += 1;
        }
        while matches!(self.data.get(self.pos), Some(b'0'..=b'9')) {
            self.pos += 1;
        }
        std::str::from_utf8(&self.data[start..self.pos])
            .ok()
            .and_then(|text| text.parse::<i128>().ok())
            .ok_or_else(|| self.error("an integer"))
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let digits = self
            .data
            .get(self.pos..self.pos + 4)
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| u32::from_str_radix(d, 16).ok())
            .ok_or_else(|| self.error("4 hex digits"))?;
        self.pos += 4;
        Ok(digits)
    }

    fn string(&mut self) -> Result<String, String> {
        self.expect(b'"')?;
        let mut out: Vec<u8> = Vec::new();
        loop {
            let start = self.pos;
            while let Some(&b) = self.data.get(self.pos) {
                if b == b'"' || b == b'\\' {
                    break;
                }
                self.pos += 1;
            }
            out.extend_from_slice(&self.data[start..self.pos]);
            match self.data.get(self.pos) {
                Some(b'"') => {
                    self.pos += 1;
                    return String::from_utf8(out).map_err(|_| self.error("UTF-8 text"));
                }
                Some(_) => {
                    self.pos += 1;
                    let escaped = *self
                        .data
                        .get(self.pos)
                        .ok_or_else(|| self.error("an escape"))?;
                    self.pos += 1;
                    let simple = match escaped {
                        b'"' => Some(b'"'),
                        b'\\' => Some(b'\\'),
                        b'/' => Some(b'/'),
                        b'b' => Some(0x08),
                        b'f' => Some(0x0c),
                        b'n' => Some(b'\n'),
                        b'r' => Some(b'\r'),
                        b't' => Some(b'\t'),
                        b'u' => None,
                        _ => return Err(self.error("a JSON escape")),
                    };
                    if let Some(byte) = simple {
                        out.push(byte);
                        continue;
                    }
                    let mut code = self.hex4()?;
                    if (0xd800..0xdc00).contains(&code) {
                        // A surrogate pair: the low half must follow.
                        if self.data.get(self.pos..self.pos + 2) != Some(b"\\u") {
                            return Err(self.error("the low half of a surrogate pair"));
                        }
                        self.pos += 2;
                        let low = self.hex4()?;
                        if !(0xdc00..0xe000).contains(&low) {
                            return Err(self.error("the low half of a surrogate pair"));
                        }
                        code = 0x10000 + ((code - 0xd800) << 10) + (low - 0xdc00);
                    }
                    let ch = char::from_u32(code).ok_or_else(|| self.error("a Unicode scalar"))?;
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                }
                None => return Err(self.error("a closing quote")),
            }
        }
    }
}
