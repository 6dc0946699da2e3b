//! UMap's `umapcfg_get_*` and `umapcfg_set_*` calls: the settings of
//! [`crate::umap_settings`], read and changed under the UMap state's lock
//! (a setter takes effect at the first `umap` if called before it).

use crate::umap_state::{say, state};
use std::ffi::{c_int, c_long};

macro_rules! getters_setters {
    ($($get:ident / $set:ident : $t:ty => $field:ident, $var:literal;)*) => {$(
        /// UMap's setting of the same name (see the module documentation).
        #[no_mangle]
        pub extern "C" fn $get() -> $t {
            std::panic::catch_unwind(|| state().map_or(0, |s| s.settings.$field as $t))
                .unwrap_or_default()
        }
        /// Sets UMap's setting of the same name; takes effect at the first
        /// `umap` if called before it, where it also replaces a bad value
        /// of its environment variable.
        #[no_mangle]
        pub extern "C" fn $set(v: $t) {
            let _ = std::panic::catch_unwind(|| {
                if let Ok(mut s) = state() {
                    s.settings.$field = v as _;
                    s.settings.bad.retain(|(var, _)| *var != $var);
                }
            });
        }
    )*};
}

/// UMap's buffer size in UMap pages: `UMAP_BUFSIZE`, what
/// `umapcfg_set_max_pages_in_buffer` set, or UMap's default (80% of the
/// memory available: now, or when the first `umap` made the pager).
#[no_mangle]
pub extern "C" fn umapcfg_get_max_pages_in_buffer() -> u64 {
    std::panic::catch_unwind(|| state().map_or(0, |s| s.settings.buffer_pages())).unwrap_or(0)
}

/// Sets UMap's buffer size (UMap pages); takes effect at the first `umap`
/// if called before it (0: UMap's default).
#[no_mangle]
pub extern "C" fn umapcfg_set_max_pages_in_buffer(v: u64) {
    let _ = std::panic::catch_unwind(|| {
        if let Ok(mut s) = state() {
            s.settings.buf_pages = v;
            s.settings.bad.retain(|(var, _)| *var != "UMAP_BUFSIZE");
        }
    });
}

getters_setters! {
    umapcfg_get_num_fillers / umapcfg_set_num_fillers: u64 => fillers, "UMAP_PAGE_FILLERS";
    umapcfg_get_num_evictors / umapcfg_set_num_evictors: u64 => evictors, "UMAP_PAGE_EVICTORS";
    umapcfg_get_read_ahead / umapcfg_set_read_ahead: u64 => read_ahead, "UMAP_READ_AHEAD";
    umapcfg_get_max_fault_events / umapcfg_set_max_fault_events: u64 =>
        max_fault_events, "UMAP_MAX_FAULT_EVENTS";
    umapcfg_get_evict_low_water_threshold / umapcfg_set_evict_low_water_threshold: c_int =>
        low_water, "UMAP_EVICT_LOW_WATER_THRESHOLD";
    umapcfg_get_evict_high_water_threshold / umapcfg_set_evict_high_water_threshold: c_int =>
        high_water, "UMAP_EVICT_HIGH_WATER_THRESHOLD";
}

/// UMap's page size in bytes (`UMAP_PAGESIZE`).
#[no_mangle]
pub extern "C" fn umapcfg_get_umap_page_size() -> u64 {
    let fallback = engine::PAGE_SIZE as u64;
    std::panic::catch_unwind(|| state().map_or(fallback, |s| s.settings.page_size))
        .unwrap_or(fallback)
}

/// Sets UMap's page size; a value that is not a non-zero multiple of 4096
/// is refused with a message on stderr (the setting is unchanged).
#[no_mangle]
pub extern "C" fn umapcfg_set_umap_page_size(page_size: u64) {
    if page_size == 0 || !page_size.is_multiple_of(engine::PAGE_SIZE as u64) {
        say(format_args!(
            "page size {page_size} must be a non-zero multiple of 4096; unchanged"
        ));
        return;
    }
    let _ = std::panic::catch_unwind(|| {
        if let Ok(mut st) = state() {
            st.settings.page_size = page_size;
            // The program's own value replaces a bad UMAP_PAGESIZE.
            st.settings.bad_page_size = None;
        }
    });
}

/// The system's page size.
#[no_mangle]
pub extern "C" fn umapcfg_get_system_page_size() -> c_long {
    engine::PAGE_SIZE as c_long
}
