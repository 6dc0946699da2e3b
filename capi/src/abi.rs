//! Structs that can grow without breaking programs built against an older
//! or a newer header.
//!
//! Each struct the C API exchanges carries its size as the caller knows it:
//! `size`, its first field, in the structs a program fills
//! (`uffd_pager_config`, `uffd_pager_map_options`, `uffd_pager_store`, set
//! by their `_init` calls from `sizeof`), and a `size` argument for the
//! one the library fills ([`crate::uffd_pager_stats_get`]). The library
//! then reads and writes only the bytes both sides know:
//!
//! - a struct from an older program (smaller) keeps the library's
//!   defaults for the fields it lacks;
//! - one from a newer program (larger) is taken if every byte this library
//!   does not know is zero (what the newer `_init` leaves in a field the
//!   program did not set, at least where its default is zero), and refused
//!   with `-E2BIG` otherwise: a setting this library would silently ignore;
//! - a size smaller than the first version of the struct, or larger than
//!   [`MAX_SIZE`], is `-EINVAL` (the field was left unset);
//! - a `bool` field that holds neither 0 nor 1, or a reserved byte that is
//!   not zero, is `-EINVAL` (never read as a Rust `bool`, for which any
//!   other value is undefined behaviour).
//!
//! The structs have no padding: where alignment would leave a hole, a
//! reserved field fills it, so every byte an older program hands over was
//! written by its `_init` or by the program. Fields are only ever appended
//! (or take the place of reserved bytes), so the bytes an older program
//! knows mean the same to every later library. `tests` pins the first
//! version's layout.
//!
//! Cost: one copy of a few dozen bytes per call that takes a struct.

use crate::fail;

/// The largest `size` taken: a struct of the C API stays well under a
/// page, and a larger one is a size left unset, not a struct.
pub(crate) const MAX_SIZE: usize = 4096;

/// A struct of the C API whose first field is its size (`size_t size`).
///
/// # Safety
/// The implementor is `repr(C)` with no padding, its first field is a
/// `usize` holding its size, its `bool` fields are at [`Self::BOOLS`], and
/// every other field is an integer, an array of them, or a nullable
/// (function) pointer: valid for any bits.
pub(crate) unsafe trait Versioned: Copy {
    /// The name C knows it by, for messages.
    const NAME: &'static str;
    /// Its size in the first version of the C API: no caller has less.
    const FIRST_SIZE: usize;
    /// Offsets of its `bool` fields.
    const BOOLS: &'static [usize];
    /// Offset and length of its reserved bytes (zero).
    const RESERVED: &'static [(usize, usize)];
    /// The defaults its `_init` call writes.
    fn defaults() -> Self;
}

/// `-EINVAL` unless `size` lies between `first` and [`MAX_SIZE`].
fn check_size(name: &str, size: usize, first: usize) -> Result<(), i32> {
    if size < first || size > MAX_SIZE {
        return Err(fail(
            libc::EINVAL,
            format_args!(
                "size {size} of {name} is not that of any version of the struct ({first} to \
                 {MAX_SIZE} bytes): start from its _init call with sizeof"
            ),
        ));
    }
    Ok(())
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
    check_size(T::NAME, size, T::FIRST_SIZE)?;
    // SAFETY: the caller's struct has `size` (<= MAX_SIZE) readable bytes.
    let bytes = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), size) };
    let ours = std::mem::size_of::<T>();
    let n = size.min(ours);
    if bytes[n..].iter().any(|&b| b != 0) {
        return Err(fail(
            libc::E2BIG,
            format_args!(
                "{} of {size} bytes sets fields past the {ours} this library knows (built \
                 against a newer header?)",
                T::NAME
            ),
        ));
    }
    if let Some(&at) = T::BOOLS.iter().find(|&&at| at < n && bytes[at] > 1) {
        return Err(fail(
            libc::EINVAL,
            format_args!("{}: the bool at byte {at} is {}", T::NAME, bytes[at]),
        ));
    }
    let reserved =
        |&(at, len): &(usize, usize)| bytes[at.min(n)..(at + len).min(n)].iter().any(|&b| b != 0);
    if T::RESERVED.iter().any(reserved) {
        return Err(fail(
            libc::EINVAL,
            format_args!(
                "{}: a reserved byte is not zero (start from its _init call)",
                T::NAME
            ),
        ));
    }
    let mut v = T::defaults();
    // SAFETY: `bytes` holds `n` bytes and `v` at least as many; every
    // field they cover is valid for these bits (checked above, and the
    // trait's contract), and `v` is a local, not overlapping.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), (&mut v as *mut T).cast::<u8>(), n) };
    Ok(v)
}

/// Writes the defaults into the caller's struct of `size` bytes and sets
/// its size field: the `_init` calls. Bytes past this library's struct
/// are zeroed. Returns 0, or `-EINVAL` (nothing written) for a NULL `p` or
/// a size that is no version's.
///
/// # Safety
/// `p` is NULL or points at `size` writable bytes.
pub(crate) unsafe fn init<T: Versioned>(p: *mut T, size: usize) -> i32 {
    if p.is_null() {
        return fail(libc::EINVAL, format_args!("the {} is NULL", T::NAME));
    }
    if let Err(rc) = check_size(T::NAME, size, T::FIRST_SIZE) {
        return rc;
    }
    let d = T::defaults();
    // SAFETY: `p` has `size` writable bytes (the caller's contract); `d`
    // has no padding (the trait's contract): every byte copied is
    // initialised.
    unsafe { fill(p.cast::<u8>(), size, &d) };
    // SAFETY: as above; the first field is a `usize` (the trait's contract).
    unsafe { p.cast::<usize>().write_unaligned(size) };
    0
}

/// For a struct the library fills: `-EINVAL` for a `size` over
/// [`MAX_SIZE`] (any smaller one is taken: an older program's struct).
pub(crate) fn check_out_size(name: &str, size: usize) -> Result<(), i32> {
    check_size(name, size, 0)
}

/// Copies the first `size` bytes of `v` to `out`, zeroing those past
/// `v`'s own size; returns how many bytes of `v` went in.
///
/// # Safety
/// `out` points at `size` writable bytes, not overlapping `v`; `v` has no
/// padding (a struct of `u64`s, or [`Versioned`]).
pub(crate) unsafe fn fill<T: Copy>(out: *mut u8, size: usize, v: &T) -> usize {
    let n = size.min(std::mem::size_of::<T>());
    // SAFETY: `out` has `size` >= `n` writable bytes, `v` has `n`
    // initialised ones; they do not overlap (the caller's contract).
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

    /// `(offset, size)` of each field, in order.
    macro_rules! layout {
        ($t:ty: $($f:ident),* $(,)?) => {{
            let v = <$t as super::Versioned>::defaults();
            [$((offset_of!($t, $f), std::mem::size_of_val(&v.$f))),*]
        }};
    }

    /// The fields tile the struct: no padding, where an older program's
    /// garbage could later be read as a field.
    fn tiles<T>(fields: &[(usize, usize)]) {
        let mut at = 0;
        for &(off, len) in fields {
            assert_eq!(
                off,
                at,
                "a hole before byte {off} of {}",
                std::any::type_name::<T>()
            );
            at += len;
        }
        assert_eq!(at, size_of::<T>());
    }

    /// The first version's layout (x86-64 and other LP64 targets): a field
    /// moved, resized or inserted before another breaks every program
    /// built against the first header, so these lists only ever grow, and
    /// every field a later version adds goes into them.
    #[test]
    fn the_first_versions_layout_is_kept() {
        use super::Versioned;
        type C = uffd_pager_config;
        let config = layout!(C: size, budget_bytes, policy, delivery, handler_threads,
            readahead_pages, readahead_threads, fault_around_pages, kswapd, _reserved, swap_dir);
        assert_eq!(config[8], (40, 1), "kswapd");
        assert_eq!(config[10], (48, 8), "swap_dir");
        tiles::<C>(&config);
        type O = uffd_pager_map_options;
        let options = layout!(O: size, kind, writable, populate, pinned, _reserved, fixed_addr,
            page_size);
        assert_eq!(options[4], (14, 1), "pinned");
        assert_eq!(options[7], (24, 8), "page_size");
        tiles::<O>(&options);
        type S = uffd_pager_store;
        let store = layout!(S: size, ctx, len, read, write, release, signal_safe, _reserved);
        assert_eq!(store[6], (48, 1), "signal_safe");
        tiles::<S>(&store);
        assert_eq!((C::FIRST_SIZE, O::FIRST_SIZE, S::FIRST_SIZE), (56, 32, 56));
        assert_eq!(C::BOOLS, [config[8].0]);
        assert_eq!(O::BOOLS, [options[2].0, options[3].0, options[4].0]);
        assert_eq!(S::BOOLS, [store[6].0]);
        assert_eq!(C::RESERVED, [config[9]]);
        assert_eq!(O::RESERVED, [options[5]]);
        assert_eq!(S::RESERVED, [store[7]]);
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

    /// A size no struct has (garbage left in the field) is refused before
    /// anything past the first word is read: it was read as that many
    /// bytes before (a fault, or undefined behaviour past `isize::MAX`).
    #[test]
    fn a_size_over_a_page_is_einval() {
        let ours = size_of::<uffd_pager_config>();
        let (mut buf, rc) = config_in(ours / 8, ours);
        assert_eq!(rc, 0);
        for size in [super::MAX_SIZE + 1, 1 << 32, usize::MAX] {
            buf[0] = size as u64;
            assert_eq!(read_config(&buf).unwrap_err(), -libc::EINVAL, "{size}");
            // SAFETY: refused before anything is written.
            let rc = unsafe { crate::uffd_pager_config_init(buf.as_mut_ptr().cast(), size) };
            assert_eq!(rc, -libc::EINVAL);
        }
    }

    /// A `bool` byte that is neither 0 nor 1, or a reserved byte set, is
    /// refused rather than read into a Rust `bool` (undefined behaviour).
    #[test]
    fn a_bool_that_is_not_0_or_1_and_a_reserved_byte_set_are_einval() {
        let ours = size_of::<uffd_pager_config>();
        let (buf, _) = config_in(ours / 8, ours);
        let at = offset_of!(uffd_pager_config, kswapd);
        for (byte, want) in [(at, 0), (at + 1, 0)] {
            for (v, ok) in [(0u8, true), (1, true), (2, false)] {
                let mut b = buf.clone();
                // SAFETY: `byte` lies inside `b`.
                unsafe { *b.as_mut_ptr().cast::<u8>().add(byte) = v };
                let r = read_config(&b);
                let ok = ok && (byte == at || v == want);
                assert_eq!(r.is_ok(), ok, "byte {byte} = {v}");
            }
        }
    }
}
