//! The userfaultfd ABI as `include/uapi/linux/userfaultfd.h` lays it
//! out: feature bits, ioctl numbers and modes, the ioctls' argument
//! structs and the message read from the descriptor.

#[allow(missing_docs)]
/// Feature bits of `struct uffdio_api` (include/uapi/linux/userfaultfd.h).
pub mod feature {
    pub const PAGEFAULT_FLAG_WP: u64 = 1 << 0;
    pub const EVENT_FORK: u64 = 1 << 1;
    pub const EVENT_REMAP: u64 = 1 << 2;
    pub const EVENT_REMOVE: u64 = 1 << 3;
    pub const MISSING_HUGETLBFS: u64 = 1 << 4;
    pub const MISSING_SHMEM: u64 = 1 << 5;
    pub const EVENT_UNMAP: u64 = 1 << 6;
    pub const SIGBUS: u64 = 1 << 7;
    pub const THREAD_ID: u64 = 1 << 8;
    pub const MINOR_HUGETLBFS: u64 = 1 << 9;
    pub const MINOR_SHMEM: u64 = 1 << 10;
    pub const EXACT_ADDRESS: u64 = 1 << 11;
    pub const WP_HUGETLBFS_SHMEM: u64 = 1 << 12;
    pub const WP_UNPOPULATED: u64 = 1 << 13;
    pub const POISON: u64 = 1 << 14;
    pub const WP_ASYNC: u64 = 1 << 15;
    pub const MOVE: u64 = 1 << 16;

    /// Every feature bit with its kernel name, for the probe's report.
    pub const NAMES: &[(u64, &str)] = &[
        (PAGEFAULT_FLAG_WP, "PAGEFAULT_FLAG_WP"),
        (EVENT_FORK, "EVENT_FORK"),
        (EVENT_REMAP, "EVENT_REMAP"),
        (EVENT_REMOVE, "EVENT_REMOVE"),
        (MISSING_HUGETLBFS, "MISSING_HUGETLBFS"),
        (MISSING_SHMEM, "MISSING_SHMEM"),
        (EVENT_UNMAP, "EVENT_UNMAP"),
        (SIGBUS, "SIGBUS"),
        (THREAD_ID, "THREAD_ID"),
        (MINOR_HUGETLBFS, "MINOR_HUGETLBFS"),
        (MINOR_SHMEM, "MINOR_SHMEM"),
        (EXACT_ADDRESS, "EXACT_ADDRESS"),
        (WP_HUGETLBFS_SHMEM, "WP_HUGETLBFS_SHMEM"),
        (WP_UNPOPULATED, "WP_UNPOPULATED"),
        (POISON, "POISON"),
        (WP_ASYNC, "WP_ASYNC"),
        (MOVE, "MOVE"),
    ];
}

/// The kernel names of the feature bits in `bits`, `|`-separated.
pub fn feature_names(bits: u64) -> String {
    let names: Vec<&str> = feature::NAMES
        .iter()
        .filter(|(b, _)| bits & b != 0)
        .map(|(_, n)| *n)
        .collect();
    names.join("|")
}

#[allow(missing_docs)]
/// ioctl numbers (`_UFFDIO_*`), as bit positions in `uffdio_api.ioctls`.
pub mod nr {
    pub const REGISTER: u32 = 0x00;
    pub const UNREGISTER: u32 = 0x01;
    pub const WAKE: u32 = 0x02;
    pub const COPY: u32 = 0x03;
    pub const ZEROPAGE: u32 = 0x04;
    pub const MOVE: u32 = 0x05;
    pub const WRITEPROTECT: u32 = 0x06;
    pub const CONTINUE: u32 = 0x07;
    pub const POISON: u32 = 0x08;
    pub const API: u32 = 0x3F;
}

#[allow(missing_docs)]
/// `UFFDIO_REGISTER_MODE_*`.
pub mod mode {
    pub const MISSING: u64 = 1 << 0;
    pub const WP: u64 = 1 << 1;
    pub const MINOR: u64 = 1 << 2;
}

#[allow(missing_docs)]
/// `UFFD_PAGEFAULT_FLAG_*` in a fault message.
pub mod fault_flag {
    pub const WRITE: u64 = 1 << 0;
    pub const WP: u64 = 1 << 1;
}

/// `UFFD_EVENT_PAGEFAULT`.
pub const EVENT_PAGEFAULT: u8 = 0x12;
/// `UFFD_EVENT_REMAP`: `arg0` = from, `arg1` = to, `arg2` = length.
pub const EVENT_REMAP: u8 = 0x14;
/// `UFFD_EVENT_REMOVE` (`madvise(MADV_DONTNEED/REMOVE/FREE)`): `arg0` =
/// start, `arg1` = end.
pub const EVENT_REMOVE: u8 = 0x15;
/// `UFFD_EVENT_UNMAP` (`munmap`, or the tail an `mremap` dropped): `arg0`
/// = start, `arg1` = end.
pub const EVENT_UNMAP: u8 = 0x16;
pub(super) const UFFD_API: u64 = 0xAA;
pub(super) const UFFDIO: u32 = 0xAA;
pub(super) const UFFD_USER_MODE_ONLY: i32 = 1;

#[repr(C)]
#[derive(Default)]
pub(super) struct ApiArg {
    pub(super) api: u64,
    pub(super) features: u64,
    pub(super) ioctls: u64,
}
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub(super) struct Range {
    pub(super) start: u64,
    pub(super) len: u64,
}
#[repr(C)]
#[derive(Default)]
pub(super) struct RegisterArg {
    pub(super) range: Range,
    pub(super) mode: u64,
    pub(super) ioctls: u64,
}
#[repr(C)]
#[derive(Default)]
pub(super) struct CopyArg {
    pub(super) dst: u64,
    pub(super) src: u64,
    pub(super) len: u64,
    pub(super) mode: u64,
    pub(super) copy: i64,
}
#[repr(C)]
#[derive(Default)]
pub(super) struct ZeropageArg {
    pub(super) range: Range,
    pub(super) mode: u64,
    pub(super) zeropage: i64,
}
#[repr(C)]
#[derive(Default)]
pub(super) struct MoveArg {
    pub(super) dst: u64,
    pub(super) src: u64,
    pub(super) len: u64,
    pub(super) mode: u64,
    pub(super) moved: i64,
}
#[repr(C)]
#[derive(Default)]
pub(super) struct WriteprotectArg {
    pub(super) range: Range,
    pub(super) mode: u64,
}
#[repr(C)]
#[derive(Default)]
pub(super) struct ContinueArg {
    pub(super) range: Range,
    pub(super) mode: u64,
    pub(super) mapped: i64,
}
#[repr(C)]
#[derive(Default)]
pub(super) struct PoisonArg {
    pub(super) range: Range,
    pub(super) mode: u64,
    pub(super) updated: i64,
}

/// One `struct uffd_msg` (32 bytes), as read from the descriptor.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Msg {
    /// `UFFD_EVENT_*`.
    pub event: u8,
    _reserved1: u8,
    _reserved2: u16,
    _reserved3: u32,
    /// For a page fault: `flags`.
    pub arg0: u64,
    /// For a page fault: `address`.
    pub arg1: u64,
    /// For a page fault: the faulting thread id (with THREAD_ID).
    pub arg2: u64,
}

pub(super) const fn iowr(nr: u32, size: usize) -> libc::c_ulong {
    ((3u32 << 30) | ((size as u32) << 16) | (UFFDIO << 8) | nr) as libc::c_ulong
}
pub(super) const fn ior(nr: u32, size: usize) -> libc::c_ulong {
    ((2u32 << 30) | ((size as u32) << 16) | (UFFDIO << 8) | nr) as libc::c_ulong
}

/// Install modes shared by COPY, CONTINUE, MOVE and ZEROPAGE.
pub const MODE_DONTWAKE: u64 = 1 << 0;
/// `UFFDIO_COPY_MODE_WP` / `UFFDIO_CONTINUE_MODE_WP`: install write-protected.
pub const MODE_WP: u64 = 1 << 1;
