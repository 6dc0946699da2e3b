//! What a pager's regions keep alive, and the order it stops in.

use crate::address_space::Mm;
use crate::delivery::sigbus;
use crate::delivery::threads::HandlerPool;
use std::sync::Arc;

/// What a pager's regions keep alive: the address space and its delivery.
#[derive(Debug)]
pub(crate) struct PagerInner {
    pub(crate) mm: Arc<Mm>,
    pub(super) pool: Option<HandlerPool>,
    pub(super) kswapd: Option<std::thread::JoinHandle<()>>,
    pub(super) ra_threads: Vec<std::thread::JoinHandle<()>>,
    /// khugepaged ([`crate::collapse`]), started with the first
    /// kernel-mapped object that can have huge folios.
    pub(super) khugepaged: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
    pub(super) io_threads: Vec<std::thread::JoinHandle<()>>,
    /// The release thread ([`crate::events::release`]).
    pub(super) release: Option<std::thread::JoinHandle<()>>,
    /// In the SIGBUS handler's registry.
    pub(super) in_registry: bool,
}

impl PagerInner {
    /// Starts khugepaged unless it runs already.
    pub(super) fn start_khugepaged(&self) -> std::io::Result<()> {
        let mut k = self.khugepaged.lock().unwrap_or_else(|e| e.into_inner());
        if k.is_none() {
            *k = Some(crate::collapse::start_khugepaged(&self.mm)?);
        }
        Ok(())
    }

    /// khugepaged's handle, taken.
    fn khugepaged_handle(&mut self) -> Option<std::thread::JoinHandle<()>> {
        self.khugepaged
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }
}

impl Drop for PagerInner {
    fn drop(&mut self) {
        // On the application's thread (a `Pager`'s drop, or the last
        // region's or owned residency guard's): the release's store writes
        // and the joins below are cancellation points, and a cancel acting
        // there stopped the teardown halfway (or, from C, aborted).
        // (Cancellation only: no region is left for a signal handler to
        // fault on, and SIGINT must not wait for a slow store.)
        let _no_cancel = crate::sys::thread::NoCancel::new();
        // A fork()ed child has none of the engine's threads to stop: joining
        // them would wait forever. Its copy of the state is left as it is.
        if self.mm.in_child() {
            std::mem::forget(self.pool.take());
            std::mem::forget(self.kswapd.take());
            std::mem::forget(std::mem::take(&mut self.ra_threads));
            std::mem::forget(self.khugepaged_handle());
            std::mem::forget(std::mem::take(&mut self.io_threads));
            std::mem::forget(self.release.take());
            return;
        }
        // What the release thread holds is released first (it may keep
        // objects, which go just below); later events' objects are
        // released by the threads that apply them.
        if let Some(t) = self.release.take() {
            crate::events::release::stop(&self.mm);
            let _ = t.join();
        }
        // Objects kept cached after their regions went (`crate::kept`):
        // written back already, released while reclaim and the I/O
        // workers still run.
        if self.mm.release_each(self.mm.kept.drain()).is_err() {
            tracing::error!(
                "releasing an object kept over a store panicked (the object is leaked)"
            );
        }
        // Dirty pages of unmapped regions their store refused
        // (`crate::unwritten`): a last try, while the workers run.
        use crate::unwritten::Which::All;
        if let Err(e) = self.mm.flush_unwritten(All) {
            for obj in self.mm.unwritten.over(All) {
                tracing::error!(
                    store = obj.store.name(),
                    pages = crate::unwritten::dirty_pages(&obj),
                    error = %e,
                    "dirty pages lost: their store refused them until the pager was dropped"
                );
            }
        }
        // Stop delivery before the address space goes: join the handler
        // threads, or leave the SIGBUS registry (waiting out running faults).
        if let Some(k) = self.kswapd.take() {
            crate::reclaim::stop_kswapd(&self.mm);
            let _ = k.join();
        }
        if let Some(t) = self.khugepaged_handle() {
            crate::collapse::stop_khugepaged(&self.mm);
            let _ = t.join();
        }
        if !self.ra_threads.is_empty() {
            crate::readahead::stop(&self.mm);
            for t in self.ra_threads.drain(..) {
                let _ = t.join();
            }
        }
        self.pool.take();
        if let Some(p) = self.mm.per_region.get() {
            p.close_all();
        }
        // Workers last: anything above may have waited on them. A worker
        // stuck in a store call that never returns is left behind (its
        // requests were abandoned already).
        self.mm.io.stop();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        for t in self.io_threads.drain(..) {
            while !t.is_finished() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            if t.is_finished() {
                let _ = t.join();
            }
        }
        if self.in_registry {
            sigbus::unregister(&self.mm);
        }
    }
}
