//! A store whose pages live in Redis, one server or a Redis Cluster: see
//! [`RedisStore`] for the URLs, the key layout and the failure handling.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ::redis::Value;

use super::{Store, StoreError};
use crate::sys::PAGE_SIZE;

#[path = "redis_conn.rs"]
mod conn;
#[path = "redis_pages.rs"]
mod pages;
#[path = "redis_url.rs"]
mod urls;

use conn::{Backend, Conn, Shared};
use urls::{check_len, connect, field, info_fields};
pub use urls::{RedisStoreError, RedisUrl};

/// Pages per `DEL` round trip in [`RedisStore::clear`].
const CLEAR_PAGES_PER_CALL: u64 = 64 * RedisStore::PAGES_PER_TAG;

/// How [`RedisStore::open`] names and reaches its keys.
///
/// ```
/// use std::time::Duration;
/// use uffd_pager::store::RedisOptions;
///
/// let opts = RedisOptions {
///     prefix: "vm7".to_string(),
///     timeout: Duration::from_millis(250),
///     ..RedisOptions::default()
/// };
/// assert_eq!(opts.attempts, 3);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisOptions {
    /// The key namespace (see [`RedisStore`] for the layout).
    /// Not empty, no `{` or `}`, no control characters. Default `uffd`.
    pub prefix: String,
    /// How long connecting, and each read or write of a command, may take.
    /// Not zero, at most a day. Default 1 s.
    pub timeout: Duration,
    /// Tries per call, each on a fresh connection after the first. At
    /// least 1. Default 3.
    pub attempts: u32,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            prefix: "uffd".to_string(),
            timeout: Duration::from_secs(1),
            attempts: 3,
        }
    }
}

/// The key of page `page` in the namespace `prefix`: `{PREFIX:C}:PAGE`
/// with `C = page / 64` (see [`RedisStore`]).
///
/// ```
/// assert_eq!(uffd_pager::store::page_key("uffd", 130), "{uffd:2}:130");
/// ```
pub fn page_key(prefix: &str, page: u64) -> String {
    format!("{{{prefix}:{}}}:{page}", page / RedisStore::PAGES_PER_TAG)
}

/// A store of pages kept in Redis, one key per page.
///
/// # URLs
///
/// - `redis://HOST[:PORT][/DB]`: one server (port 6379 and database 0
///   unless given).
/// - `redis-cluster://HOST[:PORT],HOST[:PORT],...`: a cluster, reached
///   through any of the nodes listed (the rest are discovered).
///
/// IPv6 hosts go in brackets (`redis://[::1]:6390`). Passwords, TLS and
/// query options are not supported. [`RedisUrl::parse`] says what is wrong
/// with a URL.
///
/// # Key layout
///
/// Page `P` of a store (the 4096 bytes at offset `P × 4096`) is the string
/// key
///
/// ```text
/// {PREFIX:C}:P        where C = P / 64, both in decimal
/// ```
///
/// so with the default prefix `uffd`, page 0 is `{uffd:0}:0` and page 130
/// is `{uffd:2}:130` ([`page_key`] builds it). Its value is the page's
/// 4096 bytes, raw. A page never written, or last written as zeros, has no
/// key: a missing key reads as a zero page and writing an all-zero page
/// deletes the key, so a sparse object costs only its non-zero pages. A
/// value of any other length is an error (`EIO`), never a page.
///
/// The braces are a cluster hash tag: the 64 pages of a chunk `C` share
/// one hash slot (the CRC16 of `PREFIX:C`, modulo 16384), so a readahead
/// window of consecutive pages is one `MGET` on one node. Different
/// chunks spread over the cluster. A prefix may not contain braces.
///
/// # Calls
///
/// `read` is a `GET`; `read_many` one `MGET` (one per 512 pages: a
/// 2 MiB page is one). In a
/// cluster a multi-key command must stay within one hash slot, so a batch
/// across slots is one `MGET` per slot (one per 64-page chunk: a readahead
/// window is one or two). `write` is a `SET` (or `DEL`); `write_many` an
/// `MSET` of its non-zero pages and a `DEL` of its zero ones (per slot in
/// a cluster). While a slot migrates between two nodes with its keys on
/// both, a multi-key command there gets `TRYAGAIN`, and the store sends
/// that command's keys one at a time instead, each following its own
/// redirect. The commands of one call go one after another, not as a
/// pipeline, and share the try's timeout: each waits only what is left
/// of it (a pipeline's replies are read one by one, each waiting the full
/// timeout once the first timed out, so a batch to a stalled server
/// waited a timeout per page). Nothing is atomic across pages, which the
/// [`Store`] contract does not ask for: a failed batch is retried whole.
///
/// The store is not signal-safe: the engine calls it only from its I/O
/// worker threads. Each call takes an idle connection from a pool, or
/// makes one, and puts it back once it worked, so the pool grows to one
/// connection per concurrent caller. A call that fails on an I/O error, a
/// timeout, a reply it cannot parse, or a retryable server error
/// (`TRYAGAIN`, `CLUSTERDOWN`, `LOADING`, `READONLY`, a `MOVED` or `ASK`
/// the cluster client did not follow itself) closes that connection, waits 10 ms (doubling each time),
/// and tries again on a fresh connection, up to
/// [`RedisOptions::attempts`] tries within about `timeout × attempts` in
/// all (over a cluster up to about twice that: the cluster client retries
/// a timed-out reply once itself, so that it can follow a slot's `MOVED`
/// or `ASK` redirect, and finding the slots again may wait on an
/// unresponsive node); then it fails with `ETIMEDOUT` (if the last try timed out) or
/// `EIO`, and logs why through `tracing`. Once the server is back, the next
/// call connects again. A connection that failed is never reused, so a
/// late reply can never be taken for the answer to another command.
///
/// Durability is the server's (its `appendonly`/`save` settings):
/// [`Store::sync`] does nothing. Since a missing key reads as a zero page,
/// a key the server loses reads as zeros, with no error: a server
/// restarted without persistence, or one whose `maxmemory-policy` evicts
/// keys (any policy but the default `noeviction`), silently zeroes pages.
/// Give the store a server that keeps what it is given.
///
/// `MGET` answers nil for a key holding a value of another type (a list):
/// such a key in a store's namespace, written by someone else, reads as a
/// zero page where an `MGET` fetched it (and as `EIO` where a `GET` did).
///
/// # Example
///
/// ```no_run
/// use std::sync::Arc;
/// use uffd_pager::store::{RedisOptions, RedisStore, Store};
/// use uffd_pager::{MapOptions, Pager, PAGE_SIZE};
///
/// let len = 64 * PAGE_SIZE;
/// let opts = RedisOptions { prefix: "doc".to_string(), ..RedisOptions::default() };
/// let store = RedisStore::open("redis://127.0.0.1:6390", len as u64, &opts)?;
/// store.clear()?; // start from an all-zero object
/// store.write(PAGE_SIZE as u64, &[7; PAGE_SIZE])?;
/// assert_eq!(store.key(PAGE_SIZE as u64), "{doc:0}:1");
///
/// let pager = Pager::builder().build()?;
/// // SAFETY: the namespace is this example's own; no other client writes it.
/// let region = unsafe { pager.map_store(Arc::new(store), len, &MapOptions::default()) }?;
/// assert_eq!(region.as_slice()[PAGE_SIZE], 7);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RedisStore {
    shared: Arc<Shared>,
    prefix: String,
    len: u64,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.shared.url)
            .field("prefix", &self.prefix)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Pages per hash tag: pages `64 C .. 64 C + 63` share one cluster
    /// slot.
    pub const PAGES_PER_TAG: u64 = 64;

    /// A store of `len` bytes (a positive multiple of 4096) at `url`,
    /// connected once now, so that an unreachable server is an error here.
    ///
    /// Example: [`RedisStore`].
    pub fn open(url: &str, len: u64, opts: &RedisOptions) -> Result<Self, RedisStoreError> {
        RedisUrl::parse(url)?;
        urls::check_options(opts)?;
        check_len(len)?;
        let (shared, first) = connect(url, opts)?;
        shared.put_back(first);
        Ok(RedisStore {
            shared,
            prefix: opts.prefix.clone(),
            len,
        })
    }

    /// A store of `len` bytes on the same server (or cluster), with the
    /// same options and connections, under another key namespace. Cheap:
    /// nothing is connected.
    ///
    /// Example: [`RedisStore`].
    pub fn with_prefix(&self, prefix: &str, len: u64) -> Result<Self, RedisStoreError> {
        urls::check_prefix(prefix)?;
        check_len(len)?;
        Ok(RedisStore {
            shared: Arc::clone(&self.shared),
            prefix: prefix.to_string(),
            len,
        })
    }

    /// The key namespace.
    ///
    /// Example: [`RedisStore`].
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The key of the page holding byte `offset` (see [`page_key`]).
    ///
    /// Example: [`RedisStore`].
    pub fn key(&self, offset: u64) -> String {
        page_key(&self.prefix, offset / PAGE_SIZE as u64)
    }

    /// Deletes the keys of every page of this store (`len` bytes from
    /// offset 0), so that it reads as zeros; returns how many keys there
    /// were. Keys past `len` are left alone.
    ///
    /// Example: [`RedisStore`].
    pub fn clear(&self) -> Result<u64, RedisStoreError> {
        self.delete_pages(0..self.len / PAGE_SIZE as u64)
    }

    /// Deletes the keys of `pages` (page indices); returns how many there
    /// were.
    fn delete_pages(&self, pages: std::ops::Range<u64>) -> Result<u64, RedisStoreError> {
        let mut deleted = 0;
        for start in pages.clone().step_by(CLEAR_PAGES_PER_CALL as usize) {
            let end = (start + CLEAR_PAGES_PER_CALL).min(pages.end);
            // One DEL per chunk (one hash slot); a chunk whose slot is
            // migrating with its keys on two nodes (`TRYAGAIN`) is deleted
            // a key at a time.
            let chunks: Vec<Vec<String>> = (start..end)
                .step_by(Self::PAGES_PER_TAG as usize)
                .map(|tag_start| {
                    (tag_start..(tag_start + Self::PAGES_PER_TAG).min(end))
                        .map(|p| page_key(&self.prefix, p))
                        .collect()
                })
                .collect();
            let del = |keys: &[String]| {
                let mut del = ::redis::cmd("DEL");
                keys.iter().for_each(|k| {
                    del.arg(k);
                });
                del
            };
            let count = |v: Value| match v {
                Value::Int(n) => u64::try_from(n).unwrap_or(0),
                _ => 0,
            };
            deleted += self
                .shared
                .call("DEL", |c, deadline| {
                    let mut n = 0;
                    for keys in &chunks {
                        match c.query_by(&del(keys), deadline) {
                            Ok(v) => n += count(v),
                            Err(e) if pages::split_slot(&e) => {
                                for k in keys {
                                    n +=
                                        count(c.query_by(&del(std::slice::from_ref(k)), deadline)?);
                                }
                            }
                            Err(e) => return Err(e.into()),
                        }
                    }
                    Ok(n)
                })
                .map_err(|f| self.command_error(f))?;
        }
        Ok(deleted)
    }

    /// Connects to `url` once and describes the server: its version and
    /// mode, and for a cluster its state, which must be `ok`. For a probe;
    /// `opts.prefix` is not used.
    ///
    /// ```no_run
    /// use uffd_pager::store::{RedisOptions, RedisStore};
    ///
    /// let about = RedisStore::ping("redis://127.0.0.1:6390", &RedisOptions::default())?;
    /// println!("{about}"); // redis 7.0.15, standalone, at redis://127.0.0.1:6390/0
    /// # Ok::<(), uffd_pager::store::RedisStoreError>(())
    /// ```
    pub fn ping(url: &str, opts: &RedisOptions) -> Result<String, RedisStoreError> {
        let opts = RedisOptions {
            prefix: RedisOptions::default().prefix,
            ..opts.clone()
        };
        let (shared, mut conn) = connect(url, &opts)?;
        let fail = |e: ::redis::RedisError| RedisStoreError::Command {
            url: shared.url.clone(),
            message: e.to_string(),
        };
        let info = info_fields(&mut conn, ::redis::cmd("INFO").arg("server")).map_err(fail)?;
        let version = field(&info, "redis_version");
        match conn {
            Conn::Single(_) => Ok(format!(
                "redis {version}, {}, at {}",
                field(&info, "redis_mode"),
                shared.url
            )),
            Conn::Cluster(_) => {
                let cinfo =
                    info_fields(&mut conn, ::redis::cmd("CLUSTER").arg("INFO")).map_err(fail)?;
                let state = field(&cinfo, "cluster_state");
                if state != "ok" {
                    return Err(RedisStoreError::ClusterNotOk {
                        url: shared.url.clone(),
                        state: state.to_string(),
                    });
                }
                Ok(format!(
                    "redis {version}, cluster_state ok, {} masters, {} known nodes, at {}",
                    field(&cinfo, "cluster_size"),
                    field(&cinfo, "cluster_known_nodes"),
                    shared.url
                ))
            }
        }
    }
}

impl Store for RedisStore {
    fn len(&self) -> u64 {
        self.len
    }

    /// The server (its hosts resolved to addresses, a cluster's seed nodes
    /// sorted, as they were when the store was opened) and the key
    /// namespace, hashed: two stores opened on the same namespace count as
    /// one where pages wait to be written (`Pager::flush_unmapped`). The
    /// top bit is set, which no file's device number has. (Without it, a
    /// namespace opened again while its unwritten pages waited was mapped
    /// without them, read the older bytes, and the later write-back put
    /// those over its writes; and so it was when the same server was
    /// spelled another way: `localhost` for `127.0.0.1`, the seed nodes in
    /// another order.) Two different seed lists of one cluster, or two
    /// routes to one server, still count as two.
    fn identity(&self) -> Option<(u64, u64)> {
        use std::hash::{Hash, Hasher};
        let hash = |s: &str| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            s.hash(&mut h);
            h.finish()
        };
        Some((hash(&self.shared.server) | 1 << 63, hash(&self.prefix)))
    }

    /// A `GET`, or an `MGET` for more than one page.
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let first = self.first_page(offset, buf.len())?;
        self.read_pages(first, buf)
    }

    /// Reads through a buffer of up to 512 pages (`KEYS_PER_COMMAND`),
    /// one `MGET` per buffer on one server (a 2 MiB page is one).
    fn read_to_fd(
        &self,
        offset: u64,
        len: usize,
        fd: std::os::fd::BorrowedFd<'_>,
        fd_offset: u64,
    ) -> Result<(), StoreError> {
        use std::os::fd::AsRawFd;
        self.first_page(offset, len)?;
        let mut buf = vec![0u8; len.min(Self::KEYS_PER_COMMAND * PAGE_SIZE)];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(buf.len());
            self.read(offset + done as u64, &mut buf[..n])?;
            crate::sys::mem::pwrite_all(fd.as_raw_fd(), &buf[..n], fd_offset + done as u64)
                .map_err(StoreError)?;
            done += n;
        }
        Ok(())
    }

    /// A `SET`, or a `DEL` for a zero page; for more than one page (a 2 MiB
    /// page), `MSET`s and `DEL`s as for `write_many`.
    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        let first = self.first_page(offset, buf.len())?;
        let pages: Vec<(u64, &[u8])> = buf
            .chunks(PAGE_SIZE)
            .enumerate()
            .map(|(k, page)| (first + k as u64, page))
            .collect();
        self.write_pages(&pages)
    }

    fn writable(&self) -> bool {
        true
    }

    /// One `MGET` (in a cluster, one per hash slot).
    fn read_many(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.read(offset, buf)
    }

    /// An `MSET` of the non-zero pages and a `DEL` of the zero ones (in a
    /// cluster, per hash slot).
    fn write_many(&self, pages: &[(u64, &[u8])]) -> Result<(), StoreError> {
        let mut indexed = Vec::with_capacity(pages.len());
        for &(off, page) in pages {
            if page.len() != PAGE_SIZE {
                return Err(StoreError(libc::EINVAL));
            }
            indexed.push((self.first_page(off, PAGE_SIZE)?, page));
        }
        self.write_pages(&indexed)
    }

    /// Deletes the keys of the whole pages of `[offset, offset + len)`, as
    /// [`clear`](Self::clear) does (a `DEL` per 64-page chunk): the
    /// engine's swap namespaces give back the pages of a region that goes
    /// ([`Store::discard`]'s contract for a store that is not signal-safe:
    /// on an I/O worker, at release).
    /// A failure is logged; the keys stay, as they did before.
    fn discard(&self, offset: u64, len: u64) {
        let page = PAGE_SIZE as u64;
        let Some(end) = offset.checked_add(len).filter(|&e| e <= self.len) else {
            return;
        };
        let pages = offset.div_ceil(page)..end / page;
        if let Err(e) = self.delete_pages(pages) {
            tracing::warn!(prefix = %self.prefix, error = %e, "redis store: discard failed");
        }
    }

    /// Sockets, locks, allocation and logging: worker threads only.
    fn signal_safe(&self) -> bool {
        false
    }

    fn name(&self) -> &'static str {
        match self.shared.backend {
            Backend::Standalone(_) => "redis",
            Backend::Cluster(_) => "redis-cluster",
        }
    }
}

#[cfg(test)]
#[path = "redis_tests.rs"]
mod tests;
