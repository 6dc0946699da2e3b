//! The UMap calls' process-wide state ([`State`]: the settings, the one
//! pager, its regions) behind one lock, how a `fork()`ed child takes it,
//! and the write-back at exit.

use crate::umap_settings::Settings;
use engine::{Pager, Region};
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

/// The process's UMap state.
pub(crate) struct State {
    pub(crate) settings: Settings,
    /// The UMap page size in force: the one the pager was made with (a
    /// setter called after the first `umap` changes only the getter's).
    pub(crate) unit: usize,
    pub(crate) pager: Option<Pager>,
    pub(crate) regions: Vec<Region>,
}

/// Made by the first call that locks it ([`state`]), under the lock: a
/// `fork()`ed child of a process whose thread was making it then (reading
/// the environment and the CPU count) finds the lock held by a thread it
/// does not have, and answers `EPERM`, where a `OnceLock` being
/// initialised made it wait for ever.
static STATE: Mutex<Option<State>> = Mutex::new(None);

/// The state's lock, held: the holder's thread id is in [`HOLDER`] while
/// it is (so that the exit's write-back can tell another thread's call in
/// flight, which it waits for, from one of its own thread's).
pub(crate) struct Held(MutexGuard<'static, Option<State>>);

/// The thread id of the state lock's holder, or 0.
static HOLDER: AtomicI32 = AtomicI32::new(0);

impl std::ops::Deref for Held {
    type Target = State;
    fn deref(&self) -> &State {
        self.0.as_ref().expect("made by `state`")
    }
}

impl std::ops::DerefMut for Held {
    fn deref_mut(&mut self) -> &mut State {
        self.0.as_mut().expect("made by `state`")
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // (Before the guard, a field, unlocks.)
        HOLDER.store(0, Relaxed);
    }
}

fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// The state, locked; or, in a `fork()`ed child whose parent had it
/// locked at the fork (by a thread the child does not have, so it stays
/// locked for ever), EPERM with a message, where waiting would hang.
pub(crate) fn state() -> Result<Held, i32> {
    // Noted before the first lock: a child forked from here on takes it
    // the careful way ([`lock_in_child`]), also while this call makes the
    // state.
    let _ = OWNER_PID.compare_exchange(0, std::process::id(), Relaxed, Relaxed);
    let m = &STATE;
    let g = if forked() {
        lock_in_child(m).ok_or_else(|| {
            crate::fail(
                libc::EPERM,
                "umap: a fork()ed child of a process in the middle of a UMap call",
            )
            .abs()
        })?
    } else {
        m.lock().unwrap_or_else(|e| e.into_inner())
    };
    HOLDER.store(gettid(), Relaxed);
    // (Held first: a panic below clears `HOLDER` as it unlocks.)
    let mut held = Held(g);
    if held.0.is_none() {
        *held.0 = Some(State {
            settings: Settings::from_env(),
            unit: engine::PAGE_SIZE,
            pager: None,
            regions: Vec::new(),
        });
    }
    Ok(held)
}

/// The process that made the state (0: none yet).
static OWNER_PID: AtomicU32 = AtomicU32::new(0);

/// Whether this is a `fork()`ed child of the process that made the state.
fn forked() -> bool {
    let owner = OWNER_PID.load(Relaxed);
    owner != 0 && owner != std::process::id()
}

/// The state locked in a `fork()`ed child, or `None` where a thread of the
/// parent held it at the fork (it stays locked for ever). A thread of the
/// child's that holds it (its tid is one of ours) is waited for. A holder
/// writes its tid right after it locks and clears it right before it
/// unlocks, so the lock can be held with no tid written for a moment: the
/// lock is tried again, and taken for the parent's once it has stayed
/// locked with none for 100 ms (a parent's thread that forked us in that
/// moment never writes one). Once the child has had the lock, the state is
/// its own: later calls lock it as the parent's did.
fn lock_in_child(m: &'static Mutex<Option<State>>) -> Option<MutexGuard<'static, Option<State>>> {
    use std::sync::TryLockError;
    let mut silent = 0;
    let g = loop {
        match m.try_lock() {
            Ok(g) => break g,
            Err(TryLockError::Poisoned(p)) => break p.into_inner(),
            Err(TryLockError::WouldBlock) => match HOLDER.load(Relaxed) {
                0 if silent < 100 => silent += 1,
                0 => return None,
                tid if std::path::Path::new(&format!("/proc/self/task/{tid}")).exists() => {
                    silent = 0
                }
                _ => return None,
            },
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    OWNER_PID.store(std::process::id(), Relaxed);
    Some(g)
}

/// At exit: the regions the program never `uunmap`ped are written back
/// (as the kernel keeps what was stored through a shared mapping), and so
/// are pages of regions unmapped while their file refused them; what
/// fails is said on stderr. Another thread's call in flight (a `uunmap`
/// writing its region back, which `exit` would cut short) is waited for,
/// up to [`EXIT_WAIT`]. Skipped if this thread holds the state (an exit
/// from inside a UMap call on this thread), after that wait, or in a
/// `fork()`ed child (a region's flush refuses to run there).
extern "C" fn umap_fini() {
    // (An exit from a signal handler that interrupted the engine serving
    // a fault on this thread: what a write-back would wait for may be
    // held here.)
    if engine::in_engine() {
        return;
    }
    let _ = std::panic::catch_unwind(|| {
        use std::sync::TryLockError;
        // (No UMap call was made.)
        if OWNER_PID.load(Relaxed) == 0 {
            return;
        }
        let m = &STATE;
        let deadline = std::time::Instant::now() + EXIT_WAIT;
        // A fork()ed child whose parent was in a call at the fork: the
        // state stays locked by a thread the child does not have (and the
        // regions in it are the parent's, which the child cannot write
        // anyway).
        if forked() && lock_in_child(m).map(drop).is_none() {
            return;
        }
        let st = loop {
            match m.try_lock() {
                Ok(st) => break st,
                // A call that panicked (caught) while it held the state: the
                // regions are still there to write.
                Err(TryLockError::Poisoned(p)) => break p.into_inner(),
                Err(TryLockError::WouldBlock)
                    if HOLDER.load(Relaxed) != gettid() && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err(TryLockError::WouldBlock) => {
                    say("a call was in flight at exit: regions not written back");
                    return;
                }
            }
        };
        let Some(st) = st.as_ref() else { return };
        let mut r = Ok(());
        for region in &st.regions {
            // (A private copy has nothing to write: `Ok` at once.)
            r = r.and(region.flush());
        }
        if let Some(p) = &st.pager {
            r = r.and(p.flush_unmapped());
        }
        match r {
            Err(engine::Error::ForkedChild) | Ok(()) => {}
            Err(e) => {
                say(format_args!("write-back at exit failed: {e}"));
            }
        }
    });
}

/// How long the exit's write-back waits for another thread's call.
const EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

#[used]
#[link_section = ".fini_array"]
static UMAP_FINI: extern "C" fn() = umap_fini;

/// Writes `umap: {msg}` and a newline to stderr with one `write(2)`, not
/// through `std::io::stderr()`: a child `fork()`ed while a parent thread
/// held std's stderr lock inherits it held, and would wait for ever. A
/// broken stderr is ignored (UMap reports there; the program goes on).
pub(crate) fn say(msg: impl std::fmt::Display) {
    let line = format!("umap: {msg}\n");
    // SAFETY: write(2) of a buffer we own.
    let _ = unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}
