//! The kernel's pool of 2 MiB pages for tests: reserves what a test needs
//! (as root) and gives it back afterwards.

#![allow(dead_code)]

use std::sync::{Mutex, MutexGuard};

const NR: &str = "/proc/sys/vm/nr_hugepages";
const FREE: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages";
const RESV: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/resv_hugepages";

/// Tests of one binary that change the pool run one at a time.
static POOL: Mutex<()> = Mutex::new(());

fn read(path: &str) -> u64 {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading {path}: {e}"))
        .trim()
        .parse()
        .unwrap()
}

fn write_nr(n: u64) {
    std::fs::write(NR, n.to_string()).unwrap_or_else(|e| panic!("writing {NR}: {e}"));
}

/// Free, unpromised 2 MiB pages now.
pub fn available() -> u64 {
    read(FREE).saturating_sub(read(RESV))
}

/// At least `n` free 2 MiB pages while it lives; the pool's size is put
/// back when it is dropped.
pub struct HugePool {
    before: u64,
    _serial: MutexGuard<'static, ()>,
}

impl HugePool {
    /// Reserves up to `n` free pages (raising `nr_hugepages` as root);
    /// panics, naming what to set, if it cannot.
    pub fn take(n: u64) -> HugePool {
        let serial = POOL.lock().unwrap_or_else(|e| e.into_inner());
        let before = read(NR);
        // Made first: a panic below (the kernel granting fewer pages than
        // asked) puts the pool's size back as the guard goes.
        let pool = HugePool {
            before,
            _serial: serial,
        };
        let have = available();
        if have < n {
            // SAFETY: geteuid has no preconditions.
            assert!(
                unsafe { libc::geteuid() } == 0,
                "this test needs {n} free 2 MiB pages ({have} free): run it as root \
                 or reserve them with `sysctl vm.nr_hugepages=N`"
            );
            write_nr(before + (n - have));
            assert!(
                available() >= n,
                "the kernel reserved only {} of {n} 2 MiB pages (memory too fragmented?)",
                available()
            );
        }
        pool
    }

    /// Gives free pages back to the kernel until at most `n` are free
    /// (root only; a no-op otherwise), until the pool drops: for tests that
    /// need the pool short on a machine that reserved more.
    pub fn shrink_to(&self, n: u64) {
        let extra = available().saturating_sub(n);
        // SAFETY: geteuid has no preconditions.
        if extra > 0 && unsafe { libc::geteuid() } == 0 {
            write_nr(read(NR) - extra);
        }
    }

    /// Empties the pool of free pages for a while (root only): what a
    /// machine with none reserved looks like.
    pub fn drain(&self) -> Drained<'_> {
        let now = read(NR);
        let in_use = now - read(FREE);
        write_nr(in_use);
        Drained { _pool: self, now }
    }
}

impl Drop for HugePool {
    fn drop(&mut self) {
        if read(NR) != self.before {
            write_nr(self.before);
        }
    }
}

/// The pool with no free page, until dropped.
pub struct Drained<'a> {
    _pool: &'a HugePool,
    now: u64,
}

impl Drop for Drained<'_> {
    fn drop(&mut self) {
        write_nr(self.now);
    }
}
