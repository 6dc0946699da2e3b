//! Eviction throughput: pages per second the engine's reclaim frees,
//! against the raw primitives it is built on, measured in the same run
//! (`limits.md`: `MADV_DONTNEED`, `UFFDIO_MOVE` to a staging area, a memfd
//! hole punch).
//!
//! Engine side: a region of `pages` pages is faulted in (installed), then
//! [`Pager::reclaim_pages`] frees them all; the time of that call alone
//! counts. Each page evicted is unmapped from the user mapping, written
//! back (anonymous pages to swap: they were written, so all are dirty;
//! shared pages only if dirty, and these were only read) and freed.
//!
//! With 2 MiB pages (`page_size` [`HUGE_PAGE_SIZE`], hugetlb on both
//! sides) the raw anonymous primitive is a copy of the page out and
//! `MADV_DONTNEED` (hugetlb has no `UFFDIO_MOVE`; the engine copies a huge
//! page out through `/proc/self/mem` under write protection), and the raw
//! shared one is the zap and the punch on a hugetlbfs memfd.

use crate::io_error as sys;
use crate::os::mem::{self, Memfd};
use crate::os::uffd::{feature, RegisterMode, Uffd};
use memmap2::{MmapMut, UncheckedAdvice};
use std::sync::Arc;
use std::time::Instant;
use uffd_pager::store::MemoryStore;
use uffd_pager::{
    Counter, Error, HugePagePool, InstallKind, MapOptions, Pager, Result, HUGE_PAGE_SIZE, PAGE_SIZE,
};

/// The result of [`evict_cost`].
#[derive(Debug, Clone, Copy)]
pub struct EvictReport {
    /// Install kind measured.
    pub kind: InstallKind,
    /// Pages per pass.
    pub pages: usize,
    /// Their size: [`PAGE_SIZE`] or [`HUGE_PAGE_SIZE`].
    pub page_size: usize,
    /// Engine reclaim, ns per page evicted.
    pub engine_ns: f64,
    /// The raw primitive the engine's eviction of this kind rests on, ns
    /// per page: `UFFDIO_MOVE` (anonymous; with 2 MiB pages a copy out +
    /// `MADV_DONTNEED`) or `MADV_DONTNEED` + hole punch (shared).
    pub raw_ns: f64,
    /// `MADV_DONTNEED` of one page, ns (for reference).
    pub dontneed_ns: f64,
    /// Pages the engine evicted.
    pub evicted: u64,
}

impl EvictReport {
    /// Engine pages per second.
    pub fn engine_pages_per_s(&self) -> f64 {
        1e9 / self.engine_ns.max(1e-9)
    }

    /// Engine cost over the raw primitive's.
    pub fn ratio(&self) -> f64 {
        self.engine_ns / self.raw_ns.max(1e-9)
    }
}

/// `MADV_DONTNEED` of page `p` (of `ps` bytes) of `m`.
fn dontneed_page(m: &MmapMut, p: usize, ps: usize) -> Result<()> {
    // SAFETY: the raw loops below touch their mappings only through raw
    // pointers and hold no reference into them.
    unsafe { m.unchecked_advise_range(UncheckedAdvice::DontNeed, p * ps, ps) }
        .map_err(sys("madvise"))
}

fn touch_all(base: usize, pages: usize, ps: usize) {
    for p in 0..pages {
        // SAFETY: `base` maps `pages` writable pages of `ps` bytes owned
        // by the caller.
        unsafe { std::ptr::write_volatile((base + p * ps) as *mut u8, 1) };
    }
}

fn per_page(t: Instant, pages: usize) -> f64 {
    t.elapsed().as_nanos() as f64 / pages.max(1) as f64
}

/// Raw `MADV_DONTNEED` of one page (of `ps` bytes) at a time.
fn raw_dontneed(pages: usize, ps: usize) -> Result<f64> {
    let m = mem::anonymous_sized(pages * ps, ps).map_err(sys("mmap"))?;
    touch_all(m.as_ptr() as usize, pages, ps);
    let t = Instant::now();
    for p in 0..pages {
        dontneed_page(&m, p, ps)?;
    }
    Ok(per_page(t, pages))
}

/// Raw huge anonymous eviction: each 2 MiB page copied out to an ordinary
/// sink, then dropped with `MADV_DONTNEED` (back to the pool).
fn raw_copy_out(pages: usize) -> Result<f64> {
    let ps = HUGE_PAGE_SIZE;
    let m = mem::anonymous_sized(pages * ps, ps).map_err(sys("mmap"))?;
    let sink = mem::anonymous(pages * ps).map_err(sys("mmap"))?;
    let (base, sink_at) = (m.as_ptr() as usize, sink.as_ptr() as usize);
    touch_all(base, pages, ps);
    touch_all(sink_at, pages * (ps / PAGE_SIZE), PAGE_SIZE);
    let t = Instant::now();
    for p in 0..pages {
        // SAFETY: both ranges are ours, present (touched above), and only
        // reached through raw pointers.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (base + p * ps) as *const u8,
                (sink_at + p * ps) as *mut u8,
                ps,
            )
        };
        dontneed_page(&m, p, ps)?;
    }
    Ok(per_page(t, pages))
}

/// Raw `UFFDIO_MOVE` of one page at a time to a staging page, which is
/// then copied out and dropped (what the engine does per page).
fn raw_move(pages: usize) -> Result<f64> {
    let uffd = Uffd::open(feature::MOVE, true, false).map_err(Error::Unsupported)?;
    let m = mem::anonymous(pages * PAGE_SIZE).map_err(sys("mmap"))?;
    let stage = mem::anonymous(PAGE_SIZE).map_err(sys("mmap"))?;
    let sink = mem::anonymous(pages * PAGE_SIZE).map_err(sys("mmap"))?;
    let (base, stage_at, sink_at) = (
        m.as_ptr() as usize,
        stage.as_ptr() as usize,
        sink.as_ptr() as usize,
    );
    uffd.register(stage_at, PAGE_SIZE, RegisterMode::MISSING)
        .map_err(|e| crate::sys_error("UFFDIO_REGISTER", e))?;
    touch_all(base, pages, PAGE_SIZE);
    touch_all(sink_at, pages, PAGE_SIZE);
    let t = Instant::now();
    for p in 0..pages {
        // SAFETY: both pages are ours and only reached through raw
        // pointers; the staging page is absent (dropped below), as MOVE
        // needs.
        unsafe { uffd.mv(stage_at, base + p * PAGE_SIZE, PAGE_SIZE) }
            .map_err(|e| crate::sys_error("UFFDIO_MOVE", e))?;
        // SAFETY: the staging page is present (just moved in); the sink page
        // is ours.
        unsafe {
            std::ptr::copy_nonoverlapping(
                stage_at as *const u8,
                (sink_at + p * PAGE_SIZE) as *mut u8,
                PAGE_SIZE,
            )
        };
        dontneed_page(&stage, 0, PAGE_SIZE)?;
    }
    Ok(per_page(t, pages))
}

/// Raw shared eviction of one page: zap the mapping, punch the memfd.
fn raw_zap_punch(pages: usize, ps: usize) -> Result<f64> {
    let fd = Memfd::sized(c"evict-floor", pages * ps, ps).map_err(sys("memfd_create"))?;
    let m = fd.map_shared(pages * ps).map_err(sys("mmap"))?;
    touch_all(m.as_ptr() as usize, pages, ps);
    let t = Instant::now();
    for p in 0..pages {
        dontneed_page(&m, p, ps)?;
        fd.punch_hole(p * ps, ps)
            .map_err(|e| crate::sys_error("fallocate", e as i32))?;
    }
    Ok(per_page(t, pages))
}

/// Engine eviction of `pages` installed pages of `kind` and of `ps` bytes.
fn engine(kind: InstallKind, pages: usize, ps: usize) -> Result<(f64, u64)> {
    // The budget counts 4 KiB units.
    let units = (ps / PAGE_SIZE) as u64;
    let pager = Pager::builder()
        .budget_pages(pages as u64 * units * 4)
        .kswapd(false)
        .keep_unmapped(0)
        .readahead(0, 1)
        .fault_around(0)
        .build()?;
    let store = Arc::new(MemoryStore::new((pages * ps) as u64)?);
    // SAFETY: the workload's stores and files are its own, and it changes them only through its
    // regions (the store contract).
    let mut r = unsafe {
        pager.map_store(
            store,
            pages * ps,
            &MapOptions {
                kind: Some(kind),
                writable: kind == InstallKind::Anonymous,
                page_size: ps,
                ..MapOptions::default()
            },
        )
    }?;
    // Install every page: reads for shared pages (they stay clean), writes
    // for anonymous ones, so that each goes to swap as the raw side's copy
    // out does (a 2 MiB page only read is clean and would be dropped).
    let install = |r: &mut uffd_pager::Region| {
        let s = r.as_mut_slice();
        for p in 0..pages {
            if kind == InstallKind::Anonymous {
                s[p * ps] = 1;
            } else {
                std::hint::black_box(s[p * ps]);
            }
        }
    };
    install(&mut r);
    if kind == InstallKind::Anonymous {
        // The pager's swap (a memory store) is mapped and its pages
        // touched by its first writes: once untimed, then the pages
        // swapped in again, as the raw side touches its sink before its
        // clock starts (found by review: the engine's side alone paid a
        // first-touch fault per page, a 2 MiB zero fill with 2 MiB pages).
        pager.reclaim_pages(pages as u64 * units);
        install(&mut r);
    }
    let before = pager.stats().get(Counter::PGSTEAL);
    let t = Instant::now();
    let freed_units = pager.reclaim_pages(pages as u64 * units);
    let elapsed = t.elapsed();
    let evicted = pager.stats().get(Counter::PGSTEAL) - before;
    all_evicted(evicted, freed_units / units.max(1), pages)?;
    Ok((elapsed.as_nanos() as f64 / evicted as f64, evicted))
}

/// A pass that evicted fewer pages than it installed timed less work than
/// the raw side's (nearly nothing, if it evicted none), and the best of
/// the passes would pick it: an error, not a figure.
fn all_evicted(evicted: u64, freed: u64, pages: usize) -> Result<()> {
    if evicted == pages as u64 && freed == evicted {
        return Ok(());
    }
    Err(Error::Io {
        context: format!(
            "bench evict: the engine's pass evicted {evicted} of {pages} pages ({freed} freed)"
        ),
        source: std::io::Error::other("a pass that evicts less measures less than the raw side"),
    })
}

/// Measures engine eviction of `pages` pages of `kind` and of `page_size`
/// ([`PAGE_SIZE`], or [`HUGE_PAGE_SIZE`] from the hugetlb pool, which
/// must hold `pages` pages) against the raw primitives, best of `passes`
/// each.
pub fn evict_cost(
    kind: InstallKind,
    pages: usize,
    passes: usize,
    page_size: usize,
) -> Result<EvictReport> {
    match page_size {
        PAGE_SIZE => {}
        HUGE_PAGE_SIZE => {
            HugePagePool::require(pages as u64)?;
        }
        other => return Err(Error::PageSize(other)),
    }
    let ps = page_size;
    let best = |f: &dyn Fn() -> Result<f64>| -> Result<f64> {
        let mut b = f64::INFINITY;
        for _ in 0..passes.max(1) {
            b = b.min(f()?);
        }
        Ok(b)
    };
    let mut evicted = 0;
    let mut engine_ns = f64::INFINITY;
    for _ in 0..passes.max(1) {
        let (ns, n) = engine(kind, pages, ps)?;
        if ns < engine_ns {
            engine_ns = ns;
            evicted = n;
        }
    }
    let raw_ns = match kind {
        InstallKind::Anonymous if ps == HUGE_PAGE_SIZE => best(&|| raw_copy_out(pages))?,
        InstallKind::Anonymous => best(&|| raw_move(pages))?,
        InstallKind::Shared => best(&|| raw_zap_punch(pages, ps))?,
    };
    Ok(EvictReport {
        kind,
        pages,
        page_size: ps,
        engine_ns,
        raw_ns,
        dontneed_ns: best(&|| raw_dontneed(pages, ps))?,
        evicted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_that_evicts_less_is_an_error() {
        assert!(all_evicted(128, 128, 128).is_ok());
        let e = all_evicted(0, 0, 128).unwrap_err().to_string();
        assert!(e.contains("evicted 0 of 128 pages"), "{e}");
        assert!(all_evicted(128, 127, 128).is_err());
    }

    #[test]
    fn evicts_every_page_and_measures() {
        for kind in [InstallKind::Anonymous, InstallKind::Shared] {
            let r = evict_cost(kind, 128, 1, PAGE_SIZE).unwrap();
            assert_eq!(r.evicted, 128, "{kind}");
            assert!(r.engine_ns.is_finite() && r.engine_ns > 0.0);
            assert!(r.raw_ns.is_finite() && r.raw_ns > 0.0);
        }
    }
}
