//! Structs that can grow without breaking programs built against an older
//! or a newer header.
//!
//! Each struct the C API exchanges carries its size as the caller knows it:
//! `size`, its first field, in the structs a program fills
//! (`uffd_pager_config`, `uffd_pager_map_options`, set by their `_init`
//! calls from `sizeof`; `uffd_pager_store`, set by the program), and a
//! `size` argument for the one the library fills
//! ([`crate::uffd_pager_stats_get`]). The library then reads and writes
//! only the bytes both sides know:
//!
//! - a struct from an older program (smaller) keeps the library's
//!   defaults for the fields it lacks;
//! - one from a newer program (larger) is taken if every byte this library
//!   does not know is zero (what the newer `_init` leaves in a field the
//!   program did not set, at least where its default is zero), and refused
//!   with `-E2BIG` otherwise: a setting this library would silently ignore;
//! - a size smaller than the first version of the struct is `-EINVAL`
//!   (the field was left unset).
//!
//! Fields are only ever appended, each starting at or past the struct's
//! previous size (never in its old tail padding), so the bytes an older
//! program knows mean the same to every later library. `tests` pins the
//! first version's layout.

use crate::fail;

/// A struct of the C API whose first field is its size (`size_t size`).
///
/// # Safety
/// The implementor is `repr(C)`, its first field is a `usize` holding its
/// size, and every bit pattern of its fields past `size` that a C caller
/// may hand over is valid (integers, `bool`s the header says are 0 or 1,
/// nullable pointers).
pub(crate) unsafe trait Versioned: Copy {
    /// The name C knows it by, for messages.
    const NAME: &'static str;
    /// Its size in the first version of the C API: no caller has less.
    const FIRST_SIZE: usize;
    /// The defaults its `_init` call writes.
    fn defaults() -> Self;
}

/// Reads the caller's `*p` (its size in its first field) over the
/// defaults, per the module's rules; `Err(-errno)` with a message.
///
/// # Safety
/// `p` is non-NULL and points at a readable struct of at least the size
/// its first field says (the header's contract).
pub(crate) unsafe fn read<T: Versioned>(p: *const T) -> Result<T, i32> {
    // SAFETY: the first field is a `usize` (the trait's contract), readable
    // (the caller's contract).
    let size = unsafe { p.cast::<usize>().read_unaligned() };
    if size < T::FIRST_SIZE {
        return Err(fail(
            libc::EINVAL,
            format_args!(
                "{}.size is {size}, less than any version of the struct ({} bytes): start \
                 from its _init call, or set it to sizeof",
                T::NAME,
                T::FIRST_SIZE
            ),
        ));
    }
    let ours = std::mem::size_of::<T>();
    if size > ours {
        // SAFETY: the caller's struct has `size` readable bytes.
        let tail = unsafe { std::slice::from_raw_parts(p.cast::<u8>().add(ours), size - ours) };
        if tail.iter().any(|&b| b != 0) {
            return Err(fail(
                libc::E2BIG,
                format_args!(
                    "{} of {size} bytes sets fields past the {ours} this library knows \
                     (built against a newer header?)",
                    T::NAME
                ),
            ));
        }
    }
    let mut v = T::defaults();
    // SAFETY: both hold at least `size.min(ours)` bytes; the bytes copied
    // are fields valid for any value a caller may set (the trait's
    // contract), and `v` is a local, not overlapping.
    unsafe {
        std::ptr::copy_nonoverlapping(
            p.cast::<u8>(),
            (&mut v as *mut T).cast::<u8>(),
            size.min(ours),
        )
    };
    Ok(v)
}

/// Writes the defaults into the caller's struct of `size` bytes and sets
/// its size field: the `_init` calls. Bytes past this library's struct
/// are zeroed. Returns 0, or `-EINVAL` (nothing written) for a NULL `p` or
/// a size smaller than the first version's.
///
/// # Safety
/// `p` is NULL or points at `size` writable bytes.
pub(crate) unsafe fn init<T: Versioned>(p: *mut T, size: usize) -> i32 {
    if p.is_null() {
        return fail(libc::EINVAL, format_args!("the {} is NULL", T::NAME));
    }
    if size < T::FIRST_SIZE {
        return fail(
            libc::EINVAL,
            format_args!(
                "size {size} is less than any version of {} ({} bytes): pass sizeof",
                T::NAME,
                T::FIRST_SIZE
            ),
        );
    }
    let d = T::defaults();
    // SAFETY: `p` has `size` writable bytes (the caller's contract).
    unsafe { fill(p.cast::<u8>(), size, &d) };
    // SAFETY: as above; the first field is a `usize` (the trait's contract).
    unsafe { p.cast::<usize>().write_unaligned(size) };
    0
}

/// Copies the first `size` bytes of `v` to `out`, zeroing those past
/// `v`'s own size; returns how many bytes of `v` went in.
///
/// # Safety
/// `out` points at `size` writable bytes, not overlapping `v`.
pub(crate) unsafe fn fill<T: Copy>(out: *mut u8, size: usize, v: &T) -> usize {
    let n = size.min(std::mem::size_of::<T>());
    // SAFETY: `out` has `size` >= `n` writable bytes, `v` has `n`; they do
    // not overlap (the caller's contract).
    unsafe {
        std::ptr::copy_nonoverlapping((v as *const T).cast::<u8>(), out, n);
        std::ptr::write_bytes(out.add(n), 0, size - n);
    }
    n
}

#[cfg(test)]
mod tests {
    use crate::{uffd_pager_config, uffd_pager_map_options, uffd_pager_store};
    use std::mem::{offset_of, size_of};

    /// The first version's layout (x86-64 and other LP64 targets): a field
    /// moved, resized or inserted before another breaks every program
    /// built against the first header, so this list only ever grows.
    #[test]
    fn the_first_versions_layout_is_kept() {
        type C = uffd_pager_config;
        let config = [
            (offset_of!(C, size), 0),
            (offset_of!(C, budget_bytes), 8),
            (offset_of!(C, policy), 16),
            (offset_of!(C, delivery), 20),
            (offset_of!(C, handler_threads), 24),
            (offset_of!(C, readahead_pages), 28),
            (offset_of!(C, readahead_threads), 32),
            (offset_of!(C, fault_around_pages), 36),
            (offset_of!(C, kswapd), 40),
            (offset_of!(C, swap_dir), 48),
        ];
        type O = uffd_pager_map_options;
        let options = [
            (offset_of!(O, size), 0),
            (offset_of!(O, kind), 8),
            (offset_of!(O, writable), 12),
            (offset_of!(O, populate), 13),
            (offset_of!(O, pinned), 14),
            (offset_of!(O, fixed_addr), 16),
            (offset_of!(O, page_size), 24),
        ];
        type S = uffd_pager_store;
        let store = [
            (offset_of!(S, size), 0),
            (offset_of!(S, ctx), 8),
            (offset_of!(S, len), 16),
            (offset_of!(S, read), 24),
            (offset_of!(S, write), 32),
            (offset_of!(S, release), 40),
            (offset_of!(S, signal_safe), 48),
        ];
        for (have, want) in config.iter().chain(&options).chain(&store) {
            assert_eq!(have, want);
        }
        use super::Versioned;
        assert_eq!(C::FIRST_SIZE, 56);
        assert_eq!(O::FIRST_SIZE, 32);
        assert_eq!(S::FIRST_SIZE, 56);
        assert!(size_of::<C>() >= C::FIRST_SIZE);
        assert!(size_of::<O>() >= O::FIRST_SIZE);
        assert!(size_of::<S>() >= S::FIRST_SIZE);
    }

    /// A config in a buffer of `n` u64s, made by `_init` with `size`.
    fn config_in(n: usize, size: usize) -> (Vec<u64>, i32) {
        let mut buf = vec![u64::MAX; n];
        // SAFETY: `buf` has `8 * n` >= `size` writable bytes.
        let rc = unsafe { crate::uffd_pager_config_init(buf.as_mut_ptr().cast(), size) };
        (buf, rc)
    }

    fn read_config(buf: &[u64]) -> Result<uffd_pager_config, i32> {
        // SAFETY: `buf` holds the size its first word says (or more).
        unsafe { super::read(buf.as_ptr().cast::<uffd_pager_config>()) }
    }

    #[test]
    fn a_newer_headers_struct_is_taken_when_its_unknown_fields_are_zero() {
        let ours = size_of::<uffd_pager_config>();
        let (mut buf, rc) = config_in(ours / 8 + 3, ours + 16);
        assert_eq!(rc, 0);
        assert_eq!(buf[0], (ours + 16) as u64, "size");
        assert_eq!(buf[ours / 8..], [0, 0, u64::MAX], "zeroed up to size only");
        buf[1] = 4096; // budget_bytes
        let c = read_config(&buf).unwrap();
        assert_eq!(
            (c.budget_bytes, c.readahead_pages, c.kswapd),
            (4096, 32, true)
        );
        // A field this library does not know, set: refused, not ignored.
        buf[ours / 8 + 1] = 1;
        assert_eq!(read_config(&buf).unwrap_err(), -libc::E2BIG);
        assert!(crate::error_text().contains("newer header"));
    }

    #[test]
    fn a_size_below_the_first_version_is_einval_and_writes_nothing() {
        let (buf, rc) = config_in(8, 48);
        assert_eq!(rc, -libc::EINVAL);
        assert!(buf.iter().all(|&w| w == u64::MAX), "init wrote");
        // A struct not made by `_init` (`= {0}`): size 0.
        let zeroed = vec![0u64; 8];
        assert_eq!(read_config(&zeroed).unwrap_err(), -libc::EINVAL);
        assert!(crate::error_text().contains("_init"));
        // NULL.
        // SAFETY: NULL is refused before any access.
        let rc = unsafe { crate::uffd_pager_config_init(std::ptr::null_mut(), 56) };
        assert_eq!(rc, -libc::EINVAL);
    }
}
