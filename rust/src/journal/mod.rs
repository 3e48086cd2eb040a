//! The change journal: what changed in the workspace since the last capture,
//! learnt from the kernel instead of by looking (docs/design.md, "The change
//! journal").
//!
//! A thread reads the kernel's events (fanotify with a filesystem mark and
//! `FAN_REPORT_DFID_NAME`, or inotify with a watch per directory, added as
//! directories appear) and records the directories and names they touch in a
//! bounded [`Dirty`] set. A capture takes that set ([`Journal::take`]): with a
//! trustworthy journal it examines only what the set names and takes every
//! other row from the parent manifest (`journal::scan`); otherwise it scans
//! everything and the [`Ticket`] says why.
//!
//! **Trust.** The journal is trusted only while it provably saw every change
//! since a full scan: it starts untrusted (a fresh daemon), and a queue
//! overflow, a watch it could not add, the root deleted, moved or replaced, an
//! event it cannot attribute, a hard link to a file whose other names it does
//! not know, or [`Journal::distrust`] (a restore, a verifying scan that found
//! a difference) make it untrusted again. A full scan taken once the journal
//! watches the whole tree, with no loss of trust since, restores it
//! ([`Journal::commit`]).
//!
//! **Hard links.** A write through one name of a file is reported for that
//! name's directory only, and one through a name outside the workspace not
//! at all, so a regular file with more than one name is looked at (lstat) by
//! every capture.
//!
//! **Blind spots** (a full scan finds them, and so does the verifying scan):
//! writes through a shared `mmap` (no event reports them), changes made
//! through another mount of the same filesystem that a mark does not cover
//! (inotify watches the inodes, so it sees those; fanotify's filesystem mark
//! too), a filesystem mounted onto a directory of the workspace.

mod digests;
pub mod dirty;
mod links;
pub mod scan;
mod source;
pub(crate) mod splice;
mod tree;
pub mod verify;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

pub use dirty::{DirChanges, Dirty, Limits};
use source::{DirRef, Event, Source};

use crate::policy::PolicyMatcher;

/// How the daemon was asked to watch (`serve --watch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requested {
    Auto,
    Fanotify,
    Inotify,
    Off,
}

impl Requested {
    pub fn parse(text: &str) -> Option<Requested> {
        match text {
            "auto" => Some(Requested::Auto),
            "fanotify" => Some(Requested::Fanotify),
            "inotify" => Some(Requested::Inotify),
            "off" => Some(Requested::Off),
            _ => None,
        }
    }
}

/// What a capture took from the journal: the changes to examine, or why it
/// must scan everything. Given back with [`Journal::commit`] once the capture
/// is stored, or [`Journal::abort`] when it failed.
#[derive(Clone, Debug)]
pub struct Ticket {
    pub dirty: Dirty,
    /// Why everything must be scanned; None: the journal may direct the scan.
    pub full: Option<String>,
    /// Trust lost this many times when it was taken.
    untrust_gen: u64,
    /// The journal watched the whole tree when it was taken.
    ready: bool,
    /// Events recorded when it was taken.
    pub generation: u64,
    /// The inodes of the hard-linked files the journal knows every name of
    /// (those names are in `dirty`): a file with other names that is not
    /// one of them makes the scan a full one (its other names are unknown).
    pub linked: HashSet<(u64, u64)>,
    /// Holds the journal's walk of the whole tree back while the full scan
    /// this ticket was taken for runs (see [`Inner::walk_held`]).
    _hold: Option<Arc<()>>,
}

/// The journal's state, as `GetServerInfo` and the serve loop read it.
#[derive(Clone, Debug, Default)]
pub struct Status {
    /// "fanotify", "inotify" or "off".
    pub mode: String,
    pub detail: String,
    /// Why the next capture scans everything (None: it may not need to).
    pub untrusted: Option<String>,
    /// Events recorded since the journal started.
    pub generation: u64,
    /// Changes are waiting for a capture.
    pub pending: bool,
    /// Milliseconds since the last event, and since the oldest change waiting.
    pub idle_ms: Option<u64>,
    pub pending_ms: Option<u64>,
    pub events: u64,
    pub overflows: u64,
    pub watches: u64,
    pub linked_files: u64,
    /// The journal has walked the whole tree (watches every directory).
    pub ready: bool,
}

/// Reused event buffers (64 KiB: a few thousand events per read).
const READ_BUFFER: usize = 64 << 10;
/// Directory handles remembered (fanotify); past it the memory starts afresh.
const HANDLES_KEPT: usize = 65_536;
/// Names beginning with this in the root belong to the scan's own clock file.
const CLOCK_PREFIX: &[u8] = b".checkpointd-clock-";

struct State {
    mode: &'static str,
    detail: String,
    /// Switched off at run time (why).
    off: Option<String>,
    dirty: Dirty,
    untrust: Option<String>,
    untrust_gen: u64,
    /// Directories to walk (watch, find hard links) and the subtree each is in.
    queue: Vec<(String, String)>,
    /// Subtrees being walked, and their directories still queued.
    walking: HashMap<String, usize>,
    wds: HashMap<i32, String>,
    paths: BTreeMap<String, i32>,
    /// Watches removed by us whose `IN_IGNORED` is still to come.
    removed: HashSet<i32>,
    handles: HashMap<Vec<u8>, Option<String>>,
    /// Hard-linked files (looked at by every capture).
    links: links::Links,
    /// Files fanotify named by inode in the events being applied, and the
    /// workspace names they were reached by (checked once the batch is in).
    objects: Vec<(Vec<u8>, Option<String>)>,
    generation: u64,
    last_event: Option<Instant>,
    first_pending: Option<Instant>,
    events: u64,
    overflows: u64,
    buffer: Vec<u8>,
}

struct Inner {
    /// The root, canonical (fanotify resolves handles to such paths).
    root: PathBuf,
    root_fd: OwnedFd,
    root_id: (u64, u64),
    policy: PolicyMatcher,
    limits: Limits,
    source: Option<Source>,
    /// Written to stop the thread.
    stop: OwnedFd,
    state: Mutex<State>,
    /// Cloned into the tickets of full scans taken while the walk of the
    /// whole tree was not over (see [`Inner::walk_held`]).
    walk_hold: Arc<()>,
}

/// The journal of one workspace (see the module docs). Owns a thread, which
/// [`Journal::close`] (or dropping it) stops.
pub struct Journal {
    inner: Arc<Inner>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    pid: u32,
}

impl Journal {
    /// Start watching `root` under `policy` (what captures keep: excluded
    /// directories are not watched). Never fails: a mode that cannot be had
    /// gives "off" and says why ([`Journal::status`]). Errors only when the
    /// root cannot be opened.
    pub fn start(
        root: &Path,
        requested: Requested,
        policy: PolicyMatcher,
        limits: Limits,
    ) -> io::Result<Journal> {
        let root = std::fs::canonicalize(root)?;
        let root_fd = crate::fs::open_dir_path(&root)?;
        let stat = crate::fs::fstat(root_fd.as_raw_fd())?;
        let (source, mode, detail) = source::choose(&root, root_fd.as_raw_fd(), requested);
        // SAFETY: plain system call; the fd is owned below.
        let stop = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if stop < 0 {
            return Err(io::Error::last_os_error());
        }
        let watching = source.is_some();
        let mut state = State {
            mode,
            detail,
            off: None,
            dirty: Dirty::default(),
            untrust: Some("a fresh daemon: the journal starts from a full scan".into()),
            untrust_gen: 1,
            queue: Vec::new(),
            walking: HashMap::new(),
            wds: HashMap::new(),
            paths: BTreeMap::new(),
            removed: HashSet::new(),
            handles: HashMap::new(),
            links: links::Links::default(),
            objects: Vec::new(),
            generation: 0,
            last_event: None,
            first_pending: None,
            events: 0,
            overflows: 0,
            buffer: vec![0; READ_BUFFER],
        };
        if watching {
            state.queue.push((String::new(), String::new()));
            state.walking.insert(String::new(), 1);
        } else {
            state.off = Some(state.detail.clone());
        }
        let inner = Arc::new(Inner {
            root,
            root_fd,
            root_id: (stat.dev, stat.ino),
            policy,
            limits,
            source,
            // SAFETY: fresh fd.
            stop: unsafe { OwnedFd::from_raw_fd(stop) },
            state: Mutex::new(state),
            walk_hold: Arc::new(()),
        });
        let thread = if watching {
            let running = inner.clone();
            Some(
                std::thread::Builder::new()
                    .name("checkpointd-journal".into())
                    .spawn(move || run(&running))?,
            )
        } else {
            None
        };
        Ok(Journal {
            inner,
            thread: Mutex::new(thread),
            pid: std::process::id(),
        })
    }

    fn state(&self) -> io::Result<MutexGuard<'_, State>> {
        if std::process::id() != self.pid {
            return Err(io::Error::other(
                "a change journal belongs to the process that started it (this is a fork)",
            ));
        }
        Ok(self.inner.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Take what changed since the last take (the kernel's queue drained
    /// first): the capture examines it, or scans everything and the ticket
    /// says why. Changes from now on go to the next ticket.
    pub fn take(&self) -> io::Result<Ticket> {
        let mut state = self.state()?;
        self.inner.drain(&mut state);
        self.inner.check_root(&mut state);
        let mut dirty = std::mem::take(&mut state.dirty);
        let limits = self.inner.limits;
        // Hard-linked files are looked at by every capture (see the module docs).
        state.links.prune(self.inner.root_fd.as_raw_fd());
        for path in state.links.paths() {
            let (dir, name) = dirty::split(path);
            dirty.touch(dir, name.as_bytes(), false, &limits);
        }
        let full = match (&state.off, &state.untrust, &dirty.everything) {
            (Some(off), _, _) => Some(format!("watching is off: {off}")),
            (None, Some(reason), _) => Some(reason.clone()),
            (None, None, Some(reason)) => Some(reason.clone()),
            (None, None, None) => None,
        };
        // Subtrees whose watches are still being added stay to be walked
        // whole, until a capture walks them after their watches are in.
        let walking: Vec<String> = state
            .walking
            .keys()
            .filter(|w| !w.is_empty())
            .cloned()
            .collect();
        for path in walking {
            let (dir, name) = dirty::split(&path);
            state.dirty.touch(dir, name.as_bytes(), true, &limits);
        }
        state.first_pending = (!state.dirty.is_empty()).then(Instant::now);
        let ready = !state.walking.contains_key("");
        Ok(Ticket {
            _hold: (full.is_some() && !ready).then(|| self.inner.walk_hold.clone()),
            dirty,
            full,
            untrust_gen: state.untrust_gen,
            ready,
            generation: state.generation,
            linked: state.links.inodes(),
        })
    }

    /// The capture that took `ticket` is stored: a full scan taken while the
    /// journal watched everything, with no trust lost since, makes it trusted.
    pub fn commit(&self, ticket: &Ticket) -> io::Result<()> {
        let mut state = self.state()?;
        if ticket.full.is_some() && state.off.is_none() {
            if ticket.ready && ticket.untrust_gen == state.untrust_gen {
                state.untrust = None;
            } else if ticket.untrust_gen == state.untrust_gen {
                state.untrust = Some(format!(
                    "the last full scan began before the journal watched the whole workspace \
                     ({} directories watched so far)",
                    thousands(state.wds.len() as u64)
                ));
            }
        }
        Ok(())
    }

    /// The capture that took `ticket` failed: its changes are given back.
    pub fn abort(&self, ticket: Ticket) -> io::Result<()> {
        let mut state = self.state()?;
        let limits = self.inner.limits;
        if !ticket.dirty.is_empty() {
            state.dirty.merge(ticket.dirty, &limits);
            state.first_pending.get_or_insert_with(Instant::now);
        }
        Ok(())
    }

    /// The next capture scans everything, for `reason`; `find_links`: a
    /// file with other names the journal does not know was found (the
    /// journal walks the tree for them before it is trusted again).
    pub fn distrust(&self, reason: &str, find_links: bool) -> io::Result<()> {
        let mut state = self.state()?;
        state.distrust(reason.to_string());
        if find_links && self.inner.source.is_some() && state.off.is_none() {
            state.queue.push((String::new(), String::new()));
            *state.walking.entry(String::new()).or_insert(0) += 1;
        }
        Ok(())
    }

    /// Whether a change at `path` would be examined by the next capture.
    pub fn covers(&self, path: &str) -> io::Result<bool> {
        let mut state = self.state()?;
        self.inner.drain(&mut state);
        Ok(state.off.is_some()
            || state.untrust.is_some()
            || state.dirty.covers(path)
            || state.links.contains(path))
    }

    pub fn status(&self) -> io::Result<Status> {
        let mut state = self.state()?;
        self.inner.drain(&mut state);
        let now = Instant::now();
        let ms = |t: Option<Instant>| t.map(|t| (now - t).as_millis() as u64);
        let untrusted = match (&state.off, &state.untrust) {
            (Some(off), _) => Some(format!("watching is off: {off}")),
            (None, reason) => reason.clone(),
        };
        Ok(Status {
            mode: if state.off.is_some() {
                "off"
            } else {
                state.mode
            }
            .to_string(),
            detail: state.off.clone().unwrap_or_else(|| state.detail.clone()),
            pending: untrusted.is_some() || !state.dirty.is_empty(),
            untrusted,
            generation: state.generation,
            idle_ms: ms(state.last_event),
            pending_ms: ms(state.first_pending),
            events: state.events,
            overflows: state.overflows,
            watches: state.wds.len() as u64,
            linked_files: state.links.len() as u64,
            ready: state.off.is_none() && !state.walking.contains_key(""),
        })
    }

    /// Stop the thread (the kernel's watches go with the descriptor).
    pub fn close(&self) {
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(thread) = thread {
            let one: u64 = 1;
            // SAFETY: valid eventfd and an 8-byte value.
            unsafe { libc::write(self.inner.stop.as_raw_fd(), (&one as *const u64).cast(), 8) };
            if std::process::id() == self.pid {
                let _ = thread.join();
            }
        }
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        self.close();
    }
}

/// The journal's thread: read events as they come, walk new directories.
fn run(inner: &Inner) {
    let source = inner.source.as_ref().expect("a thread only with a source");
    loop {
        let queued = !inner.lock().queue.is_empty();
        let walking = queued && !inner.walk_held();
        let mut fds = [
            libc::pollfd {
                fd: source.fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: inner.stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfds.
        let timeout = match (walking, queued) {
            (true, _) => 0,
            (false, true) => 50,
            (false, false) => 1000,
        };
        unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
        if fds[1].revents != 0 {
            return;
        }
        if fds[0].revents != 0 {
            let mut state = inner.lock();
            inner.drain(&mut state);
        }
        if walking {
            inner.walk_one();
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A full scan taken before the walk of the whole tree was over is
    /// running: the walk waits for it. That scan cannot make the journal
    /// trusted (it began first), and the two would share the CPU: a fresh
    /// daemon's first capture of a million files took ~10% longer.
    fn walk_held(&self) -> bool {
        Arc::strong_count(&self.walk_hold) > 1
    }

    /// Read and apply every event queued now.
    fn drain(&self, state: &mut State) {
        let Some(source) = &self.source else {
            return;
        };
        let mut buffer = std::mem::take(&mut state.buffer);
        let mut events = Vec::new();
        loop {
            events.clear();
            if let Err(e) = source.read(&mut buffer, &mut events) {
                state.distrust(format!("reading the kernel's events failed: {e}"));
                break;
            }
            if events.is_empty() {
                break;
            }
            for event in events.drain(..) {
                self.apply(state, source, event);
            }
            self.check_objects(state, source);
        }
        state.buffer = buffer;
    }

    /// The workspace root still the directory we watch (not moved away, not
    /// replaced by another one).
    fn check_root(&self, state: &mut State) {
        if state.off.is_none() && tree::identity(&self.root) != Some(self.root_id) {
            self.switch_off(
                state,
                "the workspace root was replaced; restart the daemon to watch the new one".into(),
            );
        }
    }

    fn switch_off(&self, state: &mut State, why: String) {
        if let Some(source) = &self.source {
            for wd in state.wds.keys() {
                source.unwatch(*wd);
            }
        }
        state.wds.clear();
        state.paths.clear();
        state.queue.clear();
        state.walking.clear();
        state.off = Some(why.clone());
        state.distrust(format!("watching is off: {why}"));
    }

    /// What one event means for the change set.
    fn apply(&self, state: &mut State, source: &Source, event: Event) {
        if state.off.is_some() {
            return;
        }
        state.events += 1;
        if event.overflow {
            state.overflows += 1;
            state.generation += 1;
            state.last_event = Some(Instant::now());
            state.distrust(format!(
                "the kernel's event queue overflowed ({} events queued at most)",
                source::queue_limit(source)
            ));
            return;
        }
        let dir = self.directory(state, source, &event);
        if let (Some(object), false) = (&event.object, event.is_dir) {
            // The file itself (fanotify): checked once the batch is in,
            // whichever name it was reached by, and even when that name's
            // directory is gone or outside the workspace now (see `links`).
            let name = std::str::from_utf8(&event.name)
                .ok()
                .filter(|n| !n.is_empty());
            let path = dir.as_deref().zip(name).map(|(d, n)| dirty::join(d, n));
            state.objects.push((object.clone(), path));
        }
        let Some(dir) = dir else {
            return;
        };
        if dir.is_empty() && event.name.starts_with(CLOCK_PREFIX) {
            return; // the scan's own clock file (see statcache::racy_reference_ns)
        }
        // A change of the workspace (not of another part of the filesystem).
        state.generation += 1;
        state.last_event = Some(Instant::now());
        if event.unmounted {
            state.distrust(format!("the filesystem holding {dir:?} was unmounted"));
        }
        let limits = self.limits;
        if event.name.is_empty() {
            if dir.is_empty() && event.self_gone {
                state.distrust("the workspace root was moved or deleted".into());
            } else if !dir.is_empty() {
                // Its row (its mode) lives in its parent.
                let (parent, name) = dirty::split(&dir);
                state.touch(parent, name.as_bytes(), false, &limits);
            }
            if event.self_gone {
                state.handles.clear();
            }
            return;
        }
        let deep = event.created && event.is_dir;
        state.touch(&dir, &event.name, deep, &limits);
        let Ok(name) = std::str::from_utf8(&event.name) else {
            return; // never captured: the capture refuses it by name
        };
        let path = dirty::join(&dir, name);
        if event.is_dir && event.removed {
            self.unwatch_below(state, source, &path);
        }
        if deep && !self.policy.excluded(&path, true) {
            // Watched at once, so what is made in it from now on is seen;
            // what it holds already is listed by the walk queued here.
            if let Ok(fd) = tree::open_dir(self.root_fd.as_raw_fd(), &path) {
                if !self.watch_dir(state, source, fd.as_raw_fd(), &path) {
                    return;
                }
            }
            state.queue.push((path.clone(), path.clone()));
            *state.walking.entry(path).or_insert(0) += 1;
        } else if event.created && !event.is_dir {
            self.note_links(state, &path);
        }
    }

    /// The workspace path of the directory an event names (None: not ours).
    fn directory(&self, state: &mut State, source: &Source, event: &Event) -> Option<String> {
        match &event.dir {
            DirRef::Watch(wd) => {
                if event.ignored {
                    state.removed.remove(wd);
                    if let Some(path) = state.wds.remove(wd) {
                        if state.paths.get(&path) == Some(wd) {
                            state.paths.remove(&path);
                        }
                        if path.is_empty() {
                            state.distrust("the workspace root is no longer watched".into());
                        }
                    }
                    return None;
                }
                if state.removed.contains(wd) {
                    return None; // a subtree moved away: walked whole where it went
                }
                let found = state.wds.get(wd).cloned();
                if found.is_none() {
                    state.distrust(format!(
                        "an event for watch {wd}, which the journal does not know"
                    ));
                }
                found
            }
            DirRef::None => None,
            DirRef::Handle(handle) => {
                if let Some(known) = state.handles.get(handle) {
                    return known.clone();
                }
                let path = source.resolve(handle).and_then(|abs| self.relative(&abs));
                if state.handles.len() >= HANDLES_KEPT {
                    state.handles.clear();
                }
                state.handles.insert(handle.clone(), path.clone());
                path
            }
        }
    }

    /// `abs` as a path beneath the root that captures enter, if it is one.
    fn relative(&self, abs: &[u8]) -> Option<String> {
        let root = self.root.as_os_str().as_bytes();
        let rest = abs.strip_prefix(root)?;
        let rel = match rest {
            [] => "",
            [b'/', rel @ ..] => std::str::from_utf8(rel).ok()?,
            _ => return None,
        };
        (rel.is_empty() || !self.policy.excluded(rel, true)).then(|| rel.to_string())
    }

    /// `abs` as the path of a file a capture keeps, if it is one.
    fn relative_file(&self, abs: &[u8]) -> Option<String> {
        let root = self.root.as_os_str().as_bytes();
        let rel = std::str::from_utf8(abs.strip_prefix(root)?.strip_prefix(b"/")?).ok()?;
        (!rel.is_empty() && !self.policy.excluded(rel, false)).then(|| rel.to_string())
    }

    /// Forget the watches of `path` and below (moved away: their paths are
    /// wrong now; where it went is walked whole and watched again).
    fn unwatch_below(&self, state: &mut State, source: &Source, path: &str) {
        state.handles.clear();
        let below = format!("{path}/");
        let gone: Vec<(String, i32)> = std::iter::once(path.to_string())
            .filter_map(|p| state.paths.get(&p).map(|wd| (p, *wd)))
            .chain(
                state
                    .paths
                    .range(below.clone()..)
                    .take_while(|(p, _)| p.starts_with(&below))
                    .map(|(p, wd)| (p.clone(), *wd)),
            )
            .collect();
        for (p, wd) in gone {
            source.unwatch(wd);
            state.paths.remove(&p);
            state.wds.remove(&wd);
            state.removed.insert(wd);
        }
    }

    /// Watch the directory `dir` (open as `fd`; inotify: fanotify watches
    /// everything). False when watching went off (the watch limit).
    fn watch_dir(&self, state: &mut State, source: &Source, fd: i32, dir: &str) -> bool {
        match source.watch(fd) {
            Ok(Some(wd)) => {
                if let Some(old) = state.paths.insert(dir.to_string(), wd) {
                    if old != wd {
                        state.wds.remove(&old);
                    }
                }
                state.wds.insert(wd, dir.to_string());
                true
            }
            Ok(None) => true,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                let queued = state.queue.len() + state.wds.len() + 1;
                let why = format!(
                    "watch limit {} < {}+ directories (raise fs.inotify.max_user_watches)",
                    source::read_limit("max_user_watches"),
                    thousands(queued as u64)
                );
                self.switch_off(state, why);
                false
            }
            // Gone or replaced since: its parent's event covers it.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR)) => true,
            Err(e) => {
                self.switch_off(state, format!("cannot watch {dir:?}: {e}"));
                false
            }
        }
    }

    /// Walk one queued directory: watch it, then queue its subdirectories
    /// and note its hard-linked files (listed without holding the lock).
    fn walk_one(&self) {
        let source = self.source.as_ref().expect("walks only with a source");
        let Some((dir, subtree)) = self.lock().queue.pop() else {
            return;
        };
        let opened = tree::open_dir(self.root_fd.as_raw_fd(), &dir);
        let listed = match opened {
            Ok(fd) => {
                if !self.watch_dir(&mut self.lock(), source, fd.as_raw_fd(), &dir) {
                    return;
                }
                tree::list(fd, &dir, &self.policy, self.root_id.0)
            }
            Err(e) => Err(e),
        };
        let mut state = self.lock();
        if let Ok(listed) = listed {
            for sub in listed.dirs {
                state.queue.push((sub, subtree.clone()));
                *state.walking.entry(subtree.clone()).or_insert(0) += 1;
            }
            for (path, inode, links) in listed.linked {
                // A walk of the whole tree finds every name.
                let check = (!subtree.is_empty()).then_some(links);
                self.add_linked(&mut state, path, inode, check);
            }
        }
        // (A directory gone or replaced since it was queued: its parent's
        // event covers it.)
        if let Some(count) = state.walking.get_mut(&subtree) {
            *count -= 1;
            if *count == 0 {
                state.walking.remove(&subtree);
            }
        }
    }
}

impl State {
    fn distrust(&mut self, reason: String) {
        self.untrust = Some(reason);
        self.untrust_gen += 1;
        self.first_pending.get_or_insert_with(Instant::now);
    }

    fn touch(&mut self, dir: &str, name: &[u8], deep: bool, limits: &Limits) {
        self.dirty.touch(dir, name, deep, limits);
        self.first_pending.get_or_insert_with(Instant::now);
    }
}

/// `31000` as `31,000`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}
