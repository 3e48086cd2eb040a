//! One policy line, read the way git reads one line of a `.gitignore`
//! (`add_patterns_from_buffer`, `parse_path_pattern`, `match_basename`,
//! `match_pathname` in git's dir.c).
//!
//! - An empty line and a line starting with `#` are skipped (`\#` is a literal
//!   `#`). One trailing `\r` is dropped, then trailing spaces unless escaped
//!   (`\ `); tabs are kept.
//! - A leading `!` negates (`\!` is a literal `!`).
//! - One trailing `/` means "directories only"; a second one stays in the
//!   pattern (so `build//` can never match, as in git).
//! - With no other `/`, the pattern is matched against the basename at any depth
//!   (`*` and `?` may then be anything but there is no `/` to cross). Otherwise it
//!   is matched against the whole workspace-relative path with `WM_PATHNAME`,
//!   after dropping one leading `/`.

use super::wildmatch::{literal_prefix_len, Glob, Oddity, MAX_STAR_RUNS};

/// How the pattern body is compared; the first two are git's own shortcuts and
/// give the same answers as the glob.
#[derive(Debug, Clone)]
enum Body {
    /// No glob-special byte: the bytes must be equal.
    Literal(Vec<u8>),
    /// `*` then a literal, against a basename: a suffix test.
    EndsWith(Vec<u8>),
    Glob(Glob),
}

#[derive(Debug, Clone)]
pub struct Pattern {
    pub negated: bool,
    pub dir_only: bool,
    /// git's NODIR: matched against the last path segment only.
    basename_only: bool,
    body: Body,
    oddities: Vec<Oddity>,
}

/// A policy entry that cannot be one gitignore line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatternError {
    pub pattern: String,
    pub reason: String,
}

impl std::fmt::Display for PatternError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bad policy pattern {:?}: {}", self.pattern, self.reason)
    }
}

impl Pattern {
    /// Compile one line; `Ok(None)` for what git skips (blank lines, `#`
    /// comments). Err only for what cannot be a single line of a `.gitignore`
    /// (a line break or NUL inside) or more than `MAX_STAR_RUNS` star groups.
    pub fn parse(text: &str) -> Result<Option<Pattern>, PatternError> {
        let error = |reason: &str| PatternError {
            pattern: text.to_string(),
            reason: reason.to_string(),
        };
        if text.contains('\n') {
            return Err(error("holds a line break; give one pattern per entry"));
        }
        if text.contains('\0') {
            return Err(error("holds a NUL byte, which no gitignore line can"));
        }
        if text.is_empty() || text.starts_with('#') {
            return Ok(None);
        }
        let mut line = text.as_bytes();
        if let Some(rest) = line.strip_suffix(b"\r") {
            line = rest;
        }
        let mut body = trim_trailing_spaces(line);
        if body.is_empty() {
            // git keeps an empty pattern that matches nothing: a blank line.
            return Ok(None);
        }
        let negated = body[0] == b'!';
        if negated {
            body = &body[1..];
        }
        let dir_only = body.last() == Some(&b'/');
        if dir_only {
            body = &body[..body.len() - 1];
        }
        let basename_only = !body.contains(&b'/');
        if !basename_only {
            body = body.strip_prefix(b"/").unwrap_or(body);
        }
        let mut oddities = Vec::new();
        if body.is_empty() {
            oddities.push(Oddity {
                reason: "nothing is left to match once `!` and the leading and trailing `/` \
                         are taken off"
                    .to_string(),
                never_matches: true,
            });
        }
        // The glob is compiled for its analysis even when a shortcut matches.
        let glob = Glob::compile(body, !basename_only).map_err(|runs| {
            error(&format!(
                "has {runs} groups of `*`; at most {MAX_STAR_RUNS} are supported"
            ))
        })?;
        oddities.extend_from_slice(glob.oddities());
        let body = if literal_prefix_len(body) == body.len() {
            Body::Literal(body.to_vec())
        } else if basename_only
            && body[0] == b'*'
            && literal_prefix_len(&body[1..]) == body.len() - 1
        {
            Body::EndsWith(body[1..].to_vec())
        } else {
            Body::Glob(glob)
        };
        Ok(Some(Pattern {
            negated,
            dir_only,
            basename_only,
            body,
            oddities,
        }))
    }

    /// What git accepts silently about this line (empty when nothing).
    pub fn oddities(&self) -> &[Oddity] {
        &self.oddities
    }

    /// Whether the pattern matches `path` (workspace-relative, `/`-separated,
    /// no empty segment) whose last segment is `basename`.
    pub fn matches(&self, path: &[u8], basename: &[u8], is_dir: bool) -> bool {
        if self.dir_only && !is_dir {
            return false;
        }
        let text = if self.basename_only { basename } else { path };
        match &self.body {
            Body::Literal(literal) => text == literal.as_slice(),
            Body::EndsWith(suffix) => text.ends_with(suffix),
            Body::Glob(glob) => glob.matches(text),
        }
    }
}

/// git's `trim_trailing_spaces`: drop the final run of spaces unless a `\`
/// escapes its first one; a `\` at the very end keeps everything.
fn trim_trailing_spaces(line: &[u8]) -> &[u8] {
    let mut spaces_from = None;
    let mut i = 0;
    while i < line.len() {
        match line[i] {
            b' ' => {
                spaces_from.get_or_insert(i);
            }
            b'\\' => {
                i += 1;
                if i == line.len() {
                    return line;
                }
                spaces_from = None;
            }
            _ => spaces_from = None,
        }
        i += 1;
    }
    &line[..spaces_from.unwrap_or(line.len())]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pattern: &str, path: &str, is_dir: bool) -> bool {
        let p = Pattern::parse(pattern).unwrap().unwrap();
        let basename = path.rsplit('/').next().unwrap();
        p.matches(path.as_bytes(), basename.as_bytes(), is_dir)
    }

    fn never(pattern: &str) -> bool {
        Pattern::parse(pattern)
            .unwrap()
            .unwrap()
            .oddities()
            .iter()
            .any(|o| o.never_matches)
    }

    #[test]
    fn globs() {
        assert!(m("*.py", "a/b/c.py", false));
        assert!(!m("*.py", "a/b/c.pyc", false));
        assert!(m("c?py", "c.py", false));
        assert!(m("[abc].txt", "b.txt", false));
        assert!(!m("[!abc].txt", "b.txt", false));
        assert!(m("[a-c]x", "bx", false));
        assert!(m("a*b*c", "aXXbYYc", false));
        assert!(!m("a*b*c", "aXXbYY", false));
        assert!(m("\\*lit", "*lit", false));
        assert!(!m("\\*lit", "xlit", false));
        // `?` matches one byte, as in git: `é` is two.
        assert!(!m("é?", "éü", false));
        assert!(m("é??", "éü", false));
        assert!(m("[[:digit:]]*", "7up", false));
    }

    #[test]
    fn anchoring_and_depth() {
        assert!(m("/top", "top", false));
        assert!(!m("/top", "a/top", false));
        assert!(m("a/b", "a/b", false));
        assert!(!m("a/b", "x/a/b", false));
        assert!(m("**/b", "x/y/b", false));
        assert!(m("**/b", "b", false));
        assert!(m("a/**/b", "a/b", false));
        assert!(m("a/**/b", "a/x/y/b", false));
        assert!(m("a/**", "a/x", false));
        assert!(m("a/**", "a/x/y", false));
        assert!(!m("a/**", "a", true));
        assert!(!m("a/*", "a/x/y", false));
        assert!(m("**", "a", false));
    }

    #[test]
    fn lines_as_git_reads_them() {
        assert!(m("build/", "build", true));
        assert!(!m("build/", "build", false));
        assert!(!m("build//", "build", true));
        assert!(never("build//"));
        let p = Pattern::parse("!keep").unwrap().unwrap();
        assert!(p.negated);
        assert!(Pattern::parse("# comment").unwrap().is_none());
        assert!(Pattern::parse("   ").unwrap().is_none());
        assert!(Pattern::parse("").unwrap().is_none());
        assert!(m("\\#x", "#x", false));
        assert!(m(" #x", " #x", false));
        assert!(m("\\!x", "!x", false));
        assert!(m("trail\\ ", "trail ", false));
        assert!(m("trail\\  ", "trail ", false));
        assert!(m("x  ", "x", false));
        assert!(m("x\\\\  ", "x\\", false));
        assert!(m("tab\t", "tab\t", false));
        assert!(m("cr\r", "cr", false));
        for dead in [
            "/",
            "!",
            "!/",
            "//",
            "a//b",
            "//a",
            "[abc",
            "a\\",
            "[[:nope:]]",
        ] {
            assert!(never(dead), "{dead:?}");
        }
        assert!(!never("a/**/"));
        assert!(Pattern::parse("a\nb").is_err());
        assert!(Pattern::parse("a\0b").is_err());
        assert!(Pattern::parse(&"a*".repeat(1025)).is_err());
        assert!(Pattern::parse(&"a*".repeat(1024)).is_ok());
    }
}
