//! The Redis tests' servers: `redis-server` child processes on free
//! loopback ports, killed on drop, and small helpers around them.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::super::RedisOptions;
use crate::sys::PAGE_SIZE;

/// A page's size, short.
pub(super) const P: usize = PAGE_SIZE;

/// Whether the Redis tests run: `redis-server` is required unless
/// `UFFD_SKIP_REDIS=1`.
pub(super) fn have_redis() -> bool {
    if std::env::var_os("UFFD_SKIP_REDIS").is_some_and(|v| v == "1") {
        eprintln!("skipped: UFFD_SKIP_REDIS=1");
        return false;
    }
    match Command::new("redis-server").arg("--version").output() {
        Ok(o) if o.status.success() => true,
        _ => panic!("redis-server is not on PATH: install it, or set UFFD_SKIP_REDIS=1"),
    }
}

/// A scratch directory, removed on drop.
pub(super) struct TempDir(pub(super) PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("uffd-pager-redis-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A loopback port free now, whose cluster bus port (+10000) is free too.
pub(super) fn free_port() -> u16 {
    static N: AtomicU32 = AtomicU32::new(0);
    loop {
        let n = N.fetch_add(1, Ordering::Relaxed);
        let port = 20000 + ((std::process::id().wrapping_mul(37) + n * 11) % 12000) as u16;
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 10000) {
            return port;
        }
    }
}

/// A `redis-server` child process on 127.0.0.1, killed on drop.
pub(super) struct Server {
    child: Option<Child>,
    pub(super) port: u16,
    dir: TempDir,
    extra: Vec<String>,
}

impl Server {
    /// A standalone server, no persistence.
    pub(super) fn start() -> Server {
        Self::start_with(|_, _| Vec::new())
    }

    /// A server with extra arguments made from its port and directory.
    pub(super) fn start_with(extra: impl Fn(u16, &PathBuf) -> Vec<String>) -> Server {
        let port = free_port();
        let dir = TempDir::new(&format!("srv{port}"));
        let extra = extra(port, &dir.0);
        let mut s = Server {
            child: None,
            port,
            dir,
            extra,
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(&self.dir.0)
            .arg("--logfile")
            .arg(self.dir.0.join("redis.log"))
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !pong(self.port) {
            assert!(
                Instant::now() < deadline,
                "redis-server on {} never answered",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(super) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// SIGKILLs the server and reaps it.
    pub(super) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// A fresh, empty server on the same port.
    pub(super) fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Sends `sig` (SIGSTOP, SIGCONT) to the server.
    pub(super) fn signal(&self, sig: i32) {
        let pid = self.child.as_ref().unwrap().id() as libc::pid_t;
        // SAFETY: kill(2) on our own child process, which we have not reaped.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether something on `port` answers `PING` with `+PONG`.
fn pong(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let mut buf = [0u8; 16];
    s.write_all(b"PING\r\n").is_ok()
        && s.read(&mut buf)
            .is_ok_and(|n| buf[..n].starts_with(b"+PONG"))
}

/// A plain client connection, to check keys behind the store's back.
pub(super) fn raw(url: &str) -> ::redis::Connection {
    ::redis::Client::open(url)
        .unwrap()
        .get_connection()
        .unwrap()
}

pub(super) fn opts(prefix: &str) -> RedisOptions {
    RedisOptions {
        prefix: prefix.to_string(),
        timeout: Duration::from_millis(300),
        attempts: 3,
    }
}

/// A page whose bytes depend on `seed`, never all zero.
pub(super) fn page(seed: u64) -> Vec<u8> {
    (0..P as u64)
        .map(|i| ((i * 31 + seed * 7) % 251) as u8 + 1)
        .collect()
}

pub(super) fn exists(c: &mut ::redis::Connection, key: &str) -> bool {
    ::redis::cmd("EXISTS").arg(key).query::<i64>(c).unwrap() == 1
}
