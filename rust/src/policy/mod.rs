//! The declarative capture policy of docs/contract.md#capture, compiled once.
//!
//! - `exclude` and `include` are gitignore pattern lists; within a list the
//!   last matching pattern decides and `!` re-includes.
//! - Exclude wins. A path is excluded when it or any ancestor directory is; so an
//!   excluded directory is never entered and nothing under it can come back.
//! - An empty `include` includes every file. A non-empty one filters files (and
//!   other non-directories) only: a file is included when the deepest of itself
//!   and its ancestors that the list decides on is decided positively (so
//!   `src/` includes everything under `src`, and `!src/gen/` takes it back).
//! - Default excludes: any `.git`, `node_modules` or `.env*` path segment.
//! - Top-level names starting with `.checkpointd` are reserved for restore
//!   staging and the stat cache's clock: always excluded.
//!
//! # The dialect is git's, to the byte
//!
//! Every line means what it means in a top-level `.gitignore` under git 2.x
//! (checked by `tests/native/test_policy_git.py` against the installed git):
//! `pattern.rs` reads the line as git's dir.c does, `wildmatch.rs` matches as
//! git's wildmatch does. The decisions that follow from "as git":
//!
//! - Matching is on bytes: `?`, `*` and `[...]` see the UTF-8 bytes of a name,
//!   so `?` does not match `é` (two bytes) but `??` does. POSIX classes
//!   (`[[:digit:]]`, `[[:alpha:]]`, ...) are ASCII only, from git's own table.
//!   Matching is case-sensitive (git's default `core.ignoreCase=false`).
//! - A line git accepts but that can never match (`/`, `!`, `a//b`, `build//`,
//!   `[abc` unterminated, `[[:nope:]]`, a trailing `\`, `a[/]b` in a path
//!   pattern) is kept as git keeps it, matching nothing, and is reported as a
//!   warning (`PolicyMatcher::warnings`, logged by Python) instead of failing
//!   the capture. A reversed range is a warning too, and matches as in git:
//!   `[z-a]` is the byte `z` plus an empty range, so it matches `z` only.
//! - Only an entry that cannot be one gitignore line is refused: one holding a
//!   line break or NUL (and, to bound the matcher's stack, more than 1024
//!   groups of `*`).
//! - Matching is memoised (see `wildmatch.rs`): a pattern such as
//!   `**/a*/**/a*/**/b` costs time linear in the path length times the pattern
//!   size, where git's own backtracking is polynomial of the pattern's degree.
//!
//! Why not a crate: `globset` (and `ignore`, built on it) compiles globs to
//! regexes and refuses lines git accepts (an unclosed `[`, a dangling `\`), so
//! a capture would fail where git silently matches nothing; its character
//! handling and its `**` corners (`ab**/c`, which git matches against `abc`)
//! are not git's either. git's behaviour is defined by its search, abort rules
//! included, so this reproduces that behaviour and is tested against git itself.

mod pattern;
mod wildmatch;

use pattern::Pattern;
pub use pattern::PatternError;

/// What one pattern list says about one path (without looking at ancestors).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    None,
    Matched,
    Negated,
}

/// A line git accepts silently but that is probably not what was meant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatternWarning {
    /// `"exclude"` or `"include"`.
    pub list: &'static str,
    pub pattern: String,
    /// Why, as a sentence (`"it never matches: ..."`).
    pub reason: String,
}

#[derive(Debug, Clone, Default)]
struct PatternList {
    patterns: Vec<Pattern>,
}

impl PatternList {
    fn compile<S: AsRef<str>>(
        list: &'static str,
        lines: &[S],
        warnings: &mut Vec<PatternWarning>,
    ) -> Result<PatternList, PatternError> {
        let mut patterns = Vec::with_capacity(lines.len());
        for line in lines {
            let line = line.as_ref();
            let Some(p) = Pattern::parse(line)? else {
                continue;
            };
            for oddity in p.oddities() {
                let reason = if oddity.never_matches {
                    format!("it never matches: {}", oddity.reason)
                } else {
                    oddity.reason.clone()
                };
                warnings.push(PatternWarning {
                    list,
                    pattern: line.to_string(),
                    reason,
                });
            }
            patterns.push(p);
        }
        Ok(PatternList { patterns })
    }

    fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    fn decide(&self, path: &str, is_dir: bool) -> Decision {
        let basename = path.rsplit('/').next().unwrap_or(path);
        for p in self.patterns.iter().rev() {
            if p.matches(path.as_bytes(), basename.as_bytes(), is_dir) {
                return if p.negated {
                    Decision::Negated
                } else {
                    Decision::Matched
                };
            }
        }
        Decision::None
    }
}

/// Reserved prefix for top-level names the capture never sees.
pub const RESERVED_PREFIX: &str = ".checkpointd";

#[derive(Debug, Clone)]
pub struct PolicyMatcher {
    exclude: PatternList,
    include: PatternList,
    default_excludes: bool,
    warnings: Vec<PatternWarning>,
    /// A digest of the lists and flag this matcher was compiled from.
    source_fingerprint: [u8; 32],
}

impl PolicyMatcher {
    /// Compile the lists. Errors name the first entry that cannot be a
    /// gitignore line; lines git accepts silently become `warnings()`.
    pub fn new<S: AsRef<str>>(
        exclude: &[S],
        include: &[S],
        default_excludes: bool,
    ) -> Result<PolicyMatcher, PatternError> {
        let mut warnings = Vec::new();
        let key = blake3::derive_key("checkpointd 2026-12 policy source fingerprint v1", b"");
        let mut source = blake3::Hasher::new_keyed(&key);
        for list in [exclude, include] {
            // Length-prefixed, so that lines cannot run into each other or across lists.
            source.update(&(list.len() as u64).to_le_bytes());
            for line in list {
                source.update(&(line.as_ref().len() as u64).to_le_bytes());
                source.update(line.as_ref().as_bytes());
            }
        }
        source.update(&[u8::from(default_excludes)]);
        Ok(PolicyMatcher {
            exclude: PatternList::compile("exclude", exclude, &mut warnings)?,
            include: PatternList::compile("include", include, &mut warnings)?,
            default_excludes,
            warnings,
            source_fingerprint: *source.finalize().as_bytes(),
        })
    }

    /// Equal for two matchers compiled from the same lists, in the same
    /// order, with the same default-excludes flag (what a scan's stat cache
    /// records so it can tell that a later scan applies the same policy).
    pub fn source_fingerprint(&self) -> [u8; 32] {
        self.source_fingerprint
    }

    /// Lines that git accepts but that never match or hold a reversed range,
    /// in list order (exclude first).
    pub fn warnings(&self) -> &[PatternWarning] {
        &self.warnings
    }

    pub fn has_include(&self) -> bool {
        !self.include.is_empty()
    }

    /// Whether any exclude or include pattern exists (if not, only names matter).
    pub fn has_patterns(&self) -> bool {
        !self.exclude.is_empty() || !self.include.is_empty()
    }

    /// The rules that need only the entry's name and depth (0 = top level):
    /// the reserved `.checkpointd*` prefix and the default excludes.
    pub fn excludes_name(&self, depth: usize, name: &str) -> bool {
        (depth == 0 && name.starts_with(RESERVED_PREFIX))
            || (self.default_excludes && is_default_excluded(name))
    }

    /// Whether the entry itself (ancestors aside) is excluded: `segments` is the
    /// full path, the last segment being the entry's name.
    pub fn excludes_entry(&self, segments: &[&str], is_dir: bool) -> bool {
        let Some(name) = segments.last() else {
            return false;
        };
        self.excludes_name(segments.len() - 1, name)
            || (!self.exclude.is_empty()
                && self.exclude.decide(&segments.join("/"), is_dir) == Decision::Matched)
    }

    /// The include list's own decision for the entry (ancestors aside).
    pub fn include_decision(&self, segments: &[&str], is_dir: bool) -> Decision {
        self.include.decide(&segments.join("/"), is_dir)
    }

    /// Inherit an inclusion state: the entry's own decision, else its parent's.
    pub fn included_below(&self, parent_included: bool, segments: &[&str], is_dir: bool) -> bool {
        if self.include.is_empty() {
            return true;
        }
        match self.include_decision(segments, is_dir) {
            Decision::Matched => true,
            Decision::Negated => false,
            Decision::None => parent_included,
        }
    }

    /// True when `path` or one of its ancestor directories is excluded.
    pub fn excluded(&self, path: &str, is_dir: bool) -> bool {
        let segments: Vec<&str> = split_path(path);
        (1..=segments.len()).any(|n| {
            let entry_is_dir = n < segments.len() || is_dir;
            self.excludes_entry(&segments[..n], entry_is_dir)
        })
    }

    /// True when `path` is not excluded and, unless it is a directory, included.
    pub fn selects(&self, path: &str, is_dir: bool) -> bool {
        if self.excluded(path, is_dir) {
            return false;
        }
        if is_dir {
            return true;
        }
        self.included(path, is_dir)
    }

    /// Whether the include list takes `path` (deepest decision among it and its ancestors).
    pub fn included(&self, path: &str, is_dir: bool) -> bool {
        if self.include.is_empty() {
            return true;
        }
        let segments: Vec<&str> = split_path(path);
        let mut state = false;
        for n in 1..=segments.len() {
            let entry_is_dir = n < segments.len() || is_dir;
            state = self.included_below(state, &segments[..n], entry_is_dir);
        }
        state
    }
}

fn split_path(path: &str) -> Vec<&str> {
    path.split('/').filter(|s| !s.is_empty()).collect()
}

/// The path segments a policy leaves out by default (docs/contract.md#capture
/// default excludes): a name, or a prefix when it ends in `*`.
pub const DEFAULT_EXCLUDES: [&str; 3] = [".git", "node_modules", ".env*"];

/// Whether `name` is one of the [`DEFAULT_EXCLUDES`] segments.
pub fn is_default_excluded(name: &str) -> bool {
    DEFAULT_EXCLUDES
        .iter()
        .any(|segment| match segment.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == *segment,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(exclude: &[&str], include: &[&str], defaults: bool) -> PolicyMatcher {
        PolicyMatcher::new(exclude, include, defaults).unwrap()
    }

    /// (exclude, include, default_excludes, path, is_dir, selected)
    type Case = (
        &'static [&'static str],
        &'static [&'static str],
        bool,
        &'static str,
        bool,
        bool,
    );

    #[test]
    fn table() {
        // (exclude, include, defaults, path, is_dir, selected)
        let cases: &[Case] = &[
            (&[], &[], true, "a/b.txt", false, true),
            (&[], &[], true, ".git", true, false),
            (&[], &[], true, "x/.git/config", false, false),
            (&[], &[], true, "web/node_modules/m/i.js", false, false),
            (&[], &[], true, ".env", false, false),
            (&[], &[], true, "app/.env.local", false, false),
            (&[], &[], false, "app/.env.local", false, true),
            (&[], &[], false, ".checkpointd-staging/x", false, false),
            (&[], &[], false, "a/.checkpointd-x", false, true),
            (&["*.log"], &[], true, "a/b/c.log", false, false),
            (
                &["*.log", "!keep.log"],
                &[],
                true,
                "a/keep.log",
                false,
                true,
            ),
            (&["/top.txt"], &[], true, "top.txt", false, false),
            (&["/top.txt"], &[], true, "sub/top.txt", false, true),
            (&["build/"], &[], true, "build", true, false),
            (&["build/"], &[], true, "build/out.o", false, false),
            (&["build/"], &[], true, "build", false, true),
            (
                &["build/", "!build/keep"],
                &[],
                true,
                "build/keep",
                false,
                false,
            ),
            (&["a/**/z"], &[], true, "a/z", false, false),
            (&["a/**/z"], &[], true, "a/b/c/z", false, false),
            (&["a/**"], &[], true, "a", true, true),
            (&["a/**"], &[], true, "a/q", false, false),
            (&[], &["*.py"], true, "src/m.py", false, true),
            (&[], &["*.py"], true, "src/m.txt", false, false),
            (&[], &["*.py"], true, "src", true, true),
            (&[], &["src/"], true, "src/deep/m.txt", false, true),
            (
                &[],
                &["src/", "!src/gen/"],
                true,
                "src/gen/m.txt",
                false,
                false,
            ),
            (&["*.py"], &["*.py"], true, "m.py", false, false),
        ];
        for (exclude, include, defaults, path, is_dir, want) in cases {
            let m = matcher(exclude, include, *defaults);
            assert_eq!(
                m.selects(path, *is_dir),
                *want,
                "exclude={exclude:?} include={include:?} path={path} dir={is_dir}"
            );
        }
    }

    #[test]
    fn lines_git_accepts_are_warnings_not_errors() {
        let m = PolicyMatcher::new(&["[x", "/", "*.log"], &["a//b"], true).unwrap();
        let lists: Vec<(&str, &str)> = m
            .warnings()
            .iter()
            .map(|w| (w.list, w.pattern.as_str()))
            .collect();
        assert_eq!(
            lists,
            [("exclude", "[x"), ("exclude", "/"), ("include", "a//b")]
        );
        assert!(m
            .warnings()
            .iter()
            .all(|w| w.reason.starts_with("it never matches")));
        // An include list whose only line never matches includes nothing.
        assert!(!m.selects("x", false));
        let m = PolicyMatcher::new(&["[x", "/", "*.log"], &[], true).unwrap();
        assert!(m.selects("[x", false));
        assert!(m.selects("x", false));
        assert!(!m.selects("a.log", false));
        assert!(PolicyMatcher::new(&["a\nb"], &[], true).is_err());
    }
}
