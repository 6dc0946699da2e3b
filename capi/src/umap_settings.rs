//! UMap's settings: its environment variables, read once, and what the
//! `umapcfg_set_*` calls change before the first `umap` (see
//! [`crate::umap`]); the pager they describe.

use engine::{Delivery, Pager, Policy};
use std::ffi::c_int;

/// UMap's settings, as its environment variables and setters give them.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) page_size: u64,
    /// 0: 80% of the memory available when the pager is made.
    pub(crate) buf_pages: u64,
    pub(crate) fillers: u64,
    pub(crate) evictors: u64,
    pub(crate) read_ahead: u64,
    pub(crate) low_water: c_int,
    pub(crate) high_water: c_int,
    pub(crate) max_fault_events: u64,
    /// The bad environment values but `UMAP_PAGESIZE`'s, each with its
    /// variable: every `umap` reports the first one left, until the program
    /// sets that setting itself (its setter drops the variable's entry).
    pub(crate) bad: Vec<(&'static str, String)>,
    /// A bad `UMAP_PAGESIZE`, reported by the first `umap` unless
    /// [`umapcfg_set_umap_page_size`] set a good one before it.
    pub(crate) bad_page_size: Option<String>,
}

fn cpus() -> u64 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u64)
}

/// The number in environment variable `name`, or `default` where it is
/// unset or empty (as a script's `export UMAP_READ_AHEAD=` leaves it); a
/// value that is not a number is recorded in `bad`, with its variable.
fn env_num(name: &'static str, default: u64, bad: &mut Vec<(&'static str, String)>) -> u64 {
    match std::env::var(name) {
        Ok(v) if v.trim().is_empty() => default,
        Ok(v) => v.trim().parse().unwrap_or_else(|_| {
            bad.push((name, format!("{name}={v:?} is not a number")));
            default
        }),
        Err(_) => default,
    }
}

impl Settings {
    pub(crate) fn from_env() -> Settings {
        let mut bad = Vec::new();
        let b = &mut bad;
        let mut s = Settings {
            page_size: engine::PAGE_SIZE as u64,
            buf_pages: env_num("UMAP_BUFSIZE", 0, b),
            fillers: env_num("UMAP_PAGE_FILLERS", cpus(), b),
            evictors: env_num("UMAP_PAGE_EVICTORS", cpus(), b),
            read_ahead: env_num("UMAP_READ_AHEAD", 0, b),
            max_fault_events: env_num("UMAP_MAX_FAULT_EVENTS", 256, b),
            low_water: env_num("UMAP_EVICT_LOW_WATER_THRESHOLD", 70, b).min(100) as c_int,
            high_water: env_num("UMAP_EVICT_HIGH_WATER_THRESHOLD", 90, b).min(100) as c_int,
            bad: Vec::new(),
            bad_page_size: None,
        };
        let mut bad_page_size = Vec::new();
        let page_size = env_num(
            "UMAP_PAGESIZE",
            engine::PAGE_SIZE as u64,
            &mut bad_page_size,
        );
        let mut bad_page_size = bad_page_size.pop().map(|(_, m)| m);
        if page_size == 0 || !page_size.is_multiple_of(engine::PAGE_SIZE as u64) {
            bad_page_size.get_or_insert_with(|| {
                format!("UMAP_PAGESIZE={page_size} must be a non-zero multiple of 4096")
            });
        } else if bad_page_size.is_none() {
            s.page_size = page_size;
        }
        s.bad = bad;
        s.bad_page_size = bad_page_size;
        s
    }

    /// The buffer in UMap pages: `buf_pages`, or where that is 0, UMap's
    /// default of 80% of the memory available now.
    pub(crate) fn buffer_pages(&self) -> u64 {
        match self.buf_pages {
            0 => (available_bytes() / 10 * 8 / self.page_size.max(1)).max(1),
            n => n,
        }
    }

    /// The pager these settings describe.
    pub(crate) fn builder(&self) -> Result<engine::PagerBuilder, String> {
        let pages_per = (self.page_size / engine::PAGE_SIZE as u64).max(1);
        // (A buffer past the engine's largest budget, such as UINT64_MAX
        // for "no limit", is that budget.)
        let budget = self
            .buffer_pages()
            .saturating_mul(pages_per)
            .min(engine::limits::MAX_BUDGET_PAGES);
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let policy: Policy = match env("UFFD_PAGER_POLICY") {
            Some(v) => v.parse().map_err(|e| format!("UFFD_PAGER_POLICY: {e}"))?,
            None => Policy::default(),
        };
        let delivery: Delivery = match env("UFFD_PAGER_DELIVERY") {
            Some(v) => v.parse().map_err(|e| format!("UFFD_PAGER_DELIVERY: {e}"))?,
            None => Delivery::InThread,
        };
        let mut b = Pager::builder()
            .policy(policy)
            .delivery(delivery)
            // (At least the engine's least budget: a buffer of a page or
            // three made every umap fail with EINVAL.)
            .budget_pages(budget.max(engine::limits::MIN_BUDGET_PAGES))
            .kswapd(self.evictors > 0)
            // UMap reads ahead only when told to (the engine's readahead
            // window comes from UMAP_READ_AHEAD below). It fills one UMap
            // page per fault; here the UMap page is the fault-around base
            // cluster (off for 4 KiB UMap pages), which maps only what is
            // cached already (see the module docs).
            .fault_around(pages_per as usize);
        let window = self
            .read_ahead
            .saturating_mul(pages_per)
            .min(u32::MAX as u64);
        b = b.readahead(window as u32, self.fillers.clamp(1, 64) as usize);
        Ok(b)
    }
}

/// `MemAvailable`-like: free plus buffer memory, from sysinfo(2).
fn available_bytes() -> u64 {
    // SAFETY: a zeroed sysinfo is a valid out-parameter.
    let mut si: libc::sysinfo = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::sysinfo(&mut si) } != 0 {
        return 1 << 30;
    }
    (si.freeram as u64 + si.bufferram as u64).saturating_mul(si.mem_unit as u64)
}
