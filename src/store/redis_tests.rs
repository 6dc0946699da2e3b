//! Unit tests of `redis.rs`. Each test starts its own `redis-server`s on
//! free loopback ports and kills them when it ends; a missing
//! `redis-server` fails the tests unless `UFFD_SKIP_REDIS=1` is set.

use super::*;
use crate::store::MAX_BATCH;
use std::collections::HashMap;
use std::time::Instant;

#[path = "redis_cluster_tests.rs"]
mod cluster;
#[path = "redis_failure_tests.rs"]
mod failures;
#[path = "redis_test_servers.rs"]
mod servers;

use servers::{exists, free_port, have_redis, opts, page, raw, Server, P};

#[test]
fn round_trip_sparse_keys_and_layout() {
    if !have_redis() {
        return;
    }
    let srv = Server::start();
    let s = RedisStore::open(&srv.url(), 128 * P as u64, &opts("t1")).unwrap();
    assert_eq!(
        (s.len(), s.name(), s.prefix()),
        (128 * P as u64, "redis", "t1")
    );
    assert!(s.writable() && !s.signal_safe() && !s.synchronous());
    let mut c = raw(&srv.url());

    let a = page(5);
    s.write(5 * P as u64, &a).unwrap();
    assert_eq!(s.key(5 * P as u64 + 17), "{t1:0}:5");
    let v: Vec<u8> = ::redis::cmd("GET").arg("{t1:0}:5").query(&mut c).unwrap();
    assert_eq!(v, a, "a plain client reads the page at its documented key");
    let mut back = vec![0xAA; P];
    s.read(5 * P as u64, &mut back).unwrap();
    assert_eq!(back, a);

    // Never written: no key, reads as zeros.
    s.read(6 * P as u64, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0));
    assert!(!exists(&mut c, &s.key(6 * P as u64)));

    // A zero page deletes its key.
    s.write(5 * P as u64, &[0; P]).unwrap();
    assert!(!exists(&mut c, "{t1:0}:5"));
    back.fill(0xAA);
    s.read(5 * P as u64, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0));

    // Page 70 is in chunk 1; a plain SET there is read back by the store.
    let b = page(70);
    let _: () = ::redis::cmd("SET")
        .arg(page_key("t1", 70))
        .arg(&b)
        .query(&mut c)
        .unwrap();
    assert_eq!(page_key("t1", 70), "{t1:1}:70");
    s.read(70 * P as u64, &mut back).unwrap();
    assert_eq!(back, b);

    // Not whole pages, or out of bounds: EINVAL, nothing sent.
    let e = Err(StoreError(libc::EINVAL));
    assert_eq!(s.read(1, &mut back), e);
    assert_eq!(s.read(0, &mut back[..100]), e);
    assert_eq!(s.read(128 * P as u64, &mut back), e);
    assert_eq!(s.write(u64::MAX - 4095, &back), e);
    assert_eq!(s.write_many(&[(0, &back[..10])]), e);
}

#[test]
fn batches_of_32_pages_across_a_chunk_boundary() {
    if !have_redis() {
        return;
    }
    let srv = Server::start();
    let s = RedisStore::open(&srv.url(), 128 * P as u64, &opts("t2")).unwrap();
    let mut c = raw(&srv.url());
    // Pages 50..82 span chunks 0 and 1; every fifth is zero, and one of
    // those has a stale key the batch must delete.
    let _: () = ::redis::cmd("SET")
        .arg(page_key("t2", 55))
        .arg(page(1))
        .query(&mut c)
        .unwrap();
    let want: Vec<Vec<u8>> = (50..82u64)
        .map(|p| if p % 5 == 0 { vec![0; P] } else { page(p) })
        .collect();
    let mut batch: Vec<(u64, &[u8])> = (50..82u64)
        .map(|p| (p * P as u64, want[(p - 50) as usize].as_slice()))
        .collect();
    batch.reverse(); // any order
    batch.swap(3, 17);
    assert_eq!(batch.len(), MAX_BATCH);
    s.write_many(&batch).unwrap();
    for p in 50..82u64 {
        assert_eq!(exists(&mut c, &page_key("t2", p)), p % 5 != 0, "page {p}");
    }
    let mut back = vec![0xAA; MAX_BATCH * P];
    s.read_many(50 * P as u64, &mut back).unwrap();
    for (k, w) in want.iter().enumerate() {
        assert_eq!(&back[k * P..(k + 1) * P], &w[..], "page {}", 50 + k);
    }
    // `write` and `read` of several pages take the same paths.
    s.write(0, &back[..4 * P]).unwrap();
    let mut four = vec![0; 4 * P];
    s.read(0, &mut four).unwrap();
    assert_eq!(four, back[..4 * P]);

    // read_to_fd over 40 pages (more than one batch) into a memfd.
    let m = crate::sys::mem::Memfd::new("redis-test", 40 * P).unwrap();
    s.read_to_fd(48 * P as u64, 40 * P, m.as_fd(), 0).unwrap();
    let mut out = vec![0u8; 40 * P];
    // SAFETY: pread into a live buffer of that length from our memfd.
    let n = unsafe { libc::pread(m.fd(), out.as_mut_ptr().cast(), out.len(), 0) };
    assert_eq!(n, out.len() as isize);
    for k in 0..40u64 {
        let p = 48 + k;
        let expect = if (50..82).contains(&p) {
            want[(p - 50) as usize].clone()
        } else {
            vec![0; P]
        };
        assert_eq!(
            &out[k as usize * P..(k as usize + 1) * P],
            &expect[..],
            "page {p}"
        );
    }
}

#[test]
fn a_value_that_is_not_a_page_is_eio() {
    if !have_redis() {
        return;
    }
    let srv = Server::start();
    let s = RedisStore::open(&srv.url(), 64 * P as u64, &opts("t3")).unwrap();
    let mut c = raw(&srv.url());
    let eio = Err(StoreError(libc::EIO));
    for len in [0, 100, P - 1, P + 1] {
        let _: () = ::redis::cmd("SET")
            .arg(page_key("t3", 3))
            .arg(vec![9u8; len])
            .query(&mut c)
            .unwrap();
        let mut back = vec![0; P];
        assert_eq!(s.read(3 * P as u64, &mut back), eio, "GET of {len} bytes");
        let mut many = vec![0; 8 * P];
        assert_eq!(s.read_many(0, &mut many), eio, "MGET with {len} bytes");
    }
    // A key of another type: GET says WRONGTYPE, which is not retried.
    let _: () = ::redis::cmd("DEL")
        .arg(page_key("t3", 3))
        .query(&mut c)
        .unwrap();
    let _: () = ::redis::cmd("RPUSH")
        .arg(page_key("t3", 3))
        .arg("x")
        .query(&mut c)
        .unwrap();
    let t = Instant::now();
    assert_eq!(s.read(3 * P as u64, &mut [0; P]), eio);
    assert!(
        t.elapsed() < Duration::from_millis(250),
        "a permanent error was retried"
    );
    // The connection is still good for the next call.
    s.write(4 * P as u64, &page(4)).unwrap();
}

#[test]
fn bad_input_is_a_typed_error() {
    let bad_url = |u: &str| match RedisUrl::parse(u) {
        Err(RedisStoreError::BadUrl { url, .. }) => assert_eq!(url, u),
        other => panic!("{u:?} parsed as {other:?}"),
    };
    for u in [
        "",
        "http://h:1",
        "redis://",
        "redis://:6379",
        "redis://h:",
        "redis://h:0",
        "redis://h:65536",
        "redis://h:+5",
        "redis://h:x",
        "redis://h:1/x",
        "redis://h:1/-1",
        "redis://u:p@h:1",
        "redis://h:1?db=2",
        "redis://::1:6379",
        "redis://[::1",
        "redis://[zz]:1",
        "redis://h h:1",
        "redis://[127.0.0.1]:6379",
        "redis://[1]:6379",
        "redis://[:]:6379",
        "redis://[...]",
        "redis://.:1",
        "redis://-:1",
        "redis://a..b:1",
        "redis://-a:1",
        "redis://1.2.3:1",
        "redis://1.2.3.999:1",
        "redis-cluster://[1.2.3.4]",
        "redis-cluster://",
        "redis-cluster://a:1,,b:2",
        "redis-cluster://a:1/3",
        "redis://h:1/99999999999",
    ] {
        bad_url(u);
    }
    let ok = |u: &str| RedisUrl::parse(u).unwrap().to_string();
    assert_eq!(ok("redis://localhost"), "redis://localhost:6379/0");
    assert_eq!(ok("redis://10.0.0.1:7"), "redis://10.0.0.1:7/0");
    assert_eq!(
        ok("redis://db.example.com.:7"),
        "redis://db.example.com.:7/0"
    );
    assert_eq!(
        ok("redis://my_host.example-1.org"),
        "redis://my_host.example-1.org:6379/0"
    );
    assert_eq!(
        ok("redis://[::ffff:1.2.3.4]"),
        "redis://[::ffff:1.2.3.4]:6379/0"
    );
    assert_eq!(ok("redis://h:7/3"), "redis://h:7/3");
    assert_eq!(ok("redis://[::1]:6390/"), "redis://[::1]:6390/0");
    assert_eq!(
        ok("redis-cluster://a:1,b,[::1]:3/"),
        "redis-cluster://a:1,b:6379,[::1]:3"
    );

    let url = "redis://127.0.0.1:1";
    for prefix in ["", "a{b", "a}b", "tab\t"] {
        let r = RedisStore::open(
            url,
            4096,
            &RedisOptions {
                prefix: prefix.into(),
                ..opts("x")
            },
        );
        assert!(
            matches!(r, Err(RedisStoreError::BadPrefix { .. })),
            "{prefix:?}: {r:?}"
        );
    }
    for len in [0, 4095, 4097] {
        let r = RedisStore::open(url, len, &opts("x"));
        assert!(
            matches!(r, Err(RedisStoreError::BadLength(l)) if l == len),
            "{r:?}"
        );
    }
    let zero_t = RedisOptions {
        timeout: Duration::ZERO,
        ..opts("x")
    };
    let zero_a = RedisOptions {
        attempts: 0,
        ..opts("x")
    };
    // `Duration::MAX` ("no timeout") opened, and then every call panicked
    // (the clock plus the timeout overflowed).
    let huge_t = RedisOptions {
        timeout: Duration::MAX,
        ..opts("x")
    };
    for o in [zero_t, zero_a, huge_t] {
        assert!(matches!(
            RedisStore::open(url, 4096, &o),
            Err(RedisStoreError::BadOptions(_))
        ));
    }
    // Nothing listening: a connection error at open, with the reason.
    let port = free_port();
    let t = Instant::now();
    let r = RedisStore::open(&format!("redis://127.0.0.1:{port}"), 4096, &opts("x"));
    match r {
        Err(RedisStoreError::Connect { url, message }) => {
            assert_eq!(url, format!("redis://127.0.0.1:{port}/0"));
            assert!(!message.is_empty());
        }
        other => panic!("{other:?}"),
    }
    assert!(t.elapsed() < Duration::from_secs(3));
    let r = RedisStore::ping(&format!("redis-cluster://127.0.0.1:{port}"), &opts("x"));
    assert!(matches!(r, Err(RedisStoreError::Connect { .. })), "{r:?}");
}

#[test]
fn one_connection_per_concurrent_caller() {
    if !have_redis() {
        return;
    }
    let srv = Server::start();
    let s = Arc::new(RedisStore::open(&srv.url(), 256 * P as u64, &opts("t7")).unwrap());
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                let mut back = vec![0; P];
                for p in (t..256).step_by(4) {
                    s.write(p * P as u64, &page(p)).unwrap();
                    s.read(p * P as u64, &mut back).unwrap();
                    assert_eq!(back, page(p));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let idle = s.shared.idle_count();
    assert!((1..=4).contains(&idle), "{idle} idle connections");
}

/// One server spelled two ways (a name for its address, the default
/// database left out) is one store where unwritten pages wait
/// (`Store::identity`): the identity hashed the URL as written, so a
/// namespace reopened as `localhost` was mapped without the pages its
/// earlier store still had to write.
#[test]
fn one_server_spelled_two_ways_has_one_identity() {
    if !have_redis() {
        return;
    }
    let srv = Server::start();
    let by_name = format!("redis://localhost:{}", srv.port);
    let open = |url: &str, prefix: &str| {
        RedisStore::open(url, P as u64, &opts(prefix))
            .unwrap()
            .identity()
            .unwrap()
    };
    let a = open(&srv.url(), "t10");
    assert_eq!(open(&by_name, "t10"), a, "{by_name} and {}", srv.url());
    assert_ne!(open(&by_name, "t11"), a, "another namespace");
    let db1 = format!("redis://127.0.0.1:{}/1", srv.port);
    assert_ne!(open(&db1, "t10"), a, "another database");
}

/// The calls of `cmd` the server has served (`INFO commandstats`).
fn calls(c: &mut ::redis::Connection, cmd: &str) -> u64 {
    let info: String = ::redis::cmd("INFO").arg("commandstats").query(c).unwrap();
    let line = format!("cmdstat_{cmd}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&line))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

/// A 2 MiB page's 512 keys are one `MGET` on one server, read into a
/// buffer or through to a file, as `bench far`'s floor reads them: it
/// was two into a buffer (runs of 256) and sixteen through to a file
/// (a buffer of 32 pages), so the bench's ratio counted round trips the
/// floor did not make.
#[test]
fn a_2_mib_page_is_one_mget() {
    if !have_redis() {
        return;
    }
    let srv = Server::start();
    const N: usize = 512;
    let s = RedisStore::open(&srv.url(), (N * P) as u64, &opts("t9")).unwrap();
    let want: Vec<u8> = (0..N as u64).flat_map(page).collect();
    s.write(0, &want).unwrap();
    let mut c = raw(&srv.url());
    let before = calls(&mut c, "mget");
    let mut back = vec![0xAA; N * P];
    s.read(0, &mut back).unwrap();
    assert!(back == want, "the page read back");
    assert_eq!(calls(&mut c, "mget") - before, 1, "MGETs for a read");
    let file = crate::sys::mem::Memfd::new("t9", N * P).unwrap();
    // SAFETY: the memfd is open for as long as `file` lives.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(file.fd()) };
    s.read_to_fd(0, N * P, fd, 0).unwrap();
    assert_eq!(
        calls(&mut c, "mget") - before,
        2,
        "MGETs for a read to a file"
    );
    let mut through = vec![0xAA; N * P];
    // SAFETY: `through` is writable for its length.
    let n = unsafe { libc::pread(file.fd(), through.as_mut_ptr().cast(), N * P, 0) };
    assert_eq!(n, (N * P) as isize);
    assert!(through == want, "the page read through to the file");
}

#[test]
fn namespaces_clear_and_ping() {
    if !have_redis() {
        return;
    }
    let srv = Server::start();
    let a = RedisStore::open(&srv.url(), 200 * P as u64, &opts("ns-a")).unwrap();
    let b = a.with_prefix("ns-b", 100 * P as u64).unwrap();
    assert!(
        Arc::ptr_eq(&a.shared, &b.shared),
        "with_prefix shares the client and pool"
    );
    assert_eq!((b.prefix(), b.len()), ("ns-b", 100 * P as u64));
    assert!(matches!(
        a.with_prefix("{x}", 4096),
        Err(RedisStoreError::BadPrefix { .. })
    ));
    assert!(matches!(
        a.with_prefix("x", 10),
        Err(RedisStoreError::BadLength(10))
    ));

    let written: HashMap<u64, Vec<u8>> = [0u64, 63, 64, 130, 199].map(|p| (p, page(p))).into();
    for (p, v) in &written {
        a.write(p * P as u64, v).unwrap();
    }
    b.write(0, &page(1000)).unwrap();
    let mut back = vec![0; P];
    b.read(0, &mut back).unwrap();
    assert_eq!(back, page(1000));
    a.read(0, &mut back).unwrap();
    assert_eq!(back, page(0), "namespaces are separate");

    assert_eq!(a.clear().unwrap(), written.len() as u64);
    assert_eq!(a.clear().unwrap(), 0);
    for p in written.keys() {
        a.read(p * P as u64, &mut back).unwrap();
        assert!(back.iter().all(|&x| x == 0), "page {p} survived clear");
    }
    b.read(0, &mut back).unwrap();
    assert_eq!(back, page(1000), "clear stays in its namespace");

    let about = RedisStore::ping(&srv.url(), &opts("unused")).unwrap();
    assert!(
        about.starts_with("redis ") && about.contains("standalone"),
        "{about}"
    );
    assert!(!about.contains('?'), "{about}");
}

#[test]
fn crc16_and_hash_slots() {
    assert_eq!(conn::crc16(b"123456789"), 0x31C3);
    assert_eq!(conn::crc16(b""), 0);
    assert_eq!(conn::key_slot(b"123456789"), 12739);
    assert_eq!(conn::key_slot(b"foo"), 12182);
    let tag = conn::key_slot(b"user1000");
    assert_eq!(conn::key_slot(b"{user1000}.following"), tag);
    assert_eq!(conn::key_slot(b"x{user1000}y{z}"), tag);
    // An empty tag hashes the whole key; so does an unclosed one.
    assert_eq!(
        conn::key_slot(b"foo{}{bar}"),
        conn::crc16(b"foo{}{bar}") & 0x3FFF
    );
    assert_eq!(conn::key_slot(b"foo{bar"), conn::crc16(b"foo{bar") & 0x3FFF);
    assert_eq!(conn::key_slot(b"foo{{bar}}"), conn::crc16(b"{bar") & 0x3FFF);
    // A page's slot is its chunk's tag's.
    assert_eq!(
        conn::key_slot(page_key("uffd", 130).as_bytes()),
        conn::key_slot(b"uffd:2")
    );
}

#[test]
fn the_engine_pages_through_redis() {
    if !have_redis() {
        return;
    }
    let srv = Server::start();
    let pages = 256usize;
    let s = RedisStore::open(&srv.url(), (pages * P) as u64, &opts("eng")).unwrap();
    let seeded = s.with_prefix("eng", (pages * P) as u64).unwrap();
    for p in [0u64, 1, 100, 255] {
        seeded.write(p * P as u64, &page(p)).unwrap();
    }
    let pager = crate::Pager::builder().build().unwrap();
    // SAFETY: the test changes this store only through the region (the
    // store contract).
    let mut region =
        unsafe { pager.map_store(Arc::new(s), pages * P, &crate::MapOptions::default()) }.unwrap();
    for p in 0..pages {
        let got = &region.as_slice()[p * P..(p + 1) * P];
        let expect = if [0, 1, 100, 255].contains(&p) {
            page(p as u64)
        } else {
            vec![0; P]
        };
        assert!(got == &expect[..], "page {p} faulted in wrong");
    }
    region.as_mut_slice()[7 * P..8 * P].copy_from_slice(&page(77));
    region.as_mut_slice()[P..2 * P].fill(0);
    region.flush().unwrap();
    drop(region);
    let mut c = raw(&srv.url());
    let v: Vec<u8> = ::redis::cmd("GET")
        .arg(page_key("eng", 7))
        .query(&mut c)
        .unwrap();
    assert_eq!(v, page(77), "written back");
    assert!(
        !exists(&mut c, &page_key("eng", 1)),
        "a page zeroed in memory is deleted"
    );
}
