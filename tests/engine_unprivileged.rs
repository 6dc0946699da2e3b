//! The pager as an ordinary user: with `vm.unprivileged_userfaultfd = 0`
//! and a root-only `/dev/userfaultfd` (this machine's defaults, and most
//! distributions'), only `userfaultfd(2)` with `UFFD_USER_MODE_ONLY` is
//! allowed. Every delivery mode must still work, on a descriptor it reports
//! as user-mode-only. The checks run in a child process as user `nobody`
//! (when the tests run as root; otherwise as the current user).

#[path = "engine_util.rs"]
mod util;

use std::sync::Arc;
use uffd_pager::store::MemoryStore;
use uffd_pager::{Delivery, MapOptions, Pager};
use util::*;

const CHILD_OK: &str = "UNPRIVILEGED-CHILD-OK";

/// What the child runs, as the unprivileged user.
fn unprivileged_body() {
    assert!(!is_root(), "the child must not run as root");
    for d in DELIVERIES {
        let pager = Pager::builder()
            .delivery(d)
            .budget_pages(64)
            .build()
            .unwrap_or_else(|e| panic!("{d}: building a pager as an ordinary user: {e}"));
        let desc = pager.descriptor();
        assert!(
            desc.user_mode_only && !desc.device,
            "{d}: an ordinary user gets userfaultfd(2) user-mode-only, got {desc}"
        );
        // Anonymous memory 4x the budget: written, evicted, read back.
        let pages = 256;
        let mut anon = pager.map_anonymous(pages * PAGE).expect("map_anonymous");
        for p in 0..pages {
            anon.as_mut_slice()[p * PAGE + 7] = p as u8 ^ 0x5a;
        }
        for p in 0..pages {
            assert_eq!(
                anon.as_slice()[p * PAGE + 7],
                p as u8 ^ 0x5a,
                "{d}: page {p}"
            );
        }
        // A store-backed shared region.
        let data = pattern_vec(3, 128 * PAGE);
        let store = Arc::new(MemoryStore::from_bytes(&data).unwrap());
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let r = unsafe { pager.map_store(store, data.len(), &MapOptions::default()) }
            .expect("map_store");
        assert_bytes(r.as_slice(), &data, &format!("{d}: store region"));
        // A file mapped and written back.
        let f = TempFile::with_contents("unpriv", &pattern_vec(4, 64 * PAGE));
        // SAFETY: the test changes this store only through the region (the
        // store contract).
        let mut fr =
            unsafe { pager.map_file(f.path(), None, &MapOptions::default()) }.expect("map_file");
        fr.as_mut_slice()[5 * PAGE] = 0xee;
        fr.flush().expect("flush");
        drop(fr);
        assert_eq!(f.read()[5 * PAGE], 0xee, "{d}: file written back");
        assert!(
            pager.stats().get(uffd_pager::Counter::PGSTEAL) > 0,
            "{d}: evicted"
        );
    }
    // A read-only file's private copy (the anonymous kind), writable, as
    // MAP_PRIVATE maps one: the file is never opened for writing (it was,
    // and the map was refused).
    {
        use std::os::unix::fs::PermissionsExt;
        let data = pattern_vec(6, 8 * PAGE);
        let f = TempFile::with_contents("unpriv-ro", &data);
        std::fs::set_permissions(f.path(), std::fs::Permissions::from_mode(0o444)).unwrap();
        let pager = Pager::builder().delivery(THREADS).build().unwrap();
        let opts = MapOptions {
            kind: Some(uffd_pager::InstallKind::Anonymous),
            ..MapOptions::default()
        };
        // SAFETY: nothing changes the file while it is mapped.
        let mut r = unsafe { pager.map_file(f.path(), None, &opts) }
            .expect("a read-only file's private copy, writable");
        assert_bytes(r.as_slice(), &data, "the private copy");
        r.as_mut_slice()[3 * PAGE] ^= 0xff;
        drop(r);
        assert_eq!(f.read(), data, "the file is never written");
    }
    // A full descriptor is refused for want of permission: EPERM (it was
    // EOPNOTSUPP, "unsupported", which the C API returns as is).
    let refused = Pager::builder()
        .delivery(THREADS)
        .user_mode_only(false)
        .build()
        .expect_err("a full descriptor as an ordinary user");
    assert!(
        matches!(refused, uffd_pager::Error::NotAllowed(_)) && refused.errno() == libc::EPERM,
        "{refused:?}"
    );
    println!("{CHILD_OK}");
}

#[test]
fn every_delivery_mode_works_for_an_ordinary_user() {
    if is_child() {
        unprivileged_body();
        return;
    }
    let _one = AS_NOBODY.lock().unwrap_or_else(|e| e.into_inner());
    let out = run_child_unprivileged("every_delivery_mode_works_for_an_ordinary_user", &[]);
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains(CHILD_OK),
        "{}",
        describe(&out)
    );
}

#[test]
fn root_handler_threads_get_a_full_descriptor() {
    if !is_root() {
        eprintln!("skipping: needs root for a full descriptor");
        return;
    }
    let pager = Pager::builder()
        .delivery(THREADS)
        .build()
        .expect("handler-thread pager");
    let d = pager.descriptor();
    assert!(!d.user_mode_only, "root gets a full descriptor, got {d}");
    let in_thread = Pager::builder()
        .delivery(Delivery::InThread)
        .build()
        .expect("in-thread pager");
    assert!(in_thread.descriptor().user_mode_only);
    // Asking for a full descriptor explicitly works for root too.
    let full = Pager::builder()
        .delivery(THREADS)
        .user_mode_only(false)
        .build()
        .expect("full descriptor");
    assert!(!full.descriptor().user_mode_only);
}

/// Threads of this process now.
fn threads_now() -> usize {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

/// Tasks (threads of every process) of this process's real user now.
fn user_tasks() -> usize {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() }.to_string();
    let mut n = 0;
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        // (A process that exits meanwhile is skipped.)
        let Ok(s) = std::fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        let field = |k: &str| s.lines().find_map(|l| l.strip_prefix(k)).map(str::trim);
        if field("Uid:").and_then(|v| v.split_whitespace().next()) == Some(uid.as_str()) {
            n += field("Threads:").and_then(|v| v.parse().ok()).unwrap_or(0);
        }
    }
    n
}

/// The children that run as nobody run one at a time: RLIMIT_NPROC counts
/// that user's tasks in every process.
static AS_NOBODY: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The child: with room for only a few more threads, building a pager
/// fails part-way; the threads it had started must be stopped, not leaked.
#[test]
fn child_build_fails_part_way() {
    if !is_child() {
        return;
    }
    let before = threads_now();
    // RLIMIT_NPROC counts every task of this user, in every process: allow
    // three more.
    let allowed = user_tasks() + 3;
    let lim = libc::rlimit {
        rlim_cur: allowed as libc::rlim_t,
        rlim_max: allowed as libc::rlim_t,
    };
    // SAFETY: lowering our own limit.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NPROC, &lim) }, 0);
    // The room is there (else the builds below failed before starting
    // any thread, and the test could not fail).
    let room: Vec<_> = (0..3)
        .map(|_| {
            std::thread::Builder::new()
                .spawn(|| ())
                .expect("room for three threads")
        })
        .collect();
    room.into_iter().for_each(|t| t.join().unwrap());
    std::thread::sleep(std::time::Duration::from_millis(50));
    for _ in 0..3 {
        let r = Pager::builder()
            .delivery(THREADS)
            .budget_pages(64)
            .readahead(32, 4)
            .build();
        assert!(r.is_err(), "the build should run out of threads");
        // Joined threads are gone at once; give the kernel a moment anyway.
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(threads_now(), before, "a failed build left threads behind");
    }
    println!("{CHILD_OK}");
}

#[test]
fn a_failed_build_leaves_no_threads_behind() {
    // As nobody: RLIMIT_NPROC does not bind root.
    let _one = AS_NOBODY.lock().unwrap_or_else(|e| e.into_inner());
    let out = run_child_unprivileged("child_build_fails_part_way", &[]);
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains(CHILD_OK),
        "{}",
        describe(&out)
    );
}
