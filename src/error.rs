//! The engine's error type.

use crate::store::StoreError;

/// Everything the engine's API can fail with.
///
/// ```
/// use uffd_pager::{Error, Pager};
///
/// let pager = Pager::builder().build()?;
/// assert!(matches!(pager.map_anonymous(0), Err(Error::ZeroLength)));
/// assert!(matches!(pager.map_anonymous(100), Err(Error::Unaligned { .. })));
/// # Ok::<(), Error>(())
/// ```
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A length was zero.
    #[error("length must be non-zero")]
    ZeroLength,
    /// A length, address or offset was not page-aligned.
    #[error("{what} {value:#x} is not a multiple of the page size ({page_size})")]
    Unaligned {
        /// What was misaligned.
        what: &'static str,
        /// The value given.
        value: usize,
        /// The region's page size (4096, or 2 MiB).
        page_size: usize,
    },
    /// A page size other than 4 KiB or 2 MiB was asked for.
    #[error("page size {0} is not supported: 4096 (4 KiB) or 2097152 (2 MiB)")]
    PageSize(usize),
    /// A region of 2 MiB pages needs more huge pages than the kernel's pool
    /// has free.
    #[error(
        "this region needs {needed} free 2 MiB huge pages (its size or the budget, whichever \
         is smaller) but the kernel's pool has {available}: reserve them as root with \
         `sysctl vm.nr_hugepages=N` (or write N to /proc/sys/vm/nr_hugepages)"
    )]
    NoHugePages {
        /// Huge pages the region may hold at once.
        needed: u64,
        /// Free, unpromised pages in the pool now.
        available: u64,
    },
    /// A fixed address overlaps an existing mapping or region.
    #[error("range {addr:#x}+{len:#x} overlaps an existing mapping")]
    Overlap {
        /// Requested start.
        addr: usize,
        /// Requested length.
        len: usize,
    },
    /// The backing file or store is shorter than the region (named for
    /// the file, the first case it served).
    #[error("the file or store holds {file_len} bytes, fewer than the region's {needed}")]
    FileTooShort {
        /// File or store length in bytes.
        file_len: u64,
        /// Bytes the region needs.
        needed: u64,
    },
    /// The path to map is not a regular file (a directory, a device, a
    /// socket): its pages cannot be read with `pread`.
    #[error("{} is not a regular file", .0.display())]
    NotRegularFile(std::path::PathBuf),
    /// A read-only file or store was mapped writable.
    #[error("the backing store is read-only but the region was requested writable")]
    ReadOnlyStore,
    /// A range is outside the region.
    #[error("range {offset:#x}+{len:#x} is outside the region of {region_len:#x} bytes")]
    OutOfRange {
        /// Offset into the region.
        offset: usize,
        /// Length.
        len: usize,
        /// The region's length.
        region_len: usize,
    },
    /// A range that must stay resident is larger than the memory budget.
    #[error("{pages} pages cannot be kept resident under a budget of {budget} pages")]
    OverBudget {
        /// Pages asked for.
        pages: u64,
        /// The pager's budget.
        budget: u64,
    },
    /// The kernel lacks something this configuration needs.
    #[error("unsupported by this kernel or process: {0}")]
    Unsupported(String),
    /// The process may not have a userfaultfd (every way was refused with
    /// `EPERM` or `EACCES`: a seccomp filter such as a container's default,
    /// `vm.unprivileged_userfaultfd = 0` for a full descriptor, the mode of
    /// `/dev/userfaultfd`). `errno()` is `EPERM`.
    #[error("userfaultfd is not allowed to this process: {0}")]
    NotAllowed(String),
    /// A system call failed.
    #[error("{op} failed: {}", std::io::Error::from_raw_os_error(*.errno))]
    Sys {
        /// The operation.
        op: &'static str,
        /// errno.
        errno: i32,
    },
    /// An I/O error outside the fault path (opening files, flushing).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A store operation failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A region was to be mapped over a store that still owes the pager
    /// the dirty pages of an earlier region, unmapped when they could not
    /// be written back, and they still cannot be: the new region would
    /// read older bytes, and a later write-back would put them back over
    /// its own. Mapping it succeeds once the store takes them (see
    /// [`Pager::flush_unmapped`](crate::Pager::flush_unmapped)).
    #[error(
        "the store still has {bytes} bytes of dirty pages from an unmapped region that could \
         not be written back ({source}); the region would read older bytes: try again once the \
         store answers"
    )]
    UnwrittenPages {
        /// The dirty bytes waiting for the store.
        bytes: u64,
        /// Why they could not be written now.
        source: Box<Error>,
    },
    /// Called in a `fork()`ed child of the process that made the pager: its
    /// regions are not mapped there, and the engine cannot serve it.
    #[error("this process is a fork()ed child of the one that made the pager; the pager cannot be used here")]
    ForkedChild,
    /// The builder was given an inconsistent configuration.
    #[error("invalid configuration: {0}")]
    Config(String),
}

/// `Result<T, Error>`.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The errno that best names the error, for callers that speak errno
    /// (the C API returns it negated): `EINVAL` for bad arguments, `EEXIST`
    /// for an overlap, `EACCES` for a read-only store, `ENOMEM` over the
    /// budget or too few huge pages, `EOPNOTSUPP` for what the kernel lacks, `EPERM` where
    /// userfaultfd is not allowed, the system call's or
    /// store's own errno, `EIO` for an I/O error without one.
    ///
    /// ```
    /// assert_eq!(uffd_pager::Error::ZeroLength.errno(), libc::EINVAL);
    /// ```
    pub fn errno(&self) -> i32 {
        match self {
            Error::ZeroLength
            | Error::Unaligned { .. }
            | Error::OutOfRange { .. }
            | Error::NotRegularFile(_)
            | Error::PageSize(_)
            | Error::Config(_) => libc::EINVAL,
            Error::NoHugePages { .. } => libc::ENOMEM,
            Error::Overlap { .. } => libc::EEXIST,
            Error::FileTooShort { .. } => libc::ENXIO,
            Error::ReadOnlyStore => libc::EACCES,
            Error::OverBudget { .. } => libc::ENOMEM,
            Error::Unsupported(_) => libc::EOPNOTSUPP,
            Error::NotAllowed(_) => libc::EPERM,
            Error::Sys { errno, .. } => *errno,
            Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            Error::Store(e) => e.0,
            Error::UnwrittenPages { source, .. } => source.errno(),
            Error::ForkedChild => libc::EPERM,
        }
    }

    pub(crate) fn sys(op: &'static str, errno: i32) -> Error {
        Error::Sys { op, errno }
    }
}
