//! The shim's table of pager mappings and what each interposed call does
//! to it. One mutex guards the table; it is taken only by program threads
//! in interposed calls, never by engine code (engine threads and the fault
//! handler pass through), so waiting for it cannot deadlock with a fault.

mod calls;
mod coherence;
mod files;
mod finish;
mod kernel;
mod place;
mod resident;
mod spans;

pub use calls::{madvise, mprotect, mremap, msync};
pub use coherence::{file_of, flush_all, flush_before_write, flush_file, flush_for_read, refresh};
use files::fd_file;
pub use files::file_store;
pub use finish::{finish, unload};
use kernel::{kernel_shared_maps, kernel_writes, open_flags, write_sealed};
use place::{covered, place, refuse_second, write_back_covered};
pub use resident::{needed as residency_needed, resident_for_call};

use crate::config::Config;
use crate::sys;
use engine::store::Store;
use engine::{InstallKind, Pager, Region};
use std::ffi::{c_int, c_void};
use std::io::Write;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

const PAGE: usize = engine::PAGE_SIZE;

/// One pager mapping the program made.
struct Entry {
    /// What of it is still mapped is the engine's to say
    /// ([`Region::mapped`]): the program may unmap or move parts of it, or
    /// map over it with `MAP_FIXED`, through calls the shim passes to the
    /// kernel, and the engine follows each through its event.
    region: Region,
    /// `(st_dev, st_ino)` of a file mapping.
    file: Option<(u64, u64)>,
    /// The file offset the region starts at.
    base: u64,
    /// A writable MAP_SHARED mapping: its writes reach the file. Set at
    /// `mmap`, or when `mprotect` makes a [`may_write`](Self::may_write)
    /// one writable.
    writable_shared: bool,
    /// Its store takes writes, so `mprotect(PROT_WRITE)` may make it
    /// writable: anonymous memory, or a MAP_SHARED mapping of a descriptor
    /// opened for writing (served with the shared kind, whatever
    /// `UFFD_PAGER_KIND` says: an anonymous-kind copy would keep the
    /// writes from the file). Never a MAP_PRIVATE one (served as a shared
    /// one, its writes would reach the file) nor one of a descriptor opened
    /// read-only: `EACCES`, as the kernel answers.
    may_write: bool,
    /// The kernel's `mprotect` made it writable, in whole or in part (a
    /// part, `PROT_EXEC`, a protection key): the engine's region still
    /// takes itself for read-only, so a move through the engine would give
    /// the mapping back read-only, and the writes the program goes on with
    /// would be SIGSEGV. Such a mapping is not moved (`EINVAL`).
    kernel_writable: bool,
    /// A `MAP_SHARED` file mapping's store, which `msync(MS_SYNC)` syncs as
    /// the kernel's syncs the file: also what `write(2)` put there, which
    /// no write-back of the mapping's own covers.
    shared_store: Option<Arc<dyn Store>>,
    /// The length of its store (the mapping's at `mmap`): the engine moves
    /// it to no greater length (`EINVAL`).
    cap: usize,
    path: String,
    /// Its slot in [`spans`] (set by [`State::add`]).
    span: Option<usize>,
}

struct State {
    cfg: Config,
    pager: Option<Pager>,
    /// The process that made the pager (a fork()ed child has a copy of it
    /// that serves nothing).
    owner_pid: i32,
    maps: Vec<Entry>,
    /// Failure messages already printed (each once).
    said: Vec<String>,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);
/// The settings ask for something to be paged.
static ACTIVE: AtomicBool = AtomicBool::new(false);
/// The process that made the pager (0: none yet), read without the
/// table's lock: a `vfork()`ed child shares the parent's memory, lock
/// included, and runs no atfork handler.
static OWNER_PID: AtomicI32 = AtomicI32::new(0);
/// `UFFD_PAGER_ANON_MIN` (`usize::MAX`: none), read without the table's
/// lock (see [`spans`]).
static ANON_MIN: AtomicUsize = AtomicUsize::new(usize::MAX);
/// Entries in the table, and those of files.
static ENTRIES: AtomicUsize = AtomicUsize::new(0);
static FILE_ENTRIES: AtomicUsize = AtomicUsize::new(0);
/// Entries that are writable shared file mappings.
static WRITABLE_ENTRIES: AtomicUsize = AtomicUsize::new(0);
/// A pager mapping was unmapped while its file refused its dirty pages:
/// the pager keeps them ([`engine::Pager::flush_unmapped`]).
static UNWRITTEN: AtomicBool = AtomicBool::new(false);
/// The shim's own counters (printed with the pager's).
static PAGED: AtomicU64 = AtomicU64::new(0);
static PASSED: AtomicU64 = AtomicU64::new(0);
static REFUSED: AtomicU64 = AtomicU64::new(0);
static REFRESHED: AtomicU64 = AtomicU64::new(0);

/// Set in a `fork()`ed child (by an atfork handler installed at load).
/// The shim then passes every call to the kernel and never takes the
/// table's lock: the parent's regions are not mapped in the child (they
/// are `MADV_DONTFORK`), the engine refuses to work there, and the lock may
/// have been held at the fork by another of the parent's threads (a
/// write-back in `msync` or `munmap`), which the child does not have to
/// release it. Each check below is the one load before any lock.
static FORKED: AtomicBool = AtomicBool::new(false);

extern "C" fn forked() {
    FORKED.store(true, Relaxed);
}

fn here() -> bool {
    !FORKED.load(Relaxed)
}

/// Whether this process made the pager (not a child of the one that did,
/// `vfork()`ed ones included). A system call.
pub fn made_here() -> bool {
    // SAFETY: getpid has no preconditions.
    OWNER_PID.load(Relaxed) == unsafe { libc::getpid() }
}

pub fn active() -> bool {
    ACTIVE.load(Relaxed) && here()
}
pub fn any() -> bool {
    ENTRIES.load(Relaxed) > 0 && here()
}
pub fn any_file() -> bool {
    FILE_ENTRIES.load(Relaxed) > 0 && here()
}
pub fn any_writable() -> bool {
    WRITABLE_ENTRIES.load(Relaxed) > 0 && here()
}
/// Whether an `fsync` may have pages of the pager's to write first.
pub fn any_to_sync() -> bool {
    (WRITABLE_ENTRIES.load(Relaxed) > 0 || UNWRITTEN.load(Relaxed)) && here()
}

fn state() -> MutexGuard<'static, Option<State>> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Reads the settings; a bad one ends the program with exit code 2.
pub fn load() {
    let cfg = match Config::from(|k| std::env::var(k).ok()) {
        Ok(c) => c,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "uffd-pager-preload: {e}");
            // SAFETY: ends the process at once, before main, without
            // running anything of the program's.
            unsafe { libc::_exit(2) };
        }
    };
    ACTIVE.store(!cfg.files.is_empty() || cfg.anon_min.is_some(), Relaxed);
    ANON_MIN.store(cfg.anon_min.unwrap_or(usize::MAX), Relaxed);
    // SAFETY: registers a child handler that only stores to an atomic
    // (async-signal-safe, as a fork child handler must be).
    unsafe { libc::pthread_atfork(None, None, Some(forked)) };
    *state() = Some(State {
        cfg,
        pager: None,
        owner_pid: 0,
        maps: Vec::new(),
        said: Vec::new(),
    });
}

impl State {
    /// Prints `msg` on stderr the first time it comes up.
    fn say(&mut self, msg: String) {
        if self.cfg.verbose || !self.said.contains(&msg) {
            // Never `eprintln!`: it panics when stderr fails (a closed
            // pipe), and a panic here would abort the program.
            let _ = writeln!(std::io::stderr(), "uffd-pager-preload: {msg}");
            self.said.push(msg);
        }
    }

    fn pager(&mut self) -> Result<&Pager, String> {
        if self.pager.is_none() {
            let p = self.cfg.builder().build().map_err(|e| e.to_string())?;
            let serves =
                self.cfg.delivery != engine::Delivery::InThread && !p.descriptor().user_mode_only;
            resident::serves_syscalls(serves);
            self.pager = Some(p);
            // SAFETY: getpid has no preconditions.
            self.owner_pid = unsafe { libc::getpid() };
            OWNER_PID.store(self.owner_pid, Relaxed);
        }
        Ok(self.pager.as_ref().expect("made above"))
    }

    fn add(&mut self, mut e: Entry) -> *mut c_void {
        let p = e.region.as_ptr().cast();
        e.span = spans::add(p as usize..p as usize + e.region.len());
        if e.file.is_some() {
            FILE_ENTRIES.fetch_add(1, Relaxed);
        }
        if e.writable_shared {
            WRITABLE_ENTRIES.fetch_add(1, Relaxed);
        }
        ENTRIES.fetch_add(1, Relaxed);
        PAGED.fetch_add(1, Relaxed);
        if self.cfg.verbose {
            let msg = format!("paging {} ({} bytes) at {p:?}", e.path, e.region.len());
            self.say(msg);
        }
        self.maps.push(e);
        p
    }

    /// Drops the entries none of whose memory is mapped any more (the
    /// program mapped over them with `MAP_FIXED`, or unmapped or moved them
    /// piece by piece through calls the kernel served): their regions
    /// release nothing, and a stale entry would answer later calls on
    /// what is now the program's memory, or refuse a new mapping of its
    /// file.
    fn prune(&mut self) {
        let mut i = 0;
        while i < self.maps.len() {
            if self.maps[i].region.mapped().is_empty() {
                drop(self.remove(i));
            } else {
                i += 1;
            }
        }
    }

    fn remove(&mut self, i: usize) -> Entry {
        let e = self.maps.swap_remove(i);
        spans::remove(e.span);
        if e.file.is_some() {
            FILE_ENTRIES.fetch_sub(1, Relaxed);
        }
        if e.writable_shared {
            WRITABLE_ENTRIES.fetch_sub(1, Relaxed);
        }
        ENTRIES.fetch_sub(1, Relaxed);
        e
    }
}

/// `len` rounded up to whole pages; `None` where that passes the largest
/// length (the caller leaves such a call to the kernel, which refuses it).
pub(crate) fn pages_len(len: usize) -> Option<usize> {
    len.checked_next_multiple_of(PAGE)
}

/// mmap: `Some` if the shim answered (a pager mapping, or a refusal),
/// `None` to pass the call to the kernel.
///
/// A writable shared mapping of a file the kernel would make (`PROT_EXEC`,
/// `PROT_WRITE` without `PROT_READ`, past the end of the file, with
/// `MAP_FIXED` over a pager mapping, a path `UFFD_PAGER_FILES` does not
/// name) is refused (`ENODEV`) while the pager maps that file elsewhere:
/// the kernel's page cache and the pager's would be two copies of the
/// file, and the pager's write-back of a dirty page put its older bytes
/// over what was stored through the kernel's mapping.
pub fn mmap(call: MmapCall) -> Option<*mut c_void> {
    let served = place(
        call.addr, call.len, call.prot, call.flags, call.fd, call.off,
    );
    if served.is_some() || !any_file() || !call.kernel_maps_writable_shared() {
        return served;
    }
    let rlen = pages_len(call.len)?;
    let (_, id, _) = fd_file(call.fd)?;
    let mut guard = state();
    let st = guard.as_mut()?;
    let over = call
        .fixed()
        .then(|| call.addr as usize..(call.addr as usize).saturating_add(rlen));
    st.prune();
    let cached = st
        .maps
        .iter()
        .filter(|e| e.file == Some(id))
        .find(|e| !covered(&e.region.mapped(), over.as_ref()))
        .map(|e| e.path.clone());
    match cached {
        Some(name) => refuse_second(st, &name),
        None => None,
    }
}

/// The program's `mmap` call, as it made it.
#[derive(Clone, Copy)]
pub struct MmapCall {
    pub addr: *mut c_void,
    pub len: usize,
    pub prot: c_int,
    pub flags: c_int,
    pub fd: c_int,
    pub off: i64,
}

impl MmapCall {
    fn fixed(&self) -> bool {
        self.flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE) != 0
    }

    /// Whether the kernel would make this mapping, and it is writable,
    /// shared and of a file: its own checks pass (a call it refuses keeps
    /// its errno).
    fn kernel_maps_writable_shared(&self) -> bool {
        let (flags, fd, off) = (self.flags, self.fd, self.off);
        self.prot & libc::PROT_WRITE != 0
            && flags & libc::MAP_ANONYMOUS == 0
            && flags & libc::MAP_TYPE != libc::MAP_PRIVATE
            && flags & libc::MAP_HUGETLB == 0 // EINVAL for a file not on hugetlbfs
            && fd >= 0
            && self.len != 0
            && off >= 0
            && (off as usize).is_multiple_of(PAGE)
            && (!self.fixed() || (self.addr as usize).is_multiple_of(PAGE))
            && open_flags(fd) & (libc::O_ACCMODE | libc::O_PATH) == libc::O_RDWR
            && !write_sealed(fd)
    }
}

/// The entries with mapped memory in `[a, b)`: each one's index and its
/// mapped pieces (all of them, not only those in the range). Prunes the
/// table first, so the indices are those after the pruning.
fn overlapping(st: &mut State, a: usize, b: usize) -> Vec<(usize, Vec<Range<usize>>)> {
    st.prune();
    (0..st.maps.len())
        .map(|i| (i, st.maps[i].region.mapped()))
        .filter(|(_, m)| m.iter().any(|p| p.start < b && a < p.end))
        .collect()
}

/// The parts of `holes` outside `piece`.
fn without(holes: Vec<(usize, usize)>, piece: &Range<usize>) -> Vec<(usize, usize)> {
    holes
        .into_iter()
        .flat_map(|(x, y)| [(x, y.min(piece.start)), (x.max(piece.end), y)])
        .filter(|&(x, y)| x < y)
        .collect()
}

/// munmap: pager mappings whose mapped memory lies all inside the range
/// are unmapped through the engine (writing a shared mapping back); parts
/// of others are unmapped by the kernel (the engine follows that unmap
/// through its event); the rest of the range is the kernel's, including
/// what the program mapped over a pager mapping.
///
/// The kernel never unmaps what the engine already did: once a pager
/// mapping is gone its range is free, and another thread's new mapping
/// may already be there. The table lock is held throughout, so no pager
/// mapping can be placed in the range meanwhile.
pub fn munmap(addr: usize, len: usize) -> c_int {
    // SAFETY: the program asked for this call on this range (see the function's comment).
    let kernel =
        |a: usize, n: usize| unsafe { sys::call(libc::SYS_munmap, a, n, 0, 0, 0) as c_int };
    let Some(rlen) = pages_len(len) else {
        return kernel(addr, len); // EINVAL
    };
    let (a, b) = (addr, addr.saturating_add(rlen));
    if !spans::may_be_ours(a, b.max(a.saturating_add(1))) {
        return kernel(addr, len);
    }
    let mut guard = state();
    let Some(st) = guard.as_mut() else {
        return kernel(addr, len);
    };
    if len == 0 || !addr.is_multiple_of(PAGE) || addr > task_size() || rlen > task_size() - addr {
        // The kernel's EINVAL, before it unmaps anything. (A range past
        // the top of the address space took the pager mappings in it and
        // the kernel unmapped the gaps between them: thread stacks, the
        // heap, before its EINVAL.)
        return kernel(addr, len);
    }
    // Mappings all of whose memory lies in the range go away through the
    // engine; the kernel unmaps the rest of the range (parts of other pager
    // mappings among it: the engine follows that unmap through its event).
    let mut gone = Vec::new();
    let mut holes = vec![(a, b)];
    for (i, pieces) in overlapping(st, a, b) {
        if pieces.iter().all(|p| a <= p.start && p.end <= b) {
            gone.push(i);
            for p in &pieces {
                holes = without(holes, p);
            }
        }
    }
    gone.sort_unstable_by(|x, y| y.cmp(x));
    let swept = !gone.is_empty();
    for i in gone {
        let e = st.remove(i);
        if let Err(err) = e.region.unmap() {
            UNWRITTEN.store(true, Relaxed);
            let msg = format!(
                "{}: write-back at munmap failed (the pages are kept, written at the next \
                 fsync, or at exit): {err}",
                e.path
            );
            st.say(msg);
        }
    }
    if swept {
        // Their stores' descriptors, closed where no record lock of the
        // program's is on the file (see `files::MADE`).
        files::sweep();
    }
    let mut rc = 0;
    for (x, y) in holes {
        if kernel(x, y - x) != 0 {
            rc = -1;
        }
    }
    rc
}

/// The top of the address space the kernel lets this process map (its
/// `TASK_SIZE`): 2⁴⁷ less a page with 4-level page tables, 2⁵⁶ less a
/// page with 5-level ones. Probed once: the page at 2⁴⁷ can be mapped (or
/// is mapped already) only with 5-level tables.
pub(crate) fn task_size() -> usize {
    static SIZE: AtomicUsize = AtomicUsize::new(0);
    let known = SIZE.load(Relaxed);
    if known != 0 {
        return known;
    }
    let probe = 1usize << 47;
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE;
    let e = crate::errno();
    // SAFETY: MAP_FIXED_NOREPLACE replaces nothing; a page it maps is
    // unmapped at once, and nothing else knows of it.
    let five_level = unsafe {
        let p = libc::syscall(libc::SYS_mmap, probe, PAGE, libc::PROT_NONE, flags, -1, 0);
        if p as usize == probe {
            libc::syscall(libc::SYS_munmap, probe, PAGE);
        }
        p as usize == probe || p == -1 && crate::errno() == libc::EEXIST
    };
    crate::set_errno(e);
    let size = if five_level { 1 << 56 } else { 1 << 47 } - PAGE;
    SIZE.store(size, Relaxed);
    size
}

/// The one entry mapped whole, and at exactly `[a, a+len)`.
fn whole(st: &State, a: usize, len: usize) -> Option<usize> {
    st.maps.iter().position(|e| {
        let start = e.region.as_ptr() as usize;
        start == a
            && e.region.len() == len
            && e.region.mapped().as_slice() == std::slice::from_ref(&(a..a + len))
    })
}
