//! `uffd_pager`: a pager made from a config struct.

use crate::{abi, fail, fail_with, guard, non_null};
use engine::{Delivery, Pager, Policy, PolicyKind};
use std::ffi::{c_char, CStr};

/// Every fault under the global lock (kernels before 6.4).
pub const UFFD_PAGER_POLICY_GLOBAL_ONLY: u32 = 0;
/// Region attempt, then the global lock on RETRY (mainline).
pub const UFFD_PAGER_POLICY_VANILLA: u32 = 1;
/// One more region attempt on RETRY, then the global lock (the default).
pub const UFFD_PAGER_POLICY_RETRY_ONCE: u32 = 2;
/// As RETRY_ONCE, the second attempt always `tried`.
pub const UFFD_PAGER_POLICY_RETRY_ONCE_TRIED: u32 = 3;

/// The faulting thread serves its own fault (SIGBUS); faults inside system
/// calls fail with EFAULT.
pub const UFFD_PAGER_DELIVERY_IN_THREAD: u32 = 0;
/// A pool of handler threads serves faults, also those inside system calls.
pub const UFFD_PAGER_DELIVERY_THREADS: u32 = 1;
/// One descriptor and handler thread per region.
pub const UFFD_PAGER_DELIVERY_PER_REGION: u32 = 2;

/// How a pager is made ([`uffd_pager_new`]). Start from
/// [`uffd_pager_config_init`] and change what you need: fields added later
/// get their defaults there.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct uffd_pager_config {
    /// `sizeof(uffd_pager_config)` as the program was built: set by
    /// [`uffd_pager_config_init`]. A library newer than the header gives
    /// the fields the program lacks their defaults; an older one refuses
    /// fields it does not know that are set (`-E2BIG`).
    pub size: usize,
    /// Memory budget in bytes (rounded up to pages; at least 4 of them, a
    /// smaller one is refused with `-EINVAL`); 0: unlimited.
    pub budget_bytes: u64,
    /// `UFFD_PAGER_POLICY_*` (default RETRY_ONCE).
    pub policy: u32,
    /// `UFFD_PAGER_DELIVERY_*` (default IN_THREAD).
    pub delivery: u32,
    /// Handler threads for DELIVERY_THREADS; 0: one per CPU.
    pub handler_threads: u32,
    /// Largest readahead window in pages (default 32); 0: no readahead.
    pub readahead_pages: u32,
    /// Readahead threads (default 2; 0 counts as 1).
    pub readahead_threads: u32,
    /// Fault-around cluster in pages (default 64, a power of two); 0 or 1:
    /// none.
    pub fault_around_pages: u32,
    /// Run the background reclaimer (default true).
    pub kswapd: bool,
    /// Zero (room for later fields).
    pub _reserved: [u8; 7],
    /// Directory for anonymous regions' swap files; NULL: swap in memory.
    pub swap_dir: *const c_char,
}

/// Fills `cfg`, of `size` bytes (`sizeof *cfg`), with the defaults: no
/// budget, RETRY_ONCE, in-thread delivery, the engine's readahead (32
/// pages, 2 threads) and fault-around (64 pages), kswapd on, swap in
/// memory; and `cfg->size` with `size`.
///
/// Returns 0, or -EINVAL for a NULL `cfg` or a `size` smaller than any
/// version of the struct (nothing written).
///
/// # Safety
/// `cfg` is NULL or points at `size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn uffd_pager_config_init(cfg: *mut uffd_pager_config, size: usize) -> i32 {
    // SAFETY: NULL or `size` writable bytes (the caller's contract).
    unsafe { abi::init(cfg, size) }
}

// SAFETY: repr(C) with no padding (`_reserved` fills the hole after
// `kswapd`, `abi`'s tests check), `size` first, `kswapd` the one bool;
// every other field is an integer or a nullable pointer.
unsafe impl abi::Versioned for uffd_pager_config {
    const NAME: &'static str = "uffd_pager_config";
    const FIRST_SIZE: usize = 56;
    const BOOLS: &'static [usize] = &[std::mem::offset_of!(Self, kswapd)];
    const RESERVED: &'static [(usize, usize)] = &[(std::mem::offset_of!(Self, _reserved), 7)];
    fn defaults() -> Self {
        uffd_pager_config {
            size: std::mem::size_of::<Self>(),
            budget_bytes: 0,
            policy: UFFD_PAGER_POLICY_RETRY_ONCE,
            delivery: UFFD_PAGER_DELIVERY_IN_THREAD,
            handler_threads: 0,
            readahead_pages: 32,
            readahead_threads: 2,
            fault_around_pages: 64,
            kswapd: true,
            _reserved: [0; 7],
            swap_dir: std::ptr::null(),
        }
    }
}

/// A pager (opaque to C).
pub struct uffd_pager {
    pub(crate) pager: Pager,
}

/// The engine policy a `UFFD_PAGER_POLICY_*` names.
fn policy(v: u32) -> Option<Policy> {
    let kind = match v {
        UFFD_PAGER_POLICY_GLOBAL_ONLY => PolicyKind::GlobalOnly,
        UFFD_PAGER_POLICY_VANILLA => PolicyKind::Vanilla,
        UFFD_PAGER_POLICY_RETRY_ONCE => PolicyKind::RetryOnce,
        UFFD_PAGER_POLICY_RETRY_ONCE_TRIED => PolicyKind::RetryOnceTried,
        _ => return None,
    };
    Some(Policy::new(kind))
}

/// The engine builder a config describes, or `-EINVAL`.
pub(crate) fn builder(c: &uffd_pager_config) -> Result<engine::PagerBuilder, i32> {
    let Some(policy) = policy(c.policy) else {
        return Err(fail(
            libc::EINVAL,
            format_args!("unknown policy {}", c.policy),
        ));
    };
    let delivery = match c.delivery {
        UFFD_PAGER_DELIVERY_IN_THREAD => Delivery::InThread,
        UFFD_PAGER_DELIVERY_THREADS => Delivery::Threads {
            threads: match c.handler_threads {
                0 => Delivery::per_cpu_threads(),
                n => n as usize,
            },
            spin_us: 0,
        },
        UFFD_PAGER_DELIVERY_PER_REGION => Delivery::PerRegion,
        d => return Err(fail(libc::EINVAL, format_args!("unknown delivery {d}"))),
    };
    let page = engine::PAGE_SIZE as u64;
    let mut b = Pager::builder()
        .policy(policy)
        .delivery(delivery)
        .budget_pages(c.budget_bytes.div_ceil(page))
        .kswapd(c.kswapd)
        .readahead(c.readahead_pages, c.readahead_threads.max(1) as usize)
        .fault_around(c.fault_around_pages as usize);
    if !c.swap_dir.is_null() {
        // SAFETY: a non-NULL swap_dir is a NUL-terminated string (the
        // header's contract).
        let dir = unsafe { CStr::from_ptr(c.swap_dir) };
        b = b.swap_dir(
            <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(dir.to_bytes()),
        );
    }
    Ok(b)
}

/// Makes a pager from `cfg` (NULL: the defaults) into `*out`.
///
/// Returns 0, or -EINVAL for a bad setting (a `cfg->size` not set by
/// [`uffd_pager_config_init`] among them), -E2BIG for fields of a newer
/// header this library does not know, set, -EPERM/-EOPNOTSUPP when the
/// process cannot get a userfaultfd, and the like.
///
/// # Safety
/// `cfg` is NULL or points at a config; `out` points at writable memory for
/// one pointer.
#[no_mangle]
pub unsafe extern "C" fn uffd_pager_new(
    cfg: *const uffd_pager_config,
    out: *mut *mut uffd_pager,
) -> i32 {
    guard(|| {
        non_null!(out);
        let c = if cfg.is_null() {
            <uffd_pager_config as abi::Versioned>::defaults()
        } else {
            // SAFETY: a config of the size it says (the caller's contract).
            match unsafe { abi::read(cfg) } {
                Ok(c) => c,
                Err(rc) => return rc,
            }
        };
        let b = match builder(&c) {
            Ok(b) => b,
            Err(rc) => return rc,
        };
        match b.build() {
            Ok(pager) => {
                // SAFETY: the caller's contract.
                unsafe { out.write(Box::into_raw(Box::new(uffd_pager { pager }))) };
                0
            }
            Err(e) => fail_with(&e),
        }
    })
}

/// Frees a pager handle (NULL: nothing). Regions mapped from it stay
/// usable until they are unmapped; the engine stops when the last is.
///
/// # Safety
/// `p` came from [`uffd_pager_new`] and is not used again.
#[no_mangle]
pub unsafe extern "C" fn uffd_pager_free(p: *mut uffd_pager) {
    if !p.is_null() {
        // SAFETY: the caller's contract: ours, from Box::into_raw.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            drop(unsafe { Box::from_raw(p) })
        }));
    }
}

/// Reclaims up to `pages` pages now; returns how many were freed.
///
/// # Safety
/// `p` is a live pager handle.
#[no_mangle]
pub unsafe extern "C" fn uffd_pager_reclaim(p: *const uffd_pager, pages: u64) -> i64 {
    if p.is_null() {
        return i64::from(fail(libc::EINVAL, "p is NULL"));
    }
    // SAFETY: the caller's contract.
    let p = unsafe { &*p };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        p.pager.reclaim_pages(pages)
    })) {
        Ok(n) => n as i64,
        Err(_) => i64::from(fail(libc::EFAULT, "internal error in reclaim")),
    }
}

/// Writes back, again, the dirty pages of regions unmapped while their
/// store refused them (the pager keeps them until written; dropping it
/// logs any it still cannot write). Returns 0, or `-errno` of the first
/// store error (those pages stay kept).
///
/// # Safety
/// `p` is a live pager handle.
#[no_mangle]
pub unsafe extern "C" fn uffd_pager_flush_unmapped(p: *const uffd_pager) -> i32 {
    crate::guard(|| {
        if p.is_null() {
            return fail(libc::EINVAL, "p is NULL");
        }
        // SAFETY: the caller's contract.
        match unsafe { &*p }.pager.flush_unmapped() {
            Ok(()) => 0,
            Err(e) => crate::fail_with(&e),
        }
    })
}
