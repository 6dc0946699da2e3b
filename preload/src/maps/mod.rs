//! The shim's table of pager mappings and what each interposed call does
//! to it. One mutex guards the table; it is taken only by program threads
//! in interposed calls, never by engine code (engine threads and the fault
//! handler pass through), so waiting for it cannot deadlock with a fault.

mod calls;
mod coherence;
mod spans;

pub use calls::{madvise, mprotect, mremap, msync};
pub use coherence::{file_of, flush_all, flush_before_write, flush_file, flush_for_read, refresh};

use crate::config::Config;
use crate::sys;
use engine::store::{SimulatedStore, Store};
use engine::{InstallKind, MapOptions, Pager, Region};
use std::ffi::{c_int, c_void};
use std::io::Write;
use std::ops::Range;
use std::os::unix::fs::OpenOptionsExt;
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

/// The resolved path of descriptor `fd`, and its identity and size.
fn fd_file(fd: c_int) -> Option<(std::ffi::CString, (u64, u64), u64)> {
    // SAFETY: a zeroed stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes only `st`.
    if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return None;
    }
    // The calling thread's table (`thread-self`): `/proc/self/fd` is the
    // first thread's, which a thread that unshared its table does not
    // use, and where `fd` can be another file.
    let link = std::fs::read_link(format!("/proc/thread-self/fd/{fd}")).ok()?;
    let path = std::ffi::CString::new(link.into_os_string().into_encoded_bytes()).ok()?;
    Some((path, (st.st_dev, st.st_ino), st.st_size as u64))
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

/// Whether all of `pieces` lie in `over` (a `MAP_FIXED` range that
/// replaces them).
fn covered(pieces: &[Range<usize>], over: Option<&Range<usize>>) -> bool {
    over.is_some_and(|o| pieces.iter().all(|p| o.start <= p.start && p.end <= o.end))
}

/// The refusal of a second mapping of a file mapped writable and shared
/// (`name`): `ENODEV`, and a message naming `UFFD_PAGER_FILES`.
fn refuse_second(st: &mut State, name: &str) -> Option<*mut c_void> {
    REFUSED.fetch_add(1, Relaxed);
    st.say(format!(
        "refusing a second mapping of {name}: a file mapped writable and shared can have \
         one mapping only where the pager maps it (the pager keeps a cache per mapping, the \
         kernel another); exclude it from UFFD_PAGER_FILES to let the kernel map it"
    ));
    crate::set_errno(libc::ENODEV);
    Some(libc::MAP_FAILED)
}

/// The program's descriptor's flags (`F_GETFL`; -1 for a bad one).
fn open_flags(fd: c_int) -> c_int {
    // SAFETY: F_GETFL reads the program's descriptor's flags.
    unsafe { libc::fcntl(fd, libc::F_GETFL) }
}

/// Whether the file behind `fd` is sealed against writes (a memfd with
/// `F_SEAL_WRITE` or `F_SEAL_FUTURE_WRITE`).
fn write_sealed(fd: c_int) -> bool {
    // SAFETY: F_GET_SEALS reads the file's seals (EINVAL: a file that
    // takes none).
    let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
    seals > 0 && seals & (libc::F_SEAL_WRITE | libc::F_SEAL_FUTURE_WRITE) != 0
}

/// A writable shared mapping of file `id` the kernel holds in this process
/// (one the shim passed on, or one made or made writable by a raw system
/// call), outside `over`, by `/proc/self/maps`. The pager's own memory is
/// anonymous or a memfd of its own, never the program's file.
fn kernel_writes(id: (u64, u64), over: Option<&Range<usize>>) -> bool {
    kernel_shared_maps()
        .iter()
        .any(|k| k.writable && k.is(id) && !covered(std::slice::from_ref(&k.range), over))
}

/// A shared file mapping as `/proc/self/maps` lists it.
struct KernelMap {
    range: Range<usize>,
    writable: bool,
    /// The device (as the line gives it) and the inode.
    dev: u64,
    ino: u64,
    /// The file's path, where the line names one that still exists.
    path: Option<String>,
}

impl KernelMap {
    /// Whether this is a mapping of the file `id` (`fstat`'s
    /// `(st_dev, st_ino)`). The line's device is the one the file's
    /// superblock reports, which on an overlay whose layers are on other
    /// file systems is the overlay's, where `fstat` gives the layer's: on
    /// a device that differs, the path the line names is asked
    /// (`stat`, which answers as `fstat` does). Before, such a kernel
    /// mapping was never seen, and the pager kept a second cache of the
    /// file beside the kernel's.
    fn is(&self, id: (u64, u64)) -> bool {
        if self.ino != id.1 {
            return false;
        }
        if self.dev == id.0 {
            return true;
        }
        self.path.as_deref().is_some_and(|p| {
            std::fs::metadata(p).is_ok_and(|m| {
                use std::os::unix::fs::MetadataExt;
                (m.dev(), m.ino()) == id
            })
        })
    }
}

/// The shared file mappings of this process now.
fn kernel_shared_maps() -> Vec<KernelMap> {
    let text = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let hex = |t: &str| usize::from_str_radix(t, 16).ok();
    text.lines()
        .filter_map(|l| {
            // start-end perms offset major:minor inode [padding path]
            let mut f = l.splitn(6, ' ');
            let (a, b) = f.next()?.split_once('-')?;
            let perms = f.next()?.as_bytes();
            let (maj, min) = f.nth(1)?.split_once(':')?;
            let ino: u64 = f.next()?.parse().ok()?;
            if perms.get(3) != Some(&b's') || ino == 0 {
                return None;
            }
            let path = f
                .next()
                .map(str::trim_start)
                .filter(|p| p.starts_with('/') && !p.ends_with(" (deleted)"))
                .map(str::to_string);
            Some(KernelMap {
                range: hex(a)?..hex(b)?,
                writable: perms.get(1) == Some(&b'w'),
                dev: libc::makedev(hex(maj)? as u32, hex(min)? as u32),
                ino,
                path,
            })
        })
        .collect()
}

/// [`mmap`]'s decision, before the refusal of a writable shared kernel
/// mapping beside a pager mapping.
fn place(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> Option<*mut c_void> {
    // The kernel's too: `MAP_32BIT` (an address below 4 GiB, which the
    // engine does not choose), `MAP_SYNC` and any map type but shared or
    // private (`MAP_SHARED_VALIDATE` checks flags the shim does not know:
    // the kernel refuses `MAP_SYNC` on a file that is not DAX, and libpmem
    // reads that refusal as "call msync"; mapped here, it stopped).
    let skip = libc::MAP_HUGETLB
        | libc::MAP_GROWSDOWN
        | libc::MAP_STACK
        | libc::MAP_32BIT
        | libc::MAP_SYNC;
    let map_type = flags & libc::MAP_TYPE;
    let anon = flags & libc::MAP_ANONYMOUS != 0;
    if len == 0
        || prot & libc::PROT_EXEC != 0
        || prot & libc::PROT_READ == 0
        || flags & skip != 0
        || (map_type != libc::MAP_SHARED && map_type != libc::MAP_PRIVATE)
    {
        // The kernel's, but a mapping of a file reads the file: what was
        // stored through the pager's writable mapping of it goes first
        // (a PROT_EXEC one showed the older bytes).
        if !anon && fd >= 0 && any_writable() {
            let mut guard = state();
            if let (Some(st), Some((_, id, _))) = (guard.as_mut(), fd_file(fd)) {
                write_back_before_a_mapping(st, id);
            }
        }
        return None;
    }
    let shared = map_type == libc::MAP_SHARED;
    let write = prot & libc::PROT_WRITE != 0;
    let fixed = flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE) != 0;
    // (A fixed anonymous mapping is the kernel's: the engine places
    // anonymous regions itself. So is a read-only one: the engine's
    // anonymous regions are writable, and zeros need no pager. Decided
    // before the table's lock: an allocator's own mmap, made under its
    // lock, must not wait for ours; see `spans`.)
    if anon && (shared || fixed || !write || len < ANON_MIN.load(Relaxed)) {
        return None;
    }
    let mut guard = state();
    let st = guard.as_mut()?;
    let mut opts = MapOptions {
        writable: write,
        populate: flags & libc::MAP_POPULATE != 0,
        pinned: flags & libc::MAP_LOCKED != 0,
        ..MapOptions::default()
    };
    if fixed {
        if !(addr as usize).is_multiple_of(PAGE) {
            return None; // the kernel's EINVAL
        }
        opts.fixed_addr = Some(addr as usize);
    }
    // (A length that rounds past the address space is the kernel's:
    // ENOMEM.)
    let rlen = pages_len(len)?;
    let entry = if anon {
        // (`MAP_POPULATE` and `MAP_LOCKED` are in `opts`; what is left to
        // the kernel was decided above.)
        let made = st
            .pager()
            .and_then(|p| p.map_anonymous_with(rlen, &opts).map_err(|e| e.to_string()));
        (made, None, 0, "anonymous memory".to_string(), true, None)
    } else {
        if st.cfg.files.is_empty() || fd < 0 {
            return None;
        }
        let (path, id, size) = fd_file(fd)?;
        // A new mapping of a file the pager maps writable and shared is the
        // kernel's, or refused (one pager mapping per such file), and the
        // kernel's reads the file: what was stored through the pager's
        // mapping is written back first, or it shows the older bytes (a
        // writable MAP_PRIVATE one, beside the pager's or over it with
        // MAP_FIXED, showed them every time).
        if any_writable() {
            write_back_before_a_mapping(st, id);
        }
        if !st.cfg.wants_path(&path) {
            return None;
        }
        let fl = open_flags(fd);
        if fl < 0 || fl & libc::O_PATH != 0 || fl & libc::O_ACCMODE == libc::O_WRONLY {
            // The kernel's EACCES (EBADF for O_PATH): a mapping must read
            // its file. Made here, its store could read nothing, and the
            // first touch was SIGBUS.
            return None;
        }
        let sealed = write_sealed(fd);
        if shared && write && sealed {
            // The kernel's EPERM: a memfd sealed against writes. (Its
            // store, an open file of its own, would take the writes until
            // the first write-back failed.)
            return None;
        }
        if shared && write && fl & libc::O_ACCMODE != libc::O_RDWR {
            // The kernel's EACCES: stores through it would write a file
            // the descriptor may not write. (Its store opens the file
            // again, for writing if the mode allows it.)
            return None;
        }
        let name = path.to_string_lossy().into_owned();
        if !shared && write {
            // A private writable mapping would be a snapshot that write(2)
            // to the file could not reach: the kernel keeps it.
            PASSED.fetch_add(1, Relaxed);
            st.say(format!(
                "{name}: a writable MAP_PRIVATE mapping is left to the kernel"
            ));
            return None;
        }
        if off < 0 || !(off as usize).is_multiple_of(PAGE) {
            return None; // the kernel's EINVAL
        }
        // (An end past 2^64 is the kernel's error: ENOMEM.)
        let end = (off as u64).checked_add(rlen as u64)?;
        if end > size.div_ceil(PAGE as u64) * PAGE as u64 {
            PASSED.fetch_add(1, Relaxed);
            st.say(format!(
                "{name}: a mapping past the end of the file is left to the kernel"
            ));
            return None;
        }
        let over =
            fixed.then(|| overlapping(st, addr as usize, (addr as usize).saturating_add(rlen)));
        if let Some(over) = over.filter(|o| !o.is_empty()) {
            // Over a pager mapping: the engine maps only into a free range,
            // so the kernel maps it (the engine follows the unmap through
            // its event). Refused as a second mapping of the file below, a
            // program's map of its file over its own mapping was ENODEV.
            // What was stored through a mapping it covers is written back
            // first: the kernel's new mapping of the file reads the file,
            // and the write-back that follows the event came after that
            // read now and then (the old bytes showed).
            write_back_covered(st, &over, "a MAP_FIXED over it");
            return None;
        }
        st.prune();
        let clash = st
            .maps
            .iter()
            .any(|e| e.file == Some(id) && (e.writable_shared || (shared && write)));
        if clash {
            return refuse_second(st, &name);
        }
        // A writable shared mapping of the kernel's keeps the file in its
        // page cache, which the pager's would not see (nor it the pager's):
        // with no pager mapping of the file, the kernel's cache is its
        // only one, and the new mapping is the kernel's too.
        let over = fixed.then(|| addr as usize..(addr as usize).saturating_add(rlen));
        if kernel_writes(id, over.as_ref()) {
            st.say(format!(
                "{name}: the kernel maps it writable and shared already: this mapping is left \
                 to the kernel too"
            ));
            return None;
        }
        // A read-only shared mapping of a descriptor opened for writing may
        // be made writable later (the kernel allows `mprotect(PROT_WRITE)`
        // there), so its store takes writes from the start; its pages go in
        // write-protected all the same, so the first write to each faults
        // and marks it dirty.
        let rdwr = fl & libc::O_ACCMODE == libc::O_RDWR && !sealed;
        let may_write = shared && (write || rdwr && st.cfg.kind == InstallKind::Shared);
        opts.kind = Some(if may_write {
            InstallKind::Shared
        } else {
            st.cfg.kind
        });
        // A fixed range is held before the store opens and the pager
        // starts: both map memory of their own, which the kernel may put in
        // a range the program has just freed, and the kernel's MAP_FIXED
        // after the engine's overlap would then have replaced the engine's
        // memory (`engine::AddressHold`). A range where something is mapped
        // is the kernel's to map over (MAP_FIXED) or refuse (EEXIST).
        let hold = fixed.then(|| engine::AddressHold::new(addr as usize, rlen));
        let _hold = match hold.transpose() {
            Ok(h) => h,
            Err(e) => {
                PASSED.fetch_add(1, Relaxed);
                st.say(format!("{name}: left to the kernel: {e}"));
                return None;
            }
        };
        let latency = st.cfg.latency;
        let mut unwritten = false;
        let mut kept = None;
        let made =
            crate::maps::file_store(fd, off as u64, rlen, may_write, latency).and_then(|s| {
                kept = shared.then(|| s.clone());
                st.pager()
                    // SAFETY: the program reaches the region's bytes through raw pointers only,
                    // and the shim makes no Rust slice of them: a file changed behind the
                    // engine shows its new bytes, as under the kernel's mmap, without breaking
                    // a Rust reference.
                    .and_then(|p| {
                        unsafe { p.map_store(s, rlen, &opts) }.map_err(|e| {
                            unwritten = matches!(e, engine::Error::UnwrittenPages { .. });
                            e.to_string()
                        })
                    })
            });
        if let (true, Err(e)) = (unwritten, &made) {
            // Pages an earlier mapping of the file stored, which the file
            // still refuses: a kernel mapping would show the older bytes,
            // and the engine would later write them over its writes.
            let msg = format!("{name}: refusing the mapping: {e}");
            st.say(msg);
            crate::set_errno(libc::EIO);
            return Some(libc::MAP_FAILED);
        }
        (made, Some(id), off as u64, name, may_write, kept)
    };
    let (made, file, base, path, may_write, shared_store) = entry;
    // (A map that failed took its hold over, or dropped it above: the
    // range is free again for the kernel's call.)
    match made {
        Ok(region) => Some(st.add(Entry {
            region,
            file,
            base,
            writable_shared: shared && write && file.is_some(),
            may_write,
            kernel_writable: false,
            shared_store,
            cap: rlen,
            path,
            span: None,
        })),
        Err(e) => {
            PASSED.fetch_add(1, Relaxed);
            st.say(format!("{path}: left to the kernel: {e}"));
            None
        }
    }
}

/// Writes back the writable shared ones of the entries `over` (indices
/// first) before `what` covers them; failures are said on stderr.
fn write_back_covered(st: &mut State, over: &[(usize, Vec<Range<usize>>)], what: &str) {
    for &(i, _) in over {
        if st.maps[i].writable_shared {
            if let Err(err) = st.maps[i].region.flush() {
                let msg = format!(
                    "{}: write-back before {what} failed: {err}",
                    st.maps[i].path
                );
                st.say(msg);
            }
        }
    }
}

/// Writes back the pager's writable shared mappings of file `id` before
/// a new mapping of it (see `mmap`); failures are said on stderr.
fn write_back_before_a_mapping(st: &mut State, id: (u64, u64)) {
    st.prune();
    let failed: Vec<String> = st
        .maps
        .iter()
        .filter(|e| e.writable_shared && e.file == Some(id))
        .filter_map(|e| {
            let err = e.region.flush().err()?;
            Some(format!(
                "{}: write-back before a mapping of it failed: {err}",
                e.path
            ))
        })
        .collect();
    for m in failed {
        st.say(m);
    }
}

/// A store over the file behind `fd` at `off`, with the latency model.
pub fn file_store(
    fd: c_int,
    off: u64,
    len: usize,
    writable: bool,
    latency: Option<engine::store::LatencyModel>,
) -> Result<Arc<dyn Store>, String> {
    let file = own_file(fd, writable)?;
    let whole: Arc<dyn Store> =
        Arc::new(engine::store::FileStore::from_file(file, writable).map_err(|e| e.to_string())?);
    let whole: Arc<dyn Store> = match latency {
        Some(m) => Arc::new(SimulatedStore::new(whole, m, 0, off ^ len as u64)),
        None => whole,
    };
    let s = engine::store::SliceStore::new(whole, off, len as u64).map_err(|e| e.to_string())?;
    Ok(Arc::new(s))
}

/// A descriptor of the store's own for the file behind the program's `fd`:
/// the file opened again through `/proc/thread-self/fd` (the calling
/// thread's table) and checked to be the same file, an open file of its
/// own.
/// A `dup` would share the program's open file, and with it `O_APPEND`
/// (which Linux honours in `pwrite`: every write-back would land at the
/// end of the file, not at its page) whether the program opened it so or
/// sets it later with `fcntl(F_SETFL)`. Where the file cannot be opened
/// again (its permissions changed since the program opened it), a `dup`,
/// for reading only: a writable store's `pwrite`s through a `dup` would
/// follow the `O_APPEND` the program may set on its descriptor at any time
/// (the mapping is then the kernel's).
fn own_file(fd: c_int, writable: bool) -> Result<std::fs::File, String> {
    let fl = open_flags(fd);
    if fl < 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    // Never more than the descriptor allows: the reopen checks the file's
    // mode, not how the program opened it.
    if writable && fl & libc::O_ACCMODE != libc::O_RDWR {
        return Err("a writable store over a descriptor not opened O_RDWR".into());
    }
    let again = std::fs::OpenOptions::new()
        .read(true)
        .write(writable)
        .custom_flags(libc::O_CLOEXEC)
        .open(format!("/proc/thread-self/fd/{fd}"));
    if let Ok(f) = again {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: a zeroed stat is a valid out-parameter.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat writes only `st`, on the program's descriptor
        // number.
        let same = unsafe { libc::fstat(fd, &mut st) } == 0
            && f.metadata()
                .is_ok_and(|m| (m.dev(), m.ino()) == (st.st_dev, st.st_ino));
        if !same {
            return Err("the descriptor's file changed while it was opened again".into());
        }
        return Ok(f);
    }
    if writable {
        // A dup shares the program's open file, and with it the O_APPEND
        // that a later fcntl(F_SETFL) may set: every write-back would land
        // at the end of the file.
        return Err("a file the store cannot open again for writing".into());
    }
    // SAFETY: F_DUPFD_CLOEXEC on the program's descriptor; a bad one fails.
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    // SAFETY: `dup` is ours alone.
    Ok(unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(dup) })
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

/// At exit: write shared mappings back, and the counters out.
pub fn unload() {
    finish("exit");
}

/// At exit or exec (`when`): write shared mappings back, and the counters
/// out.
pub fn finish(when: &str) {
    // A fork()ed child's copy of the table serves nothing and reports
    // nothing, and its lock may be held for good (see `FORKED`).
    if !here() {
        return;
    }
    let mut guard = state();
    let Some(st) = guard.as_mut() else { return };
    // Only the process that made a pager reports: every process started
    // under LD_PRELOAD loads the shim (a shell, `timeout`, the program's
    // own children), and one that paged nothing must not overwrite the
    // program's counters. A fork()ed child's copy of the pager serves
    // nothing and reports nothing.
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    if st.pager.is_none() || st.owner_pid != pid {
        return;
    }
    let mut failed = Vec::new();
    // Every mapping whose store takes writes, not only those made writable
    // through the shim: a raw `mprotect` system call passes it by (a flush
    // with nothing dirty writes and syncs nothing).
    for e in st.maps.iter().filter(|e| e.file.is_some() && e.may_write) {
        if let Err(err) = e.region.flush() {
            failed.push(format!("{}: write-back at {when} failed: {err}", e.path));
        }
    }
    // Pages of mappings unmapped while their file refused them: the pager
    // is never dropped (it lives in a static), so this is their last try.
    if let Some(Err(err)) = st.pager.as_ref().map(|p| p.flush_unmapped()) {
        let lost = st.pager.as_ref().map_or(0, |p| p.unwritten_bytes());
        failed.push(format!(
            "{lost} bytes stored through mappings already unmapped are lost: {err}"
        ));
    }
    for m in failed {
        st.say(m);
    }
    let Some(path) = st
        .cfg
        .stats
        .as_ref()
        .map(|p| p.replace("%p", &pid.to_string()))
    else {
        return;
    };
    let pager = st.pager.as_ref().expect("checked above");
    let mut text = format!("{}\npolicy {}", pager.stats(), pager.policy());
    for (k, v) in [
        ("preload_paged", &PAGED),
        ("preload_passed", &PASSED),
        ("preload_refused", &REFUSED),
        ("preload_refreshed", &REFRESHED),
    ] {
        text.push_str(&format!("\n{k} {}", v.load(Relaxed)));
    }
    text.push('\n');
    if path.ends_with(".json") {
        let fields: Vec<String> = text
            .lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(k, v)| match v.parse::<u64>() {
                Ok(n) => format!("\"{k}\": {n}"),
                Err(_) => format!("\"{k}\": \"{v}\""),
            })
            .collect();
        text = format!("{{{}}}\n", fields.join(", "));
    }
    if let Err(e) = std::fs::write(&path, text) {
        st.say(format!("writing the counters to {path}: {e}"));
    }
}
