//! Releasing the objects the application's own `munmap` left without a
//! region ([`Mm::release_object`]: dirty pages written back and synced,
//! then kept or freed), away from the thread that applied the event.
//!
//! Applying the event needs the gate's write side and the global lock,
//! and with in-thread delivery one thread reads every event: a release
//! there held every fault, and then every later `munmap` or `mremap` of
//! the application's, for as long as a slow store took. So an applied
//! unmap hands its objects over ([`Released`]) to the pager's release
//! thread (`uffd-release`), which releases them one at a time, in the
//! order they came. Where that thread does not run (not started yet, or
//! stopped as the pager goes), the applying thread releases them itself,
//! once it has let go of the gate and the global lock. Regions a map or
//! remap of the engine's own takes for unmapped are released by that
//! call, under its global lock, before its new region is published
//! ([`Released::here`]).
//!
//! Until an object is released, its store is marked as written
//! ([`crate::kept::KeptObjects::mark_writing`]), and a map of that store
//! (which must find the write-back done or listed), a flush of the
//! unmapped region and `Region::unmap` over it wait for it
//! ([`crate::kept::KeptObjects::wait_for`]); `Pager::flush_unmapped`
//! waits for every release ([`Events::quiesce`](super::Events::quiesce),
//! the `releasing` count). Calls about other stores do not: a map of
//! another store waited for a slow store's sync before
//! (`tests/reclaim_flush.rs`). An object with another holder left when the
//! unmap is applied (a residency guard, a flush, a refresh) is not queued:
//! that holder releases it when it gives its reference back, on its own
//! thread; meanwhile it is noted as held (`crate::unwritten`), and a map
//! of its store writes its dirty pages first. (A write-back in flight by such a holder, a flush, is waited
//! for through [`crate::kept::KeptObjects::writing`].)

use crate::address_space::Mm;
use crate::object::Object;
use std::collections::VecDeque;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Condvar, Mutex};

/// Objects an applied unmap left, to be released once the caller has let
/// go of the gate and the global lock: dropped, it hands them to the
/// release thread, or releases them itself where none runs. (Made with
/// [`Released::here`], it releases them itself, under the caller's lock.)
#[must_use]
pub struct Released<'a> {
    mm: &'a Mm,
    objects: Vec<Arc<Object>>,
    /// To the release thread where it runs ([`Released::new`]), or here.
    hand_over: bool,
}

impl<'a> Released<'a> {
    /// For the objects an event leaves: handed to the release thread.
    pub(crate) fn new(mm: &'a Mm) -> Released<'a> {
        Released {
            mm,
            objects: Vec::new(),
            hand_over: true,
        }
    }

    /// For the objects a map or remap of the engine's own takes for
    /// unmapped ([`super::apply::stale`], and [`super::apply::settle_stale`]
    /// from a remap; from a REMAP event it gets the event's):
    /// released by the caller, under its global lock, before its new
    /// region is published. (Handed over, the release could write the
    /// stale object's dirty pages back after the new region, over the same
    /// store, had read them: its older bytes, and then its own writes
    /// overwritten.)
    pub(crate) fn here(mm: &'a Mm) -> Released<'a> {
        Released {
            mm,
            objects: Vec::new(),
            hand_over: false,
        }
    }

    /// Adds `obj`, counted as releasing from now on, if this is its last
    /// reference; gives it back at once otherwise (the holder of the last
    /// one, a residency guard or a flush, releases the object when it is
    /// done: a guard dropped once the event is applied writes the pages
    /// back itself, `tests/guest_app.rs`).
    pub(crate) fn push(&mut self, obj: Arc<Object>) {
        if let Some(obj) = self.mm.give_back_unless_last(obj) {
            self.mm.events.releasing.fetch_add(1, SeqCst);
            self.mm.kept.mark_writing(obj.store_key);
            self.objects.push(obj);
        }
    }
}

impl Drop for Released<'_> {
    fn drop(&mut self) {
        for obj in std::mem::take(&mut self.objects) {
            let obj = match self.hand_over {
                true => self.mm.events.release.hand_over(obj),
                false => Err(obj),
            };
            if let Err(obj) = obj {
                release_one(self.mm, obj);
            }
        }
    }
}

/// Releases `obj` and counts it off; a panic in the release is caught
/// (logged, and counted off too: `quiesce` would wait for it for ever;
/// the object is leaked, see `Unreleased` in `munmap.rs`).
fn release_one(mm: &Mm, obj: Arc<Object>) {
    let key = obj.store_key;
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| mm.release_object(obj)));
    mm.kept.written_by(key);
    mm.events.releasing.fetch_sub(1, SeqCst);
    match r {
        Ok(Ok(())) => {}
        // The last piece of an object gone: its dirty shared pages are
        // written back, as a file mapping's are after munmap, and kept for
        // a later try if the store refuses them.
        Ok(Err(err)) => tracing::error!(
            error = %err,
            "writing back a region the application unmapped (its dirty pages are \
             kept: Pager::flush_unmapped)"
        ),
        Err(_) => tracing::error!("releasing a region the application unmapped panicked"),
    }
}

/// The release thread's queue. Cost: a mutex and a condition variable per
/// object handed over (one per `munmap` of a region's last piece).
#[derive(Default)]
pub struct Queue {
    state: Mutex<State>,
    ready: Condvar,
}

#[derive(Default)]
struct State {
    objects: VecDeque<Arc<Object>>,
    /// A release thread takes objects.
    running: bool,
    /// It was told to stop (once the queue is empty).
    stop: bool,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue").finish_non_exhaustive()
    }
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `obj` for the release thread; gives it back if none runs.
    fn hand_over(&self, obj: Arc<Object>) -> Result<(), Arc<Object>> {
        let mut s = self.lock();
        if !s.running || s.stop {
            return Err(obj);
        }
        s.objects.push_back(obj);
        drop(s);
        self.ready.notify_one();
        Ok(())
    }

    /// The next object to release; `None` once told to stop and empty.
    fn next(&self) -> Option<Arc<Object>> {
        let mut s = self.lock();
        loop {
            if let Some(obj) = s.objects.pop_front() {
                return Some(obj);
            }
            if s.stop {
                s.running = false;
                return None;
            }
            s = self.ready.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Starts `mm`'s release thread.
pub(crate) fn start(mm: &Arc<Mm>) -> std::io::Result<std::thread::JoinHandle<()>> {
    let q = &mm.events.release;
    q.lock().running = true;
    let worker = mm.clone();
    let t = crate::sys::thread::spawn("uffd-release".into(), move || {
        while let Some(obj) = worker.events.release.next() {
            release_one(&worker, obj);
        }
    });
    if t.is_err() {
        q.lock().running = false;
    }
    t
}

/// Tells the release thread to stop once it has released what it holds;
/// objects handed over later are released by whoever hands them over.
pub(crate) fn stop(mm: &Mm) {
    mm.events.release.lock().stop = true;
    mm.events.release.ready.notify_all();
}
