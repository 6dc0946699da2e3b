//! Far memory on the command line: the stores that `--store URL` names
//! (`redis://HOST:PORT[/DB]`, `redis-cluster://HOST:PORT,...`), each run
//! under a key namespace of its own that is deleted when the run ends, and
//! a plain client that reads pages back without the pager, to check what
//! the pager wrote.

use crate::os::interrupt::{self, OnInterrupt};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};
use uffd_pager::store::{page_key, RedisOptions, RedisStore, RedisUrl, Store, MAX_BATCH};
use uffd_pager::{Error, Result, PAGE_SIZE};

/// A store URL as given to `--store`, checked when parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreUrl(pub String);

impl FromStr for StoreUrl {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        RedisUrl::parse(s).map_err(|e| e.to_string())?;
        Ok(StoreUrl(s.to_string()))
    }
}

impl std::fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn store_error(context: String) -> impl Fn(uffd_pager::store::RedisStoreError) -> Error {
    move |e| Error::Io {
        context: context.clone(),
        source: std::io::Error::other(e.to_string()),
    }
}

/// One run's namespace on a Redis server or cluster: every store made
/// under it is named `uffd-WHAT-PID-N:NAME` and deleted when the `Far`
/// drops, or when a signal ends the run ([`interrupt`]).
pub struct Far {
    root: RedisStore,
    url: StoreUrl,
    made: Made,
    next: AtomicU64,
    _on_interrupt: OnInterrupt,
}

/// The stores made in a namespace: each one's prefix and length, and for
/// a swap store, the store itself, weakly: once the engine has let it go
/// (its region released, its pages discarded: `Store::discard`), its keys
/// are gone and it leaves the list.
type Made = Arc<Mutex<Vec<(String, u64, Option<Weak<RedisStore>>)>>>;

/// Deletes the keys of the stores `made`, over `root`'s connections;
/// returns how many keys there were.
fn delete_made(root: &RedisStore, made: &[(String, u64)]) -> u64 {
    let mut deleted = 0;
    for (prefix, len) in made {
        match root.with_prefix(prefix, *len).and_then(|s| s.clear()) {
            Ok(n) => deleted += n,
            Err(e) => tracing::warn!("could not delete the keys of {prefix}: {e}"),
        }
    }
    deleted
}

/// The stores in `made` now, but swap stores the engine let go.
fn snapshot(made: &Made) -> Vec<(String, u64)> {
    let l = made.lock().unwrap_or_else(|e| e.into_inner());
    l.iter()
        .filter(|(_, _, swap)| swap.as_ref().is_none_or(|w| w.strong_count() > 0))
        .map(|(prefix, len, _)| (prefix.clone(), *len))
        .collect()
}

/// For a run a signal ends: deletes the namespace's keys while the run's
/// threads still go on, so again (up to five passes in all) while a pass
/// finds keys that were written during the one before.
fn delete_on_interrupt(root: &RedisStore, made: &Made) {
    for _ in 0..5 {
        if delete_made(root, &snapshot(made)) == 0 {
            return;
        }
    }
}

impl std::fmt::Debug for Far {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Far")
            .field("url", &self.url)
            .field("prefix", &self.root.prefix())
            .finish_non_exhaustive()
    }
}

impl Far {
    /// Connects to `url` (an unreachable server is an error here) under a
    /// fresh namespace for `what` (the workload's name).
    pub fn open(url: &StoreUrl, what: &str) -> Result<Far> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let opts = RedisOptions {
            prefix: format!("uffd-{what}-{}-{nanos:x}", std::process::id()),
            ..RedisOptions::default()
        };
        let root = RedisStore::open(&url.0, PAGE_SIZE as u64, &opts)
            .map_err(store_error(format!("opening the store {url}")))?;
        let made = Made::default();
        // A handle on the same connections, for the signal's cleanup.
        let handle = root
            .with_prefix(root.prefix(), PAGE_SIZE as u64)
            .map_err(store_error(format!("opening the store {url}")))?;
        let on_interrupt = interrupt::on_interrupt({
            let made = made.clone();
            move || delete_on_interrupt(&handle, &made)
        });
        Ok(Far {
            root,
            url: url.clone(),
            made,
            next: AtomicU64::new(0),
            _on_interrupt: on_interrupt,
        })
    }

    /// The URL.
    pub fn url(&self) -> &StoreUrl {
        &self.url
    }

    /// An empty store of `pages` pages named `name` in this namespace.
    pub fn store(&self, name: &str, pages: usize) -> Result<RedisStore> {
        let s = self.unlisted(name, pages)?;
        self.list(&s, None);
        Ok(s)
    }

    /// [`store`](Self::store), not yet in the list.
    fn unlisted(&self, name: &str, pages: usize) -> Result<RedisStore> {
        let prefix = format!("{}:{name}", self.root.prefix());
        let len = (pages.max(1) * PAGE_SIZE) as u64;
        self.root
            .with_prefix(&prefix, len)
            .map_err(store_error(format!("a store named {prefix:?}")))
    }

    /// Lists `s` for deletion when the run ends; a swap store with itself
    /// (`swap`). Swap stores the engine has let go leave the list here:
    /// a writer thread maps and unmaps anonymous regions thousands of
    /// times a second, each with a swap store of its own, and every one
    /// listed for good made the list grow for the whole run and its end a
    /// `DEL` per region ever mapped (minutes, after a signal too).
    fn list(&self, s: &RedisStore, swap: Option<Weak<RedisStore>>) {
        let mut l = self.made.lock().unwrap_or_else(|e| e.into_inner());
        l.retain(|(_, _, swap)| swap.as_ref().is_none_or(|w| w.strong_count() > 0));
        l.push((s.prefix().to_string(), s.len(), swap));
    }

    /// A store of `pages` pages whose byte at offset `o` is `byte(o)`,
    /// written in batches (one pipeline per [`MAX_BATCH`] pages).
    pub fn filled(
        &self,
        name: &str,
        pages: usize,
        byte: impl Fn(usize) -> u8,
    ) -> Result<RedisStore> {
        let s = self.store(name, pages)?;
        let mut buf = vec![0u8; MAX_BATCH * PAGE_SIZE];
        for first in (0..pages).step_by(MAX_BATCH) {
            let n = MAX_BATCH.min(pages - first);
            for (k, b) in buf[..n * PAGE_SIZE].iter_mut().enumerate() {
                *b = byte(first * PAGE_SIZE + k);
            }
            let batch: Vec<(u64, &[u8])> = buf[..n * PAGE_SIZE]
                .chunks(PAGE_SIZE)
                .enumerate()
                .map(|(k, p)| (((first + k) * PAGE_SIZE) as u64, p))
                .collect();
            s.write_many(&batch).map_err(|e| Error::Io {
                context: format!("filling {name} on {}", self.url),
                source: std::io::Error::from_raw_os_error(e.0),
            })?;
        }
        Ok(s)
    }

    /// A maker for [`uffd_pager::PagerBuilder::swap_to`]: each anonymous
    /// region swaps to a store of its own in this namespace.
    pub fn swap_maker(
        self: &Arc<Self>,
    ) -> impl Fn(usize) -> std::io::Result<Arc<dyn Store>> + Send + Sync + 'static {
        let far = self.clone();
        move |len| {
            let n = far.next.fetch_add(1, Relaxed);
            let s = far
                .unlisted(&format!("swap{n}"), len.div_ceil(PAGE_SIZE))
                .map(Arc::new)
                .map_err(std::io::Error::other)?;
            far.list(&s, Some(Arc::downgrade(&s)));
            Ok(s as Arc<dyn Store>)
        }
    }

    /// Reads every page of `store` back with a plain client (no pager, no
    /// `RedisStore`): one `MGET` of each hash tag's keys; a missing key is
    /// a zero page.
    pub fn read_back(&self, store: &RedisStore) -> Result<Vec<u8>> {
        read_back(&self.url, store.prefix(), store.len() as usize / PAGE_SIZE)
    }
}

impl Drop for Far {
    fn drop(&mut self) {
        // The list stays whole until the keys are gone: a signal that comes
        // meanwhile deletes them too (with the list taken first, it found
        // nothing to delete and ended the process midway).
        let made = snapshot(&self.made);
        delete_made(&self.root, &made);
        self.made.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

/// A plain client's connection to `url` (the redis crate's own client, no
/// pager, no `RedisStore`): for read-backs and for the benches' floors.
pub fn plain_connection(
    url: &StoreUrl,
) -> std::result::Result<Box<dyn redis::ConnectionLike>, String> {
    let timeout = std::time::Duration::from_secs(5);
    // (`client_urls`: an IPv6 host goes in brackets, which a URL made
    // here from the host and port lacked, so `[::1]` could not be read.)
    let parsed = RedisUrl::parse(&url.0).map_err(|e| e.to_string())?;
    let urls = parsed.client_urls();
    match parsed {
        RedisUrl::Standalone { .. } => {
            let c = redis::Client::open(urls[0].as_str()).map_err(|e| e.to_string())?;
            let con = c
                .get_connection_with_timeout(timeout)
                .map_err(|e| e.to_string())?;
            con.set_read_timeout(Some(timeout))
                .map_err(|e| e.to_string())?;
            Ok(Box::new(con))
        }
        RedisUrl::Cluster { .. } => {
            let c = redis::cluster::ClusterClient::builder(urls)
                .connection_timeout(timeout)
                .response_timeout(timeout)
                .build()
                .map_err(|e| e.to_string())?;
            Ok(Box::new(c.get_connection().map_err(|e| e.to_string())?))
        }
    }
}

/// Reads pages `0..pages` of namespace `prefix` at `url` with a plain
/// client (see [`Far::read_back`]).
pub fn read_back(url: &StoreUrl, prefix: &str, pages: usize) -> Result<Vec<u8>> {
    let fail = |m: String| Error::Io {
        context: format!("reading {prefix} back from {url} with a plain client"),
        source: std::io::Error::other(m),
    };
    let mut con = plain_connection(url).map_err(fail)?;
    let mut out = vec![0u8; pages * PAGE_SIZE];
    let per = RedisStore::PAGES_PER_TAG as usize;
    for first in (0..pages).step_by(per) {
        let n = per.min(pages - first);
        let keys: Vec<String> = (first..first + n)
            .map(|p| page_key(prefix, p as u64))
            .collect();
        let vals: Vec<Option<Vec<u8>>> = redis::cmd("MGET")
            .arg(&keys)
            .query(&mut *con)
            .map_err(|e| fail(e.to_string()))?;
        for (k, v) in vals.into_iter().enumerate() {
            if let Some(v) = v {
                if v.len() != PAGE_SIZE {
                    return Err(fail(format!(
                        "{} holds {} bytes, not a page",
                        keys[k],
                        v.len()
                    )));
                }
                out[(first + k) * PAGE_SIZE..(first + k + 1) * PAGE_SIZE].copy_from_slice(&v);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Swap stores the engine let go leave the namespace's list, which
    /// stays as short as the stores alive (it grew by one for every
    /// anonymous region a run ever mapped, and the run's end deleted each).
    /// Against `UFFD_REDIS_URL` (default `redis://127.0.0.1:6390`, `make
    /// redis-up`); `UFFD_SKIP_REDIS=1` skips it.
    #[test]
    fn swap_stores_let_go_leave_the_list() {
        if std::env::var_os("UFFD_SKIP_REDIS").is_some_and(|v| v == "1") {
            return;
        }
        let url =
            std::env::var("UFFD_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6390".into());
        let far = Arc::new(Far::open(&StoreUrl(url), "listtest").unwrap());
        let data = far.store("data", 1).unwrap();
        let make = far.swap_maker();
        let kept = make(PAGE_SIZE).unwrap();
        for _ in 0..1000 {
            drop(make(PAGE_SIZE).unwrap());
        }
        // The data store and the live swap store; in the list, at most the
        // last one let go beside them (it leaves at the next listing).
        let listed = snapshot(&far.made);
        assert_eq!(listed.len(), 2, "{listed:?}");
        assert_eq!(listed[0].0, data.prefix());
        let len = far.made.lock().unwrap().len();
        assert!(len <= 3, "{len} stores listed");
        drop(kept);
    }

    /// An IPv6 server's URL reaches the connection (refused here: nothing
    /// listens on port 1). It was made without the brackets, so the redis
    /// crate could not read it, for a server and for a cluster's node.
    #[test]
    fn a_plain_connection_to_an_ipv6_server_is_tried() {
        for url in ["redis://[::1]:1", "redis-cluster://[::1]:1"] {
            let e = plain_connection(&StoreUrl(url.into()))
                .err()
                .expect("nothing listens on port 1");
            assert!(e.to_lowercase().contains("refused"), "{url}: {e}");
        }
    }
}
