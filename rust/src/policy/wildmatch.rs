//! git's `wildmatch()` over bytes, memoised so no pattern can make it backtrack
//! for long.
//!
//! The pattern is compiled once into tokens that carry the decisions git makes
//! while it reads the pattern (which `**` may cross a `/`, which `[...]` git
//! cannot parse, where a `*` may skip ahead to a literal), then matched by a
//! function with git's four outcomes: match, no match, and the two "abort"
//! answers git uses to cut its own backtracking (`AbortAll`: no later start can
//! match either; `AbortToStarStar`: only an enclosing `**` may go on). Keeping
//! those outcomes (not just match or not) is what makes this agree with git in
//! every corner, because git's answer is defined by its search, aborts included.
//!
//! git's search is plain backtracking: `**/a*/**/a*/**/b` against a path of
//! `d` segments costs it about d³ steps, and more `**` cost more. Here both
//! recursive steps are pure functions of (pattern position, text position), so
//! each is computed once per match and remembered: the matcher does at most
//! (tokens + 3 × star groups) × (text length + 1) steps, whatever the pattern.
//! Patterns with at most one star group cannot backtrack and skip the table.

/// What one matching step found (git's `WM_*` results).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Match,
    NoMatch,
    /// The text ran out or the pattern is broken: no later start can match.
    AbortAll,
    /// A single `*` would have to cross a `/`: only an enclosing `**` goes on.
    AbortToStarStar,
}

impl Outcome {
    fn encode(self) -> u8 {
        match self {
            Outcome::Match => 1,
            Outcome::NoMatch => 2,
            Outcome::AbortAll => 3,
            Outcome::AbortToStarStar => 4,
        }
    }

    fn decode(byte: u8) -> Option<Outcome> {
        match byte {
            1 => Some(Outcome::Match),
            2 => Some(Outcome::NoMatch),
            3 => Some(Outcome::AbortAll),
            4 => Some(Outcome::AbortToStarStar),
            _ => None,
        }
    }
}

/// A run of consecutive `*`, with the decisions git takes from its neighbours.
#[derive(Debug, Clone, PartialEq, Eq)]
struct StarRun {
    /// Whether the run may consume a `/`: `**` bounded by `/` (or the pattern's
    /// ends) in a path match, any run in a basename match.
    crosses_slash: bool,
    /// `**/` may also match nothing at all, its `/` included (`a/**/b` ~ `a/b`).
    may_skip_slash: bool,
    /// A single `*` followed by a plain `/`: it takes exactly up to the next `/`.
    takes_one_segment: bool,
    /// The plain byte right after the run (not `*?[\`): git skips ahead to it.
    next_literal: Option<u8>,
    /// Nothing follows the run.
    at_end: bool,
    /// Rows in the memo table (see `Matcher`).
    loop_row: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    /// One byte compared as is (a plain byte, or the byte after a `\`).
    Byte(u8),
    /// A `\` ending the pattern: git compares it with the text's terminating
    /// NUL, so it never matches.
    DanglingEscape,
    /// `?`: any one byte (but `/` in a path match).
    AnyByte,
    /// `[...]`, index into `Glob::classes`.
    Class(usize),
    /// A `[` git cannot read (unterminated, unknown `[:name:]`): reaching it
    /// ends the whole match without a match.
    BrokenClass,
    Stars(StarRun),
}

/// The bytes one `[...]` accepts (negation already applied).
#[derive(Debug, Clone, PartialEq, Eq)]
struct ByteSet([u64; 4]);

impl ByteSet {
    fn empty() -> ByteSet {
        ByteSet([0; 4])
    }

    fn insert(&mut self, byte: u8) {
        self.0[usize::from(byte >> 6)] |= 1 << (byte & 63);
    }

    fn insert_range(&mut self, lo: u8, hi: u8) {
        for byte in lo..=hi {
            self.insert(byte);
        }
    }

    fn contains(&self, byte: u8) -> bool {
        self.0[usize::from(byte >> 6)] & (1 << (byte & 63)) != 0
    }

    fn complement(&self) -> ByteSet {
        ByteSet(self.0.map(|word| !word))
    }

    fn is_empty_apart_from_slash(&self) -> bool {
        let mut copy = self.clone();
        copy.0[usize::from(b'/' >> 6)] &= !(1 << (b'/' & 63));
        copy.0 == [0; 4]
    }
}

/// Something odd git accepts silently; `never_matches` when the line is dead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Oddity {
    pub reason: String,
    pub never_matches: bool,
}

/// A compiled wildmatch pattern.
#[derive(Debug, Clone)]
pub struct Glob {
    tokens: Vec<Token>,
    classes: Vec<ByteSet>,
    /// `WM_PATHNAME`: `*`, `?` and `[...]` never match `/`; `**` rules apply.
    pathname: bool,
    /// Star runs; more than one means the matcher needs its memo table.
    star_runs: usize,
    /// Memo rows: one per star run for its loop, plus the token rows where a
    /// recursive step can start (`entry_row[token]`, `usize::MAX` if none).
    entry_row: Vec<usize>,
    rows: usize,
    oddities: Vec<Oddity>,
}

/// More star groups than this in one pattern is refused: the matcher recurses
/// once per group, and the limit keeps its stack small on any thread.
pub const MAX_STAR_RUNS: usize = 1024;

/// git's glob-special bytes (`is_glob_special`): where its literal prefix ends
/// and where a `*` stops skipping ahead.
fn is_glob_special(byte: u8) -> bool {
    matches!(byte, b'*' | b'?' | b'[' | b'\\')
}

/// Length of the leading part without a glob-special byte (git's `simple_length`).
pub fn literal_prefix_len(pattern: &[u8]) -> usize {
    pattern
        .iter()
        .position(|&b| is_glob_special(b))
        .unwrap_or(pattern.len())
}

impl Glob {
    /// Compile `pattern` for a path match (`pathname`) or a basename match.
    /// Err when the pattern has more than `MAX_STAR_RUNS` star groups.
    pub fn compile(pattern: &[u8], pathname: bool) -> Result<Glob, usize> {
        let mut glob = Glob {
            tokens: Vec::new(),
            classes: Vec::new(),
            pathname,
            star_runs: 0,
            entry_row: Vec::new(),
            rows: 0,
            oddities: Vec::new(),
        };
        // git hands wildmatch the pattern minus its literal prefix (a speed-up in
        // `match_pathname`), so a `**` right after that prefix counts as being at
        // the start of the pattern: `ab**/c` matches `abc` and `abx/y/c`.
        let wildmatch_start = if pathname {
            literal_prefix_len(pattern)
        } else {
            0
        };
        let mut i = 0;
        while i < pattern.len() {
            let byte = pattern[i];
            match byte {
                b'\\' => match pattern.get(i + 1) {
                    Some(&escaped) => {
                        glob.tokens.push(Token::Byte(escaped));
                        i += 2;
                    }
                    None => {
                        glob.note("a trailing `\\` escapes nothing", true);
                        glob.tokens.push(Token::DanglingEscape);
                        i += 1;
                    }
                },
                b'?' => {
                    glob.tokens.push(Token::AnyByte);
                    i += 1;
                }
                b'*' => {
                    let end = i + pattern[i..].iter().take_while(|&&b| b == b'*').count();
                    let run = glob.star_run(pattern, i, end, wildmatch_start);
                    glob.tokens.push(Token::Stars(run));
                    glob.star_runs += 1;
                    i = end;
                }
                b'[' => i = glob.class_token(pattern, i),
                _ => {
                    glob.tokens.push(Token::Byte(byte));
                    i += 1;
                }
            }
        }
        if glob.star_runs > MAX_STAR_RUNS {
            return Err(glob.star_runs);
        }
        if pathname {
            glob.note_slash_oddities();
        }
        glob.assign_memo_rows();
        Ok(glob)
    }

    /// Compile the `[...]` class at `pattern[start]`; where the pattern goes on.
    fn class_token(&mut self, pattern: &[u8], start: usize) -> usize {
        let pathname = self.pathname;
        match parse_class(pattern, start) {
            Ok(class) => {
                for (lo, hi) in &class.reversed {
                    self.note(
                        &format!(
                            "the range {}-{} in `[...]` is reversed and matches no byte",
                            show(*lo),
                            show(*hi)
                        ),
                        false,
                    );
                }
                let dead = if pathname {
                    class.accepts.is_empty_apart_from_slash()
                } else {
                    class.accepts.0 == [0; 4]
                };
                if dead {
                    self.note(
                        &format!(
                            "the class {} matches no byte of a path",
                            String::from_utf8_lossy(&pattern[start..class.end])
                        ),
                        true,
                    );
                }
                self.tokens.push(Token::Class(self.classes.len()));
                self.classes.push(class.accepts);
                class.end
            }
            Err(reason) => {
                self.note(reason, true);
                self.tokens.push(Token::BrokenClass);
                // git stops reading the pattern here.
                pattern.len()
            }
        }
    }

    fn note(&mut self, reason: &str, never_matches: bool) {
        self.oddities.push(Oddity {
            reason: reason.to_string(),
            never_matches,
        });
    }

    /// The decisions git makes for the `*` run at `pattern[start..end]`.
    fn star_run(
        &self,
        pattern: &[u8],
        start: usize,
        end: usize,
        wildmatch_start: usize,
    ) -> StarRun {
        let next = pattern.get(end).copied();
        let crosses_slash = if !self.pathname {
            // Without WM_PATHNAME every `*` crosses `/` (a basename has none).
            true
        } else if end - start >= 2 {
            let after_boundary = start == wildmatch_start || pattern[start - 1] == b'/';
            let before_boundary = match next {
                None | Some(b'/') => true,
                Some(b'\\') => pattern.get(end + 1) == Some(&b'/'),
                Some(_) => false,
            };
            after_boundary && before_boundary
        } else {
            false
        };
        StarRun {
            crosses_slash,
            may_skip_slash: crosses_slash && self.pathname && next == Some(b'/'),
            takes_one_segment: !crosses_slash && next == Some(b'/'),
            next_literal: next.filter(|&b| !is_glob_special(b)),
            at_end: next.is_none(),
            loop_row: 0,
        }
    }

    /// Lines that need an empty path segment, or a path starting or ending
    /// with `/`, can never match a path.
    fn note_slash_oddities(&mut self) {
        let slash = |t: Option<&Token>| t == Some(&Token::Byte(b'/'));
        if slash(self.tokens.first()) {
            self.note(
                "it needs a path that starts with `/` (git strips only one leading `/`)",
                true,
            );
        } else if self
            .tokens
            .windows(2)
            .any(|w| slash(w.first()) && slash(w.get(1)))
        {
            self.note(
                "it needs an empty path segment (`//`), which no path has",
                true,
            );
        } else if slash(self.tokens.last()) {
            self.note(
                "it needs a path that ends with `/` (git strips only one trailing `/`)",
                true,
            );
        }
    }

    fn assign_memo_rows(&mut self) {
        let mut rows = 0;
        self.entry_row = vec![usize::MAX; self.tokens.len() + 1];
        let mut entries = Vec::new();
        for (index, token) in self.tokens.iter_mut().enumerate() {
            if let Token::Stars(run) = token {
                run.loop_row = rows;
                rows += 1;
                // The loop calls the step at the token after the run; `**/`
                // also tries the token after its `/`.
                entries.push(index + 1);
                entries.push(index + 2);
            }
        }
        for entry in entries {
            if entry <= self.tokens.len() && self.entry_row[entry] == usize::MAX {
                self.entry_row[entry] = rows;
                rows += 1;
            }
        }
        self.rows = rows;
    }

    /// What git silently accepts about this pattern.
    pub fn oddities(&self) -> &[Oddity] {
        &self.oddities
    }

    /// Whether the pattern matches all of `text` (git's `wildmatch() == 0`).
    pub fn matches(&self, text: &[u8]) -> bool {
        let memo = (self.star_runs > 1).then(|| vec![0u8; self.rows * (text.len() + 1)]);
        let mut matcher = Matcher {
            glob: self,
            text,
            memo,
        };
        matcher.step(0, 0) == Outcome::Match
    }
}

struct Matcher<'a> {
    glob: &'a Glob,
    text: &'a [u8],
    /// `rows × (text.len() + 1)` remembered outcomes (0 = not computed yet).
    memo: Option<Vec<u8>>,
}

impl Matcher<'_> {
    fn remembered(&self, row: usize, t: usize) -> Option<Outcome> {
        let memo = self.memo.as_ref()?;
        if row == usize::MAX {
            return None;
        }
        Outcome::decode(memo[row * (self.text.len() + 1) + t])
    }

    fn remember(&mut self, row: usize, from: usize, to: usize, outcome: Outcome) {
        let width = self.text.len() + 1;
        if let (Some(memo), true) = (self.memo.as_mut(), row != usize::MAX) {
            memo[row * width + from..=row * width + to].fill(outcome.encode());
        }
    }

    /// git's `dowild(p, text)`: the pattern from token `p` against the text
    /// from byte `t`.
    fn step(&mut self, p: usize, t: usize) -> Outcome {
        let row = self.glob.entry_row.get(p).copied().unwrap_or(usize::MAX);
        if let Some(known) = self.remembered(row, t) {
            return known;
        }
        let outcome = self.step_uncached(p, t);
        self.remember(row, t, t, outcome);
        outcome
    }

    fn step_uncached(&mut self, mut p: usize, mut t: usize) -> Outcome {
        let glob = self.glob;
        let text = self.text;
        loop {
            let Some(token) = glob.tokens.get(p) else {
                return if t == text.len() {
                    Outcome::Match
                } else {
                    Outcome::NoMatch
                };
            };
            let byte = match (text.get(t), token) {
                (Some(&byte), _) => byte,
                // At the end of the text only a `*` may go on (it may match nothing).
                (None, Token::Stars(_)) => 0,
                (None, _) => return Outcome::AbortAll,
            };
            match token {
                Token::Byte(want) => {
                    if byte != *want {
                        return Outcome::NoMatch;
                    }
                }
                Token::DanglingEscape => return Outcome::NoMatch,
                Token::AnyByte => {
                    if glob.pathname && byte == b'/' {
                        return Outcome::NoMatch;
                    }
                }
                Token::Class(index) => {
                    if !glob.classes[*index].contains(byte) || (glob.pathname && byte == b'/') {
                        return Outcome::NoMatch;
                    }
                }
                Token::BrokenClass => return Outcome::AbortAll,
                Token::Stars(run) => {
                    if run.at_end {
                        return if run.crosses_slash || !text[t..].contains(&b'/') {
                            Outcome::Match
                        } else {
                            Outcome::NoMatch
                        };
                    }
                    if run.takes_one_segment {
                        // The run and the `/` after it: up to and over the next `/`.
                        let Some(offset) = text[t..].iter().position(|&b| b == b'/') else {
                            return Outcome::NoMatch;
                        };
                        t += offset + 1;
                        p += 2;
                        continue;
                    }
                    if run.may_skip_slash && self.step(p + 2, t) == Outcome::Match {
                        return Outcome::Match;
                    }
                    return self.star_loop(p, run, t);
                }
            }
            p += 1;
            t += 1;
        }
    }

    /// The run at token `p` takes more and more of the text from `start`;
    /// after each length the rest of the pattern is tried.
    fn star_loop(&mut self, p: usize, run: &StarRun, start: usize) -> Outcome {
        let text = self.text;
        let mut t = start;
        let outcome = loop {
            if let Some(known) = self.remembered(run.loop_row, t) {
                break known;
            }
            if t == text.len() {
                break Outcome::AbortAll;
            }
            if let Some(literal) = run.next_literal {
                // What the run takes ends just before the next occurrence of
                // the literal that follows it (and, for `*`, before a `/`).
                while t < text.len() && text[t] != literal && (run.crosses_slash || text[t] != b'/')
                {
                    t += 1;
                }
                if text.get(t) != Some(&literal) {
                    break Outcome::NoMatch;
                }
            }
            let rest = self.step(p + 1, t);
            if rest != Outcome::NoMatch {
                if !run.crosses_slash || rest != Outcome::AbortToStarStar {
                    break rest;
                }
            } else if !run.crosses_slash && text[t] == b'/' {
                break Outcome::AbortToStarStar;
            }
            t += 1;
        };
        // Every start from `start` to `t` reaches the same answer: the skipped
        // positions lead to the same next try as `start` did.
        let last = t.min(text.len());
        self.remember(run.loop_row, start, last, outcome);
        outcome
    }
}

struct ParsedClass {
    accepts: ByteSet,
    /// Index just past the closing `]`.
    end: usize,
    reversed: Vec<(u8, u8)>,
}

/// A `[` at `pattern[open]`, read the way git reads it: `!` or `^` negates; a
/// `]` first is literal; `\` escapes; `a-z` ranges (reversed ones match
/// nothing); `[:name:]` classes (ASCII only, as git's own ctype table).
fn parse_class(pattern: &[u8], open: usize) -> Result<ParsedClass, &'static str> {
    const UNTERMINATED: &str = "the `[` is never closed";
    let at = |i: usize| pattern.get(i).copied();
    let mut i = open + 1;
    let negated = matches!(at(i), Some(b'!') | Some(b'^'));
    if negated {
        i += 1;
    }
    let mut set = ByteSet::empty();
    let mut reversed = Vec::new();
    // The previous single byte, which a following `-` turns into a range start;
    // none at the start and after a range or a `[:name:]`.
    let mut previous: Option<u8> = None;
    let mut first = true;
    loop {
        let Some(mut byte) = at(i) else {
            return Err(UNTERMINATED);
        };
        if byte == b']' && !first {
            break;
        }
        first = false;
        if byte == b'\\' {
            i += 1;
            byte = at(i).ok_or(UNTERMINATED)?;
            set.insert(byte);
            previous = Some(byte);
        } else if let (b'-', Some(lo), Some(next)) = (byte, previous, at(i + 1)) {
            if next == b']' {
                set.insert(b'-');
                previous = Some(b'-');
            } else {
                i += 1;
                let mut hi = next;
                if hi == b'\\' {
                    i += 1;
                    hi = at(i).ok_or(UNTERMINATED)?;
                }
                if lo <= hi {
                    set.insert_range(lo, hi);
                } else {
                    reversed.push((lo, hi));
                }
                previous = None;
            }
        } else if byte == b'[' && at(i + 1) == Some(b':') {
            let name_start = i + 2;
            let Some(close) = pattern[name_start..].iter().position(|&b| b == b']') else {
                return Err(UNTERMINATED);
            };
            let close = name_start + close;
            if close == name_start || pattern[close - 1] != b':' {
                // No `:]` before the `]`: the `[` is an ordinary member.
                set.insert(b'[');
                previous = Some(b'[');
            } else {
                let name = &pattern[name_start..close - 1];
                let members = posix_class(name).ok_or("it names an unknown `[:class:]`")?;
                for b in 0..=255u8 {
                    if members(b) {
                        set.insert(b);
                    }
                }
                previous = None;
                i = close;
            }
        } else {
            set.insert(byte);
            previous = Some(byte);
        }
        i += 1;
    }
    Ok(ParsedClass {
        accepts: if negated { set.complement() } else { set },
        end: i + 1,
        reversed,
    })
}

/// git's POSIX classes: ASCII only, from git's own ctype table (never the locale).
fn posix_class(name: &[u8]) -> Option<fn(u8) -> bool> {
    Some(match name {
        b"alnum" => |b: u8| b.is_ascii_alphanumeric(),
        b"alpha" => |b: u8| b.is_ascii_alphabetic(),
        b"blank" => |b: u8| b == b' ' || b == b'\t',
        b"cntrl" => |b: u8| b.is_ascii_control(),
        b"digit" => |b: u8| b.is_ascii_digit(),
        b"graph" => |b: u8| b.is_ascii_graphic(),
        b"lower" => |b: u8| b.is_ascii_lowercase(),
        b"print" => |b: u8| b.is_ascii_graphic() || b == b' ',
        b"punct" => |b: u8| b.is_ascii_punctuation(),
        // git's isspace: no \v or \f.
        b"space" => |b: u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r'),
        b"upper" => |b: u8| b.is_ascii_uppercase(),
        b"xdigit" => |b: u8| b.is_ascii_hexdigit(),
        _ => return None,
    })
}

fn show(byte: u8) -> String {
    if byte.is_ascii_graphic() {
        char::from(byte).to_string()
    } else {
        format!("\\x{byte:02x}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A direct transcription of git's backtracking search (no memo), to check
    /// the memoised matcher against on random inputs.
    fn reference(glob: &Glob, p: usize, t: usize, text: &[u8]) -> Outcome {
        let mut m = Matcher {
            glob,
            text,
            memo: None,
        };
        m.step(p, t)
    }

    fn path(pattern: &str, text: &str) -> bool {
        Glob::compile(pattern.as_bytes(), true)
            .unwrap()
            .matches(text.as_bytes())
    }

    fn base(pattern: &str, text: &str) -> bool {
        Glob::compile(pattern.as_bytes(), false)
            .unwrap()
            .matches(text.as_bytes())
    }

    #[test]
    fn git_wildmatch_cases() {
        // From git's t3070 (the WM_PATHNAME column) and the probes.
        assert!(path("foo", "foo"));
        assert!(!path("foo", "bar"));
        assert!(path("???", "foo"));
        assert!(path("*f", "f"));
        assert!(!path("*f", "a/f"));
        assert!(path("*/f", "a/f"));
        assert!(path("**/f", "f"));
        assert!(path("**/f", "a/b/f"));
        assert!(path("a/**/f", "a/f"));
        assert!(path("a/**/f", "a/x/y/f"));
        assert!(path("a/**", "a/x/y"));
        assert!(!path("a/**", "a"));
        assert!(path("a**b", "axxb"));
        assert!(!path("a**b", "a/b"));
        assert!(path("[[:digit:]]x", "7x"));
        assert!(!path("[[:digit:]]x", "ax"));
        assert!(path("[!a]", "b"));
        assert!(path("[^a]", "b"));
        assert!(!path("[!a]", "/"));
        assert!(path("[]]", "]"));
        assert!(path("[a-]", "-"));
        assert!(path("[[:]", ":"));
        // git adds the byte before `-` on its own, then the (empty) range.
        assert!(!path("[z-a]", "m"));
        assert!(path("[z-a]", "z"));
        assert!(path("[z-ab]", "b"));
        assert!(!path("[abc", "a"));
        assert!(!path("[[:nope:]]", "a"));
        assert!(!path("a\\", "a\\"));
        assert!(path("\\*", "*"));
        assert!(!path("\\*", "x"));
        // `?` is one byte: é is two.
        assert!(!path("?", "é"));
        assert!(path("??", "é"));
        assert!(!path("[é]", "é"));
        assert!(path("[é][é]", "é"));
        // A `**` right after git's literal prefix counts as at the start.
        assert!(path("ab**/c", "abc"));
        assert!(path("ab**/c", "abx/y/c"));
        assert!(path("x/ab**/c", "x/abc"));
        assert!(!path("x/ab**/c", "abc"));
        assert!(base("*", "anything"));
        assert!(base("**", "x"));
        assert!(base("a?c", "abc"));
    }

    #[test]
    fn oddities_are_reported() {
        let never = |p: &str| {
            Glob::compile(p.as_bytes(), true)
                .unwrap()
                .oddities()
                .iter()
                .any(|o| o.never_matches)
        };
        assert!(never("a//b"));
        assert!(never("/a"));
        assert!(never("build/"));
        assert!(never("[abc"));
        assert!(never("a\\"));
        assert!(never("a[/]b"));
        assert!(!never("[z-a]"));
        let reversed = Glob::compile(b"[z-a]", true).unwrap();
        assert!(reversed.oddities()[0].reason.contains("reversed"));
        assert!(!never("a/**/b"));
        assert!(!never("[z-ab]"));
    }

    #[test]
    fn deep_chains_are_fast() {
        let text = "a/".repeat(600).into_bytes();
        let text = &text[..text.len() - 1];
        let glob = Glob::compile(b"**/a*/**/a*/**/b", true).unwrap();
        let started = std::time::Instant::now();
        assert!(!glob.matches(text));
        let mut with_b = text.to_vec();
        with_b.extend_from_slice(b"/b");
        assert!(glob.matches(&with_b));
        // Not a speed assertion: a bound that only a runaway search breaks.
        assert!(started.elapsed().as_secs() < 5);
    }

    /// A tiny xorshift so the test needs no crate.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
            items[(self.next() % items.len() as u64) as usize]
        }
    }

    #[test]
    fn memo_agrees_with_plain_backtracking() {
        let atoms = [
            "a", "b", "/", "*", "**", "?", "[ab]", "[!a]", "\\*", "**/", "/**", "/**/", "[a-", "é",
        ];
        let text_atoms = ["a", "b", "/", "ab", "é", "*"];
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..20_000 {
            let pattern: String = (0..1 + rng.next() % 6).map(|_| rng.pick(&atoms)).collect();
            let text: String = (0..rng.next() % 8).map(|_| rng.pick(&text_atoms)).collect();
            for pathname in [true, false] {
                let glob = Glob::compile(pattern.as_bytes(), pathname).unwrap();
                let plain = reference(&glob, 0, 0, text.as_bytes()) == Outcome::Match;
                assert_eq!(
                    glob.matches(text.as_bytes()),
                    plain,
                    "{pattern:?} vs {text:?} pathname={pathname}"
                );
            }
        }
    }
}
