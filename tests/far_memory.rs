//! Far memory through the engine, against real Redis servers: a sparse
//! object costs nothing, and a server that is killed, frozen and restarted
//! mid-run gives defined outcomes only (the right page, or the read-error
//! path within the store's timeout times its attempts), never wrong data
//! or a hang; once the server is back, new faults succeed and a poisoned
//! page comes back once the application drops it.
//!
//! The sparse test uses the standalone server at `UFFD_REDIS_URL` (default
//! `redis://127.0.0.1:6390`, started by `make test`); the restart test runs
//! a `redis-server` of its own. Set `UFFD_SKIP_REDIS=1` to skip them.

#[path = "engine_util.rs"]
mod util;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uffd_pager::store::{RedisOptions, RedisStore, Store};
use uffd_pager::{Counter, Delivery, InstallKind, MapOptions, Pager};
use util::{pattern, pattern_vec, PAGE};

fn skip() -> bool {
    let skip = std::env::var_os("UFFD_SKIP_REDIS").is_some_and(|v| v == "1");
    if skip {
        eprintln!("skipped: UFFD_SKIP_REDIS=1");
    }
    skip
}

fn url() -> String {
    std::env::var("UFFD_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6390".into())
}

/// A pager with in-thread delivery, `budget` pages, no readahead or
/// fault-around, `read_attempts` tries per read, and a shared region of
/// `pages` pages over `store`.
fn pager_and_region(
    store: Arc<RedisStore>,
    pages: usize,
    budget: u64,
    read_attempts: u32,
    writable: bool,
) -> (Pager, uffd_pager::Region) {
    let pager = Pager::builder()
        .delivery(Delivery::InThread)
        .budget_pages(budget)
        .read_attempts(read_attempts)
        .readahead(0, 0)
        .fault_around(0)
        .build()
        .unwrap();
    let map = MapOptions {
        kind: Some(InstallKind::Shared),
        writable,
        ..MapOptions::default()
    };
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let region = unsafe { pager.map_store(store, pages * PAGE, &map) }.unwrap();
    (pager, region)
}

fn namespace(tag: &str) -> String {
    format!("uffd-test-{tag}-{}", std::process::id())
}

#[test]
fn a_sparse_object_costs_nothing_and_zero_pages_leave_no_key() {
    if skip() {
        return;
    }
    const PAGES: usize = 1 << 18; // 1 GiB
    let opts = RedisOptions {
        prefix: namespace("sparse"),
        ..RedisOptions::default()
    };
    let store = Arc::new(
        RedisStore::open(&url(), (PAGES * PAGE) as u64, &opts)
            .unwrap_or_else(|e| panic!("{e} (is the server up? `make redis-up`)")),
    );
    store.clear().unwrap();
    let (pager, mut region) = pager_and_region(store.clone(), PAGES, 256, 3, true);
    // Pages nobody wrote read as zeros, from anywhere in the gigabyte.
    for k in 0..1000 {
        let p = (k * 2_654_435_761usize) % PAGES;
        assert!(
            region.as_slice()[p * PAGE..(p + 1) * PAGE]
                .iter()
                .all(|&b| b == 0),
            "page {p}"
        );
    }
    // Ten pages written: ten keys, each holding its page.
    let written: Vec<usize> = (0..10).map(|k| k * 25_000 + 7).collect();
    for &p in &written {
        region.as_mut_slice()[p * PAGE..(p + 1) * PAGE]
            .copy_from_slice(&pattern_vec(p as u64, PAGE));
    }
    region.flush().unwrap();
    // One of them zeroed again: its key goes.
    let p0 = written[0];
    region.as_mut_slice()[p0 * PAGE..(p0 + 1) * PAGE].fill(0);
    region.flush().unwrap();
    let mut buf = vec![0u8; PAGE];
    for &p in &written[1..] {
        store.read((p * PAGE) as u64, &mut buf).unwrap();
        assert_eq!(buf, pattern_vec(p as u64, PAGE), "page {p} in Redis");
    }
    drop(region);
    assert_eq!(store.clear().unwrap(), 9, "nine pages hold data: nine keys");
    assert_eq!(pager.stats().get(Counter::IO_ERROR), 0);
}

/// A `redis-server` of the test's own that keeps every write on disk
/// (`appendfsync always`), so that a restart finds what was acknowledged.
struct OwnServer {
    port: u16,
    dir: std::path::PathBuf,
    child: Option<Child>,
    /// One own server at a time in this binary: two tests at once chose
    /// the same port and directory (both from the process id), and each
    /// then reached, froze or killed the other's server.
    _one: std::sync::MutexGuard<'static, ()>,
}

static ONE_SERVER: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl OwnServer {
    fn start() -> OwnServer {
        // (A test that failed holding it poisoned it: the next still runs.)
        let one = ONE_SERVER.lock().unwrap_or_else(|e| e.into_inner());
        let dir = std::env::temp_dir().join(format!("uffd-far-restart-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let port = (0..200)
            .map(|k| {
                21000
                    + ((std::process::id() as u16)
                        .wrapping_mul(13)
                        .wrapping_add(k * 7)
                        % 9000)
            })
            .find(|&p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
            .expect("a free loopback port");
        let mut s = OwnServer {
            port,
            dir,
            child: None,
            _one: one,
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args(["--appendonly", "yes", "--appendfsync", "always", "--dir"])
            .arg(&self.dir)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server is not on PATH: install it, or set UFFD_SKIP_REDIS=1");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while RedisStore::ping(&self.url(), &RedisOptions::default()).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not come up");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn signal(&self, sig: i32) {
        let pid = self.child.as_ref().unwrap().id() as i32;
        // SAFETY: kill(2) on our own child, which has not been reaped.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.signal(libc::SIGCONT);
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Faults page `p` in through the engine (a `prefault`, which reports the
/// read-error path as an error instead of SIGBUS) and, if it came in,
/// checks every byte; returns whether it came in and how long it took.
fn touch(region: &uffd_pager::Region, p: usize) -> (bool, Duration) {
    let t = Instant::now();
    let ok = region.prefault(p * PAGE, PAGE).is_ok();
    let took = t.elapsed();
    if ok {
        let page = &region.as_slice()[p * PAGE..(p + 1) * PAGE];
        if let Some(i) = (0..PAGE).find(|&i| page[i] != pattern(3, p * PAGE + i)) {
            panic!("page {p}: wrong data at byte {i}");
        }
    }
    (ok, took)
}

#[test]
fn a_killed_frozen_and_restarted_server_gives_defined_outcomes_only() {
    if skip() {
        return;
    }
    const PAGES: usize = 512;
    const BUDGET: u64 = 64;
    let mut server = OwnServer::start();
    let (timeout, attempts) = (Duration::from_millis(200), 2);
    let opts = RedisOptions {
        prefix: namespace("restart"),
        timeout,
        attempts,
    };
    let store = Arc::new(RedisStore::open(&server.url(), (PAGES * PAGE) as u64, &opts).unwrap());
    let data = pattern_vec(3, PAGES * PAGE);
    let batch: Vec<(u64, &[u8])> = (0..PAGES)
        .map(|p| ((p * PAGE) as u64, &data[p * PAGE..(p + 1) * PAGE]))
        .collect();
    for chunk in batch.chunks(uffd_pager::store::MAX_BATCH) {
        store.write_many(chunk).unwrap();
    }
    // One read attempt per fault: a fault then waits about the store's
    // timeout times its attempts (plus its backoff); the bound leaves room
    // for a loaded machine's reconnects and scheduling (300 ms of room
    // was once short) and is still far below a hang.
    let bound = timeout * attempts * 3 + Duration::from_secs(1);
    let (pager, mut region) = pager_and_region(store.clone(), PAGES, BUDGET, 1, false);
    for p in 0..PAGES {
        assert!(touch(&region, p).0, "page {p} with the server up");
    }

    let mut poisoned = Vec::new();
    // Touches every page from the last (the resident ones first), or
    // stops after `max_failed` read errors.
    let sweep = |phase: &str, poisoned: &mut Vec<usize>, max_failed: usize| {
        let (mut ok, mut failed, mut slowest) = (0, 0, Duration::ZERO);
        for p in (0..PAGES).rev() {
            if failed == max_failed {
                break;
            }
            if poisoned.contains(&p) {
                continue;
            }
            let (came, took) = touch(&region, p);
            slowest = slowest.max(took);
            if came {
                ok += 1;
            } else {
                failed += 1;
                poisoned.push(p);
            }
        }
        eprintln!(
            "{phase}: {ok} pages served, {failed} took the read-error path, slowest {slowest:?}"
        );
        assert!(
            slowest < bound,
            "{phase}: a fault waited {slowest:?} (bound {bound:?})"
        );
        (ok, failed)
    };

    // Killed: resident pages are still served, the rest fail fast.
    server.kill();
    let (ok, failed) = sweep("killed", &mut poisoned, 100);
    assert!(
        failed > 0 && ok > 0,
        "some pages were resident, the others needed the server"
    );

    // Frozen (a hung server): each fault that needs it ends within the bound.
    server.spawn();
    server.signal(libc::SIGSTOP);
    let (_, failed) = sweep("frozen", &mut poisoned, 4);
    assert!(failed > 0);
    server.signal(libc::SIGCONT);

    // Back: every page that did not take the read-error path comes in with
    // the right data; the poisoned ones come back once dropped.
    poisoned.sort_unstable();
    for p in 0..PAGES {
        if poisoned.binary_search(&p).is_err() {
            assert!(touch(&region, p).0, "page {p} after the restart");
        }
    }
    for &p in &poisoned {
        region.dontneed(p * PAGE, PAGE).unwrap();
        assert!(
            touch(&region, p).0,
            "poisoned page {p} after it was dropped"
        );
    }
    let st = pager.stats();
    eprintln!(
        "io_error {} poisoned {}; {} pages poisoned then recovered",
        st.get(Counter::IO_ERROR),
        st.get(Counter::POISONED),
        poisoned.len()
    );
    assert!(st.get(Counter::IO_ERROR) > 0);
    drop(region);
    store.clear().unwrap();
}

/// A namespace opened again (a new `RedisStore`) while the pages an
/// earlier region over it could not write back wait: the map writes them
/// first, and the new region reads them. The two stores did not count as
/// one (no `Store::identity`), so the map went ahead without them, read
/// the older bytes, and the later write-back would have put those over
/// the new region's writes.
#[test]
fn a_namespace_opened_again_gets_the_pages_that_waited() {
    if skip() {
        return;
    }
    const PAGES: usize = 16;
    let server = OwnServer::start();
    let opts = RedisOptions {
        prefix: namespace("reopen"),
        timeout: Duration::from_millis(200),
        attempts: 1,
    };
    let len = (PAGES * PAGE) as u64;
    let first = Arc::new(RedisStore::open(&server.url(), len, &opts).unwrap());
    let (pager, mut region) = pager_and_region(first, PAGES, 64, 1, true);
    region.as_mut_slice().fill(b'n');
    // The server frozen: the unmap's write-back fails, and its pages wait.
    server.signal(libc::SIGSTOP);
    let unmapped = region.unmap();
    server.signal(libc::SIGCONT);
    assert!(
        unmapped.is_err(),
        "the write-back should fail: {unmapped:?}"
    );
    assert!(pager.unwritten_bytes() > 0);
    let again = Arc::new(RedisStore::open(&server.url(), len, &opts).unwrap());
    let map = MapOptions {
        kind: Some(InstallKind::Shared),
        ..MapOptions::default()
    };
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let region = unsafe { pager.map_store(again, PAGES * PAGE, &map) }.unwrap();
    assert_eq!(pager.unwritten_bytes(), 0, "written before the map");
    assert!(
        region.as_slice().iter().all(|&b| b == b'n'),
        "the new region reads what the first one stored"
    );
}

/// Anonymous regions swapping to Redis, one namespace per region: a
/// region that goes leaves no key behind, whether its pages were in swap
/// at the end or dropped (`MADV_DONTNEED`) before it. Before, a swap store
/// that is not signal-safe was never told to forget a page, so every key
/// of every region stayed on the server (a program mapping and unmapping
/// regions grew the server's memory without bound). Found by review.
#[test]
fn an_unmapped_regions_swap_keys_are_deleted() {
    if skip() {
        return;
    }
    const PAGES: usize = 64;
    let base = namespace("swap-left");
    let made = Arc::new(std::sync::Mutex::new(Vec::<Arc<RedisStore>>::new()));
    let (m, b) = (made.clone(), base.clone());
    let make = move |len: usize| -> std::io::Result<Arc<dyn Store>> {
        let mut m = m.lock().unwrap();
        let opts = RedisOptions {
            prefix: format!("{b}-{}", m.len()),
            ..RedisOptions::default()
        };
        let s =
            Arc::new(RedisStore::open(&url(), len as u64, &opts).map_err(std::io::Error::other)?);
        s.clear().map_err(std::io::Error::other)?;
        m.push(s.clone());
        Ok(s)
    };
    // SAFETY: each swap store is a namespace of this test's own, which
    // only the pager writes while it runs (the test reads it afterwards).
    let builder = unsafe { Pager::builder().budget_pages(8).swap_to(make) };
    let pager = builder
        .delivery(Delivery::InThread)
        .readahead(0, 0)
        .fault_around(0)
        .build()
        .unwrap();
    for dropped in [false, true] {
        let mut region = pager.map_anonymous(PAGES * PAGE).unwrap();
        for p in 0..PAGES {
            region.as_mut_slice()[p * PAGE..(p + 1) * PAGE]
                .copy_from_slice(&pattern_vec(p as u64, PAGE));
        }
        for p in 0..PAGES {
            assert_eq!(
                region.as_slice()[p * PAGE],
                pattern(p as u64, 0),
                "page {p}"
            );
        }
        let store = made.lock().unwrap().last().unwrap().clone();
        let keys = |s: &RedisStore| {
            // A second handle on the namespace: `clear` counts (and
            // deletes) what is there.
            let o = RedisOptions {
                prefix: s.prefix().to_string(),
                ..RedisOptions::default()
            };
            RedisStore::open(&url(), s.len(), &o)
                .unwrap()
                .clear()
                .unwrap()
        };
        assert!(
            pager.stats().get(Counter::WRITEBACK) > 0,
            "pages went to swap"
        );
        if dropped {
            region.dontneed(0, PAGES * PAGE).unwrap();
        }
        drop(region);
        assert_eq!(
            keys(&store),
            0,
            "keys left by a region that went (dropped first: {dropped})"
        );
    }
    assert_eq!(pager.stats().get(Counter::IO_ERROR), 0);
}
