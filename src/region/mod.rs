//! [`Region`]: a mapped range whose faults the engine serves.

use crate::error::{Error, Result};
use crate::pager::inner::PagerInner;
use crate::sys::PAGE_SIZE;
use std::sync::Arc;

mod residency;
mod store_sync;

/// A registered mapping. Dropping it unmaps it (writing back a file-backed
/// region first).
///
/// # Memory contract
/// The bytes of a region behave as ordinary memory owned by this handle:
/// the engine moves pages in and out behind the application's back, but a
/// page's contents never change except through the application's own
/// writes. So [`Region::as_slice`] and [`Region::as_mut_slice`] are safe
/// under Rust's usual borrow rules. Threads that share a region write it
/// through [`Region::as_ptr`] with their own synchronisation.
///
/// For a region over a store that holds the contract rests on the store:
/// a clean page the engine evicted is read from the store again, so a
/// store changed behind the engine (the application writes a store it
/// still holds, another process writes a mapped file) would change the
/// bytes under a live slice, which Rust forbids. That is why
/// [`Pager::map_store`](crate::Pager::map_store),
/// [`Pager::map_file`](crate::Pager::map_file) and
/// [`PagerBuilder::swap_to`](crate::PagerBuilder::swap_to) are `unsafe`,
/// as `memmap2::Mmap::map` is: their callers promise the *store contract*
/// (written on `map_store`), whose way out is [`Region::refresh`], which
/// takes `&mut self`. [`Pager::map_anonymous`](crate::Pager::map_anonymous)
/// and [`Pager::map_zero`](crate::Pager::map_zero) have stores nothing
/// else can reach, and are safe.
///
/// The application's own `munmap`, `mremap` or `MAP_FIXED` mapping over
/// region memory is its own `unsafe` act, and the engine follows it
/// ([`Region::mapped`] says what is left, and where a moved region went),
/// but the handle's view does not: [`as_ptr`](Region::as_ptr),
/// [`len`](Region::len) and the slices stay the range the region was
/// mapped at (or last [`remap`](Region::remap)ped to). So whoever makes
/// that call also promises, as for any memory a safe type owns, that no
/// slice of the region is alive then and none is made after it: the range
/// may hold nothing, or someone else's memory. The calls that take an
/// offset check the range is still the region's and refuse it otherwise.
///
/// An access to a poisoned page (its store read failed repeatedly) gets
/// SIGBUS, as a hardware memory error would.
///
/// In in-thread delivery (and with user-mode-only descriptors) a fault taken
/// *inside a system call* is not delivered: `read(2)` into an absent page
/// fails with EFAULT. Hold the buffer with [`Region::lock_resident`] for
/// the call ([`Region::prefault`] right before it is best-effort under a
/// budget: another thread may evict the pages again), or use handler-thread
/// delivery.
///
/// ```
/// use uffd_pager::{Pager, PAGE_SIZE};
///
/// let pager = Pager::builder().build()?;
/// let mut region = pager.map_anonymous(8 * PAGE_SIZE)?;
/// region.as_mut_slice()[..4].copy_from_slice(b"page");
/// region.dontneed(0, PAGE_SIZE)?; // as madvise(MADV_DONTNEED): zeros again
/// assert_eq!(&region.as_slice()[..4], &[0; 4]);
/// region.remap(4 * PAGE_SIZE)?; // as mremap: shrinks (or grows within its store)
/// assert_eq!(region.len(), 4 * PAGE_SIZE);
/// region.unmap()?; // or just drop it
/// # Ok::<(), uffd_pager::Error>(())
/// ```
pub struct Region {
    owner: Arc<PagerInner>,
    id: u64,
    start: usize,
    len: usize,
    page_size: usize,
    kind: crate::object::InstallKind,
    /// The object it mapped, for a flush after the application unmapped
    /// all of it (its pages may wait in [`crate::unwritten`]): found there
    /// by address. Weak: the region does not keep it alive, but its
    /// allocation stays, so no other object takes that address meanwhile.
    /// Never upgraded: a reference revived from it could be the last of
    /// an object being released from the kept or unwritten list, and
    /// release it twice.
    object: std::sync::Weak<crate::object::Object>,
    /// Its store, as a flush in flight holds it
    /// ([`crate::kept::KeptObjects::writing`]): a flush after the
    /// application unmapped the region waits for one.
    store: crate::kept::StoreKey,
}

/// `Region { addr: 0x7f.., len: 65536, kind: Shared, writable: true }`:
/// where it is and what it is, not the engine state behind it.
impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (pinned, writable, kind) = self.vma_flags();
        let mut d = f.debug_struct("Region");
        d.field("addr", &format_args!("{:#x}", self.start))
            .field("len", &self.len)
            .field("kind", &kind)
            .field("writable", &writable);
        if pinned {
            d.field("pinned", &true);
        }
        d.finish()
    }
}

impl Region {
    pub(crate) fn new(
        owner: Arc<PagerInner>,
        id: u64,
        start: usize,
        len: usize,
        page_size: usize,
        kind: crate::object::InstallKind,
        (object, store): (
            std::sync::Weak<crate::object::Object>,
            crate::kept::StoreKey,
        ),
    ) -> Region {
        Region {
            owner,
            id,
            start,
            len,
            page_size,
            kind,
            object,
            store,
        }
    }

    /// How the region's pages are installed: the
    /// [`MapOptions::kind`](crate::MapOptions::kind) it was mapped with, or
    /// the engine's choice ([`MapOptions::install_kind`](crate::MapOptions::install_kind)).
    pub fn kind(&self) -> crate::object::InstallKind {
        self.kind
    }

    /// Bytes per page: [`PAGE_SIZE`], or
    /// [`HUGE_PAGE_SIZE`](crate::HUGE_PAGE_SIZE) for a region mapped with
    /// 2 MiB pages ([`MapOptions::page_size`](crate::MapOptions::page_size)).
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// First address: where the region was mapped, or last
    /// [`remap`](Self::remap)ped to. After the application's own `mremap`
    /// of it, [`mapped`](Self::mapped) says where it is.
    ///
    /// Example: [`Region`](crate::Region).
    pub fn as_ptr(&self) -> *mut u8 {
        self.start as *mut u8
    }

    /// Length in bytes.
    ///
    /// Example: [`Region`](crate::Region).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty (never).
    ///
    /// Example: [`Region`](crate::Region).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The parts of the region still mapped, in address order: the whole
    /// of it until the application unmaps or moves region memory with its
    /// own `munmap`, `mremap` or a `MAP_FIXED` mapping over it (the engine
    /// follows those through userfaultfd events; the call waits until every
    /// event sent so far is applied). Empty once all of it is gone, and in
    /// a `fork()`ed child. Costs a lock and a table lookup per piece.
    ///
    /// ```
    /// use uffd_pager::{Pager, PAGE_SIZE};
    ///
    /// let pager = Pager::builder().build()?;
    /// let region = pager.map_anonymous(4 * PAGE_SIZE)?;
    /// let start = region.as_ptr() as usize;
    /// // SAFETY: no slice of the region is alive; the page is not used again.
    /// unsafe { libc::munmap((start + PAGE_SIZE) as *mut _, PAGE_SIZE) };
    /// assert_eq!(
    ///     region.mapped(),
    ///     [start..start + PAGE_SIZE, start + 2 * PAGE_SIZE..start + 4 * PAGE_SIZE]
    /// );
    /// # Ok::<(), uffd_pager::Error>(())
    /// ```
    pub fn mapped(&self) -> Vec<std::ops::Range<usize>> {
        // (Its lock is one an event being applied takes: a handler that
        // faulted under it would wait for that event, and so for itself.)
        let _deferred = crate::sys::thread::Deferred::new();
        self.owner.mm.mapped(self.id)
    }

    /// Panics in a `fork()`ed child, where the region is not mapped (see
    /// [`crate::fork`]): a slice of it there would point at nothing.
    #[inline]
    fn assert_mapped_here(&self) {
        if self.owner.mm.in_child() {
            panic!("a Region cannot be used in a fork()ed child: its memory is not mapped there");
        }
    }

    /// The region's bytes.
    ///
    /// # Panics
    /// In a `fork()`ed child of the process that made the region.
    ///
    /// Example: [`Region`](crate::Region).
    pub fn as_slice(&self) -> &[u8] {
        self.assert_mapped_here();
        // SAFETY: the range is mapped for as long as `self` lives, in the
        // process that made it (checked above), unless the application
        // unmapped or moved it with its own unsafe call, whose caller
        // promised to make no slice after it; see the memory contract.
        unsafe { std::slice::from_raw_parts(self.start as *const u8, self.len) }
    }

    /// The region's bytes, writable. Writing a region mapped read-only
    /// (see [`Region::protect`]) raises SIGSEGV, as it would with mmap.
    ///
    /// # Panics
    /// In a `fork()`ed child of the process that made the region.
    ///
    /// Example: [`Region`](crate::Region).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.assert_mapped_here();
        // SAFETY: as above, and `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.start as *mut u8, self.len) }
    }

    /// The addresses of the whole pages (of the region's page size)
    /// covering `[offset, offset+len)`, checked to lie inside the region
    /// and to be its memory still: the application may have moved or
    /// unmapped it with its own `mremap`/`munmap`, and another region may
    /// be mapped there since (its pages are not this call's to drop or
    /// fault in).
    fn page_span(&self, offset: usize, len: usize) -> Result<(usize, usize)> {
        if offset.checked_add(len).is_none_or(|e| e > self.len) {
            return Err(Error::OutOfRange {
                offset,
                len,
                region_len: self.len,
            });
        }
        let start = (self.start + offset) & !(self.page_size - 1);
        let end = (self.start + offset + len).next_multiple_of(self.page_size);
        let mm = &self.owner.mm;
        mm.check_owner()?;
        // (The application's own munmap or mremap applied first.)
        mm.events.wait_applied();
        let mut pieces: Vec<_> = mm
            .piece_spans(self.id)
            .iter()
            .map(|v| (v.start, v.end))
            .collect();
        pieces.sort_unstable();
        let mut at = start;
        for (s, e) in pieces {
            if s <= at && at < e {
                at = e;
            }
        }
        if at < end {
            return Err(Error::Config(format!(
                "{:#x}+{:#x} is no longer the region's memory: the application moved or \
                 unmapped it with its own mremap/munmap",
                at,
                end - at
            )));
        }
        Ok((start, end))
    }

    /// Runs the engine's fault path on every page of `[start, end)`.
    fn fault_span(&self, (start, end): (usize, usize), write: bool) -> Result<()> {
        let _deferred = crate::sys::thread::Deferred::new();
        let mm = &self.owner.mm;
        crate::inject::before_own_range(start);
        mm.check_owner()?;
        // An event the application's own `madvise` or `munmap` raised may
        // be read and not applied yet (handler-thread delivery): apply it
        // first, or these faults would act on the old view.
        mm.events.wait_applied();
        let mut a = start;
        while a < end {
            if crate::fault::handle_fault(mm, a, crate::fault::Access::engine(write, self.id))
                != crate::fault::Resolution::Resolved
            {
                return Err(Error::Store(crate::store::StoreError(libc::EIO)));
            }
            a += self.page_size;
        }
        Ok(())
    }

    /// Whether the region is pinned and writable, and its install kind:
    /// those of its pieces (by its id: the application may have unmapped
    /// its first pages with its own `munmap`, and another region may be
    /// mapped there since). Not pinned nor writable once no piece is left.
    fn vma_flags(&self) -> (bool, bool, crate::object::InstallKind) {
        let pieces = self.owner.mm.piece_spans(self.id);
        pieces.first().map_or((false, false, self.kind), |v| {
            (v.pinned, v.writable, v.kind)
        })
    }

    /// Advises how the region will be read from now on (the
    /// `madvise(MADV_NORMAL | MADV_RANDOM)` analog, over the whole region):
    /// with [`Access::Random`](crate::Access::Random) its faults request no
    /// readahead, with [`Access::Normal`](crate::Access::Normal) readahead
    /// adapts again. The install kind stays what it was at map time
    /// ([`Region::kind`]; `MapOptions::access` chooses it). Cheap: a flag
    /// per piece of the region, under the global lock's read side.
    ///
    /// ```
    /// # use uffd_pager::{Access, MapOptions, Pager};
    /// # use uffd_pager::store::MemoryStore;
    /// # use std::sync::Arc;
    /// let pager = Pager::builder().build()?;
    /// let store = Arc::new(MemoryStore::new(1 << 20)?);
    /// // SAFETY: the store was moved in; nothing else can change it.
    /// let region = unsafe { pager.map_store(store, 1 << 20, &MapOptions::default()) }?;
    /// region.advise(Access::Random)?;
    /// assert_eq!(region.as_slice()[4096 * 100], 0);
    /// # Ok::<(), uffd_pager::Error>(())
    /// ```
    pub fn advise(&self, access: crate::Access) -> Result<()> {
        self.owner.mm.advise(self.id, access)
    }

    /// Makes the region read-only (`false`) or read-write (`true`). A write
    /// to a read-only region gets SIGSEGV.
    ///
    /// An anonymous region of 4 KiB pages is made read-only with write
    /// protection (`UFFDIO_WRITEPROTECT` of every page), not `mprotect`: its
    /// mapping stays writable in `/proc/self/maps`, so reclaim can still
    /// move its pages out (`UFFDIO_MOVE` moves only out of writable
    /// mappings). The first write to it makes it read-only with `mprotect`
    /// after all, so the write gets the kernel's own answer (SIGSEGV, or
    /// `EFAULT` inside a system call); its resident pages then stay until
    /// it is made writable again. Change it back with this call, not your
    /// own `mprotect`; to make part of it writable with your own, call
    /// [`protect_in_kernel`](Self::protect_in_kernel) first.
    ///
    /// If your own `munmap` of the region's range is on its way to the
    /// engine, the call waits until it is applied (the range may hold your
    /// new memory by then, whose protection it leaves alone), and protects
    /// what is left of the region; `Error::Sys` with `EAGAIN` if that takes
    /// more than 10 s. A region the application split into pieces (its own
    /// `munmap` of a middle part) is changed piece by piece: on an error the
    /// pieces before the one that failed keep their new protection, as the
    /// kernel's `mprotect` over several mappings leaves them.
    ///
    /// Example: [`Region`](crate::Region).
    pub fn protect(&self, writable: bool) -> Result<()> {
        self.owner.mm.protect(self.id, writable)
    }

    /// Makes a read-only region read-only in its mapping too, for an
    /// application about to make part of it writable with its own
    /// `mprotect` (a collector's write barrier unprotecting the page a
    /// write faulted on).
    ///
    /// Made read-only with write protection ([`protect`](Self::protect)),
    /// an anonymous region of 4 KiB pages is still writable in its
    /// mapping, so that `mprotect(PROT_WRITE)` would change nothing, and
    /// the engine, which cannot tell a write there from one to the rest of
    /// the region, would refuse it (SIGSEGV). After this call the kernel's
    /// `mprotect` decides, and a write it allows is served. What it costs
    /// is what the first write to such a region costs: an `mprotect`, and
    /// its resident pages stay until it is made writable again. A no-op
    /// for any other region.
    pub fn protect_in_kernel(&self) -> Result<()> {
        self.owner.mm.protect_in_kernel(self.id)
    }

    /// Grows or shrinks the region in place if possible, moving it if it
    /// must. Growing is bounded by the backing store's length.
    ///
    /// Example: [`Region`](crate::Region).
    pub fn remap(&mut self, new_len: usize) -> Result<()> {
        self.remap_to(new_len, None)
    }

    /// Moves (and optionally resizes) the region to `addr`.
    ///
    /// On an error the region is where it was, with two exceptions: if
    /// the kernel moved the mapping and registering the new range then
    /// failed (`UFFDIO_REGISTER` at `vm.max_map_count`), the region
    /// follows the move ([`as_ptr`](Self::as_ptr) and [`len`](Self::len)
    /// say where it is now), its memory is inaccessible, and the error is
    /// [`Error::Sys`]; only unmapping it is left to do. And a shrinking
    /// move that a kernel refuses after it has unmapped the tail leaves
    /// the region shrunk where it was ([`len`](Self::len) says so), with
    /// the error.
    ///
    /// Example: [`Region`](crate::Region).
    pub fn remap_to(&mut self, new_len: usize, addr: Option<usize>) -> Result<()> {
        self.remap_checked(new_len, addr, false)
    }

    /// [`remap_to`](Self::remap_to) `addr`, replacing what the program
    /// mapped there, as the kernel's `mremap(MREMAP_FIXED)` does (a range
    /// it reserved for the move): once the move's checks have passed, in
    /// one step, so that a refused move leaves the range as it was and no
    /// other thread's mapping lands in it meanwhile. A range with pager
    /// memory in it (a region, an [`AddressHold`](crate::AddressHold) not
    /// yet taken over), or over the region itself, is still
    /// [`Error::Overlap`].
    ///
    /// # Safety
    /// Nothing in `[addr, addr + new_len)` that the program (or anything
    /// else in the process) still uses: it is unmapped.
    pub unsafe fn remap_over(&mut self, new_len: usize, addr: usize) -> Result<()> {
        self.remap_checked(new_len, Some(addr), true)
    }

    fn remap_checked(&mut self, new_len: usize, addr: Option<usize>, replace: bool) -> Result<()> {
        if new_len == 0 {
            return Err(Error::ZeroLength);
        }
        if self.page_size != PAGE_SIZE {
            return Err(Error::Config(
                "a region of 2 MiB pages cannot be remapped".into(),
            ));
        }
        if !new_len.is_multiple_of(PAGE_SIZE) {
            return Err(Error::Unaligned {
                what: "length",
                value: new_len,
                page_size: PAGE_SIZE,
            });
        }
        if let Some(a) = addr {
            if a % PAGE_SIZE != 0 || a == 0 {
                return Err(Error::Unaligned {
                    what: "address",
                    value: a,
                    page_size: PAGE_SIZE,
                });
            }
        }
        // Once the kernel moved the mapping the region follows it, even if
        // registering the new range failed (then inaccessible: see
        // `Mm::remap`), so no slice points at memory it no longer owns.
        let (start, registered) = self.owner.mm.remap(self.id, new_len, addr, replace)?;
        self.start = start;
        self.len = new_len;
        registered
    }

    /// Unmaps the region, reporting write-back errors (dropping it does the
    /// same but can only log them). Dirty pages the store refused are kept
    /// and written later: see
    /// [`Pager::flush_unmapped`](crate::Pager::flush_unmapped).
    ///
    /// Example: [`Region`](crate::Region).
    pub fn unmap(self) -> Result<()> {
        let me = std::mem::ManuallyDrop::new(self);
        let r = me.owner.mm.unmap(me.id, me.store);
        // Every field with a destructor goes (the `Weak` too: left, it
        // kept the object's allocation for ever).
        // SAFETY: `me` is never used again, and each field is moved out
        // exactly once.
        unsafe {
            drop(std::ptr::read(&me.owner));
            drop(std::ptr::read(&me.object));
        }
        r
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // In a fork()ed child there is nothing of the region to release
        // (and the parent's must not be touched).
        if self.owner.mm.in_child() {
            return;
        }
        if let Err(e) = self.owner.mm.unmap(self.id, self.store) {
            tracing::error!(
                start = self.start,
                error = %e,
                "unmapping region (dirty pages the store refused are kept: Pager::flush_unmapped)"
            );
        }
    }
}
