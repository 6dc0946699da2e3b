//! One userfaultfd per region ([`crate::Delivery::PerRegion`]).
//!
//! Every region the pager maps is registered with a descriptor of its own,
//! and a handler thread of its own serves it. The kernel keeps one fault
//! wait queue per descriptor, so this shards it by region, and a fault
//! wakes only the handler of its region: on a small machine the scheduler
//! tends to run that handler where its faulting thread just blocked, with
//! no idle-vCPU wake-up in between (`uffd-pager bench wakeup` measures this
//! against the other placements on the raw floor).
//!
//! The pager's own descriptors stay open, with nothing registered on them
//! and no reader (reclaim's staging area has a descriptor of its own). A
//! region's descriptor lives in its object
//! ([`crate::object::Object::region_uffd`], an [`OwnDescriptor`], opened through
//! [`RegionDescriptors`]); every ioctl on the region's range goes
//! through it.
//!
//! # Cost
//! Two descriptors (the userfaultfd and its thread's stop eventfd) and one
//! thread per region, made at map time. When the region goes (unmapped by
//! the engine, or by the application, whose event is applied), its thread
//! is told so and lingers (see `read`'s module docs): it serves the
//! descriptor until its object lets the descriptor go, which is when the
//! region's release has written it back (not while a residency guard
//! holds the object or its dirty pages wait in the unwritten list), then
//! leaves, closing the descriptor, and is joined at the next map, unmap
//! or retire, or when the pager goes. So an object a residency guard
//! holds, or the unwritten list keeps (its store refused its dirty pages),
//! keeps its thread and both descriptors too, and the thread wakes ten
//! times a second to look whether the object has let go. Meant for a few
//! large regions, not 10⁵.
//!
//! The lingering serves what the kernel keeps registered on the
//! descriptor that the engine never listed: the tail of a region the
//! application grew in place with its own `mremap`, or a source it kept
//! with `MREMAP_DONTUNMAP`. A touch there finds no region (SIGSEGV on its
//! third try, as in-thread delivery answers it), and the application's
//! `munmap` of it returns once its event is read. Once the object has gone
//! the descriptor closes, and the kernel unregisters such a range; a
//! child `fork()`ed since holds no copy of it that would keep the range
//! registered (the fork handler covers the engine's descriptors in the
//! child, `crate::sys::uffd::inherit`: not one opened or closed during the
//! fork or past that list's 1,024 slots, nor any without `/proc` and
//! `/dev/null`). Not covered: a region's object that outlives the pager.

use super::threads::{HandlerPool, Serve};
use crate::address_space::{Mm, RegionDescriptors};
use crate::sys::uffd::{OwnDescriptor, Uffd, Want};
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, PoisonError, Weak};

/// The per-region descriptors of one pager and their handlers.
#[derive(Debug)]
pub struct PerRegion {
    features: u64,
    user_mode_only: bool,
    /// The address space the handlers serve (a weak reference: the handlers
    /// hold strong ones, and [`PerRegion::close_all`] breaks that cycle when
    /// the pager goes).
    mm: Weak<Mm>,
    live: Mutex<Vec<(RawFd, HandlerPool)>>,
    /// Handlers told that their region is gone, lingering or returned, and
    /// not joined yet ([`RegionDescriptors::retire`]).
    retired: Mutex<Vec<HandlerPool>>,
}

impl PerRegion {
    /// Per-region delivery for `mm`, opening descriptors with `features`
    /// (user-mode-only if `user_mode_only`, as the pager's own).
    pub fn new(features: u64, user_mode_only: bool, mm: Weak<Mm>) -> PerRegion {
        PerRegion {
            features,
            user_mode_only,
            mm,
            live: Mutex::new(Vec::new()),
            retired: Mutex::new(Vec::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(RawFd, HandlerPool)>> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Joins the retired handlers that have returned.
    fn reap(&self) {
        let done: Vec<HandlerPool> = {
            let mut retired = self.retired.lock().unwrap_or_else(PoisonError::into_inner);
            let (done, running) = std::mem::take(&mut *retired)
                .into_iter()
                .partition(HandlerPool::is_finished);
            *retired = running;
            done
        };
        drop(done);
    }

    /// Takes the handler of `uffd` out of the live ones.
    fn take(&self, uffd: &Uffd) -> Option<HandlerPool> {
        let mut live = self.lock();
        live.iter()
            .position(|(fd, _)| *fd == uffd.fd())
            .map(|i| live.swap_remove(i).1)
    }
}

impl RegionDescriptors for PerRegion {
    /// Opens a descriptor for a new region and starts its handler thread.
    fn open(&self, quiet: bool) -> std::io::Result<OwnDescriptor> {
        self.reap();
        let mm = self.mm.upgrade().ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::NotFound, "the pager is gone")
        })?;
        let want = if self.user_mode_only {
            Want::UserModeOnly
        } else {
            Want::Full
        };
        let uffd = Uffd::open_as(crate::events::features(self.features, quiet), want, true)
            .map(Arc::new)
            // (Its errno kept: EMFILE, one descriptor per region.)
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno))?;
        let pool = HandlerPool::start_on(&mm, Serve::Region(uffd.clone()), 1, 0, "uffd-region")?;
        let wake = pool.waker();
        self.lock().push((uffd.fd(), pool));
        Ok(OwnDescriptor::new(uffd, wake))
    }

    /// Stops the handler of `uffd` (joins it).
    fn close(&self, uffd: &Uffd) {
        drop(self.take(uffd));
        self.reap();
    }

    /// Tells the handler of `uffd` that its region is gone: it lingers
    /// (see the module docs); joined later.
    fn retire(&self, uffd: &Uffd) {
        self.reap();
        // Moved under the live list's lock: a `close_all` between the two
        // steps would miss the pool, whose reader would linger holding the
        // address space.
        let mut live = self.lock();
        if let Some(i) = live.iter().position(|(fd, _)| *fd == uffd.fd()) {
            let pool = live.swap_remove(i).1;
            pool.signal_linger();
            self.retired
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(pool);
        }
    }

    /// Stops every handler (the pager is going).
    fn close_all(&self) {
        let all = std::mem::take(&mut *self.lock());
        drop(all);
        let retired =
            std::mem::take(&mut *self.retired.lock().unwrap_or_else(PoisonError::into_inner));
        drop(retired);
    }
}
