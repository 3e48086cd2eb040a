//! Freeing a scan's records off its critical path and giving the heap
//! back to the system.

/// Threads still freeing what earlier scans built (see [`free_later`]), and
/// the process that started them: a child forked meanwhile has none of its
/// parent's threads, so it starts its count afresh. (Atomics, not a lock or
/// join handles: a fork may come at any moment, and neither survives one.)
static FREEING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

static FREEING_PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// How many threads of this process are freeing (a fork's child: none).
fn freeing_here() -> &'static std::sync::atomic::AtomicUsize {
    use std::sync::atomic::Ordering::SeqCst;
    let pid = std::process::id();
    if FREEING_PID.swap(pid, SeqCst) != pid {
        FREEING.store(0, SeqCst);
    }
    &FREEING
}

/// Scans of more entries than this free their records before they return.
/// Below it they are freed on a thread of their own, off the scan's critical
/// path (at 100k files the walk's batches are ~25,000 allocations, 2 ms of a
/// 90 ms no-change scan); above it the capture's next step (reading its
/// parent again: ~60 MB at a million entries) would overlap the freeing and
/// add to the peak (a million-file no-change capture peaked at up to 341 MB
/// that way, 243-264 MB freeing first; the goal is 300 MB).
const FREE_INLINE_ENTRIES: u64 = 250_000;

/// Free a scan's `records` (of a scan of `entries` entries), then give the
/// heap back ([`release_freed_memory`]): inline for a large scan, else on a
/// thread of their own ([`free_later`]; see [`FREE_INLINE_ENTRIES`]).
pub(super) fn free_records<T: Send + 'static>(records: T, entries: u64) {
    if entries > FREE_INLINE_ENTRIES {
        drop(records);
        release_freed_memory();
    } else {
        free_later(records);
    }
}

/// Free `records` on a thread of their own, then give the heap back: never
/// beside the next scan's records, which waits for it ([`wait_for_freeing`]).
/// When no thread can be started, freed here.
fn free_later<T: Send + 'static>(records: T) {
    use std::sync::atomic::Ordering::SeqCst;
    let count = freeing_here();
    count.fetch_add(1, SeqCst);
    let freeing = std::thread::Builder::new()
        .name("checkpointd-free".into())
        .spawn(move || {
            drop(records);
            release_freed_memory();
            FREEING.fetch_sub(1, SeqCst);
        });
    if freeing.is_err() {
        count.fetch_sub(1, SeqCst);
    }
}

/// Wait until what earlier scans handed to [`free_later`] is freed (by then
/// it has almost always been: the freeing takes a few ms per 100k files).
pub(super) fn wait_for_freeing() {
    let count = freeing_here();
    while count.load(std::sync::atomic::Ordering::SeqCst) > 0 {
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}

/// Give the heap a scan freed back to the system, when it is a lot. The
/// walk's batches are ~100 bytes per entry in many small allocations, made on
/// the pool's threads; glibc keeps freed small chunks mapped in each thread's
/// arena, so a daemon would otherwise keep a large scan's whole peak (hundreds
/// of MB at a million files) resident between captures. Called once the
/// scan's records are freed ([`free_later`]): called before, while they
/// were still held, it gave back almost nothing (185 MB resident after a
/// million-file scan, 56 MB when called after). Below
/// [`KEEP_FREED_HEAP`] the free heap is kept: the next scan reuses it instead
/// of faulting every page in again (at 100k files that was a fault per
/// ~20 entries, each scan), and a daemon never holds more than that extra.
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads the allocator's counters; malloc_trim
        // only returns free memory of its own arenas to the kernel. Both are
        // safe to call at any time from any thread.
        let keep = match mallinfo2() {
            Some(mallinfo2) => (unsafe { mallinfo2() }).fordblks <= KEEP_FREED_HEAP,
            None => false,
        };
        if !keep {
            unsafe { libc::malloc_trim(0) };
        }
    }
}

/// glibc's `mallinfo2`, looked up when the process runs: it exists from glibc
/// 2.33 on, and the wheel is built for manylinux2014 (glibc 2.17), so linking
/// it would make the module fail to load on older systems (Debian bullseye has
/// 2.31). Without it every scan trims, as before the threshold.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn mallinfo2() -> Option<unsafe extern "C" fn() -> libc::mallinfo2> {
    static FOUND: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only looks a
    // symbol up; a non-null result is glibc's mallinfo2, of this signature.
    let address = *FOUND
        .get_or_init(|| unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"mallinfo2".as_ptr()) as usize });
    (address != 0).then(|| unsafe {
        std::mem::transmute::<usize, unsafe extern "C" fn() -> libc::mallinfo2>(address)
    })
}

/// Free heap (bytes, every arena) a scan leaves mapped for the next one.
const KEEP_FREED_HEAP: usize = 48 << 20;
