//! [`OwnDescriptor`]: a region's own userfaultfd as its object holds it
//! (per-region delivery, `crate::delivery::per_region`).

use super::Uffd;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

/// A region's own descriptor as its object holds it. Letting it go wakes
/// the descriptor's reader, which lingers past its region until the
/// descriptor is its alone (`crate::delivery::per_region`).
#[derive(Debug)]
pub struct OwnDescriptor {
    uffd: ManuallyDrop<Arc<Uffd>>,
    /// The reader's eventfd (kept open by this reference).
    wake: Arc<OwnedFd>,
}

impl OwnDescriptor {
    /// `uffd`, whose reader `wake` (an eventfd) wakes.
    pub fn new(uffd: Arc<Uffd>, wake: Arc<OwnedFd>) -> OwnDescriptor {
        OwnDescriptor {
            uffd: ManuallyDrop::new(uffd),
            wake,
        }
    }

    /// The descriptor.
    pub fn arc(&self) -> &Arc<Uffd> {
        &self.uffd
    }
}

impl std::ops::Deref for OwnDescriptor {
    type Target = Uffd;
    fn deref(&self) -> &Uffd {
        &self.uffd
    }
}

impl Drop for OwnDescriptor {
    /// Lets the descriptor go, then wakes its reader (in that order: the
    /// reader looks at the reference count when woken).
    fn drop(&mut self) {
        // SAFETY: dropped once, here; `self.uffd` is not used after.
        unsafe { ManuallyDrop::drop(&mut self.uffd) };
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a live u64 to an eventfd this holds
        // open.
        unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}
