//! One gitignore-dialect pattern, compiled to per-segment globs.
//!
//! Rules (git's gitignore): a leading `!` negates; a trailing `/` matches
//! directories only; a pattern with a `/` anywhere but at the end is anchored at
//! the workspace root (a leading `/` only anchors); a pattern without one matches
//! the basename at any depth. `*` and `?` never cross a `/`; `[...]` is a class;
//! `**` as a whole segment spans zero or more directories (`a/**` matches what is
//! inside `a`, not `a` itself); `\` escapes the next character.

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Literal(char),
    AnyChar,
    Star,
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    /// `**`: any number of whole path segments.
    AnyDepth,
    Glob(Vec<Token>),
}

#[derive(Debug, Clone)]
pub struct Pattern {
    pub negated: bool,
    pub dir_only: bool,
    /// Anchored patterns match the whole path; others only the basename.
    anchored: bool,
    segments: Vec<Segment>,
}

/// Why a pattern could not be compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatternError {
    pub pattern: String,
    pub reason: &'static str,
}

impl std::fmt::Display for PatternError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bad policy pattern {:?}: {}", self.pattern, self.reason)
    }
}

impl Pattern {
    /// Compile one line; `Ok(None)` for blank lines and `#` comments (as git).
    pub fn parse(text: &str) -> Result<Option<Pattern>, PatternError> {
        let error = |reason| PatternError {
            pattern: text.to_string(),
            reason,
        };
        let mut body = trim_trailing_spaces(text);
        if body.is_empty() || body.starts_with('#') {
            return Ok(None);
        }
        let mut negated = false;
        if let Some(rest) = body.strip_prefix('!') {
            negated = true;
            body = rest;
        }
        let mut dir_only = false;
        while body.ends_with('/') && !body.ends_with("\\/") {
            dir_only = true;
            body = &body[..body.len() - 1];
        }
        let mut anchored = false;
        if let Some(rest) = body.strip_prefix('/') {
            anchored = true;
            body = rest;
        }
        if body.is_empty() {
            return Err(error("matches nothing"));
        }
        if body.contains('/') {
            anchored = true;
        }
        let mut segments = Vec::new();
        for part in body.split('/') {
            if part.is_empty() {
                return Err(error("empty path segment"));
            }
            if part == "**" {
                // Consecutive `**` are the same as one.
                if segments.last() != Some(&Segment::AnyDepth) {
                    segments.push(Segment::AnyDepth);
                }
            } else {
                segments.push(Segment::Glob(parse_glob(part).map_err(error)?));
            }
        }
        // A lone `**` without a slash matches everything, like `*` at any depth.
        if !anchored && segments == [Segment::AnyDepth] {
            segments = vec![Segment::Glob(vec![Token::Star])];
        }
        Ok(Some(Pattern {
            negated,
            dir_only,
            anchored,
            segments,
        }))
    }

    /// Whether the pattern matches `path` (split into segments, non-empty).
    pub fn matches(&self, segments: &[&str], is_dir: bool) -> bool {
        if self.dir_only && !is_dir {
            return false;
        }
        if self.anchored {
            match_segments(&self.segments, segments)
        } else {
            let last = segments.last().copied().unwrap_or("");
            match &self.segments[..] {
                [Segment::Glob(tokens)] => match_glob(tokens, last),
                _ => false,
            }
        }
    }
}

fn trim_trailing_spaces(text: &str) -> &str {
    let bytes = text.as_bytes();
    let mut end = bytes.len();
    while end > 0 && bytes[end - 1] == b' ' {
        // An escaped space (`\ `) is kept.
        if end >= 2 && bytes[end - 2] == b'\\' {
            break;
        }
        end -= 1;
    }
    &text[..end]
}

fn parse_glob(part: &str) -> Result<Vec<Token>, &'static str> {
    let mut tokens = Vec::new();
    let mut chars = part.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(escaped) => tokens.push(Token::Literal(escaped)),
                None => return Err("trailing backslash"),
            },
            '?' => tokens.push(Token::AnyChar),
            '*' => {
                // `**` inside a segment acts as `*`.
                while chars.peek() == Some(&'*') {
                    chars.next();
                }
                tokens.push(Token::Star);
            }
            '[' => {
                let mut negated = false;
                if matches!(chars.peek(), Some('!') | Some('^')) {
                    negated = true;
                    chars.next();
                }
                let mut ranges = Vec::new();
                let mut first = true;
                loop {
                    let Some(mut lo) = chars.next() else {
                        return Err("unclosed [");
                    };
                    if lo == ']' && !first {
                        break;
                    }
                    first = false;
                    if lo == '\\' {
                        lo = chars.next().ok_or("unclosed [")?;
                    }
                    let mut hi = lo;
                    if chars.peek() == Some(&'-') {
                        let mut lookahead = chars.clone();
                        lookahead.next();
                        match lookahead.peek() {
                            Some(']') | None => {}
                            Some(_) => {
                                chars.next();
                                hi = chars.next().ok_or("unclosed [")?;
                                if hi == '\\' {
                                    hi = chars.next().ok_or("unclosed [")?;
                                }
                            }
                        }
                    }
                    if hi < lo {
                        return Err("reversed range in [...]");
                    }
                    ranges.push((lo, hi));
                }
                tokens.push(Token::Class { negated, ranges });
            }
            other => tokens.push(Token::Literal(other)),
        }
    }
    Ok(tokens)
}

fn match_segments(pattern: &[Segment], path: &[&str]) -> bool {
    match pattern.split_first() {
        None => path.is_empty(),
        Some((Segment::AnyDepth, rest)) => {
            // A trailing `**` needs at least one segment: `a/**` is what is inside `a`.
            let min = usize::from(rest.is_empty());
            (min..=path.len()).any(|skip| match_segments(rest, &path[skip..]))
        }
        Some((Segment::Glob(tokens), rest)) => match path.split_first() {
            Some((first, tail)) => match_glob(tokens, first) && match_segments(rest, tail),
            None => false,
        },
    }
}

/// Glob match of one segment; iterative with a single backtrack point for `*`
/// (linear in practice, no exponential blow-up).
fn match_glob(tokens: &[Token], text: &str) -> bool {
    let chars: Vec<char> = text.chars().collect();
    let (mut t, mut c) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while c < chars.len() {
        if t < tokens.len() {
            match &tokens[t] {
                Token::Star => {
                    star = Some((t, c));
                    t += 1;
                    continue;
                }
                token if token_matches(token, chars[c]) => {
                    t += 1;
                    c += 1;
                    continue;
                }
                _ => {}
            }
        }
        match star {
            Some((star_t, star_c)) => {
                t = star_t + 1;
                c = star_c + 1;
                star = Some((star_t, star_c + 1));
            }
            None => return false,
        }
    }
    tokens[t..].iter().all(|token| *token == Token::Star)
}

fn token_matches(token: &Token, c: char) -> bool {
    match token {
        Token::Literal(l) => *l == c,
        Token::AnyChar => true,
        Token::Star => true,
        Token::Class { negated, ranges } => {
            let inside = ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi);
            inside != *negated
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pattern: &str, path: &str, is_dir: bool) -> bool {
        let p = Pattern::parse(pattern).unwrap().unwrap();
        let segs: Vec<&str> = path.split('/').collect();
        p.matches(&segs, is_dir)
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
        assert!(m("é?", "éü", false));
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
    }

    #[test]
    fn dir_only_and_negation() {
        assert!(m("build/", "build", true));
        assert!(!m("build/", "build", false));
        let p = Pattern::parse("!keep").unwrap().unwrap();
        assert!(p.negated);
        assert!(Pattern::parse("# comment").unwrap().is_none());
        assert!(Pattern::parse("   ").unwrap().is_none());
        assert!(Pattern::parse("[abc").is_err());
        assert!(Pattern::parse("/").is_err());
        assert!(m("trail\\ ", "trail ", false));
        assert!(m("x  ", "x", false));
    }
}
