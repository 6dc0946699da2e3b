//! Where an interposed `mmap` goes: left to the kernel, refused, or
//! mapped by the pager (a file's mapping over a store of the file, or
//! anonymous memory), and what a `MAP_FIXED` over pager mappings writes
//! back first.

use super::{
    any_writable, fd_file, kernel_writes, open_flags, overlapping, pages_len, state, write_sealed,
    Entry, State, ANON_MIN, PAGE, PASSED, REFUSED,
};
use engine::{InstallKind, MapOptions};
use std::ffi::{c_int, c_void};
use std::ops::Range;
use std::sync::atomic::Ordering::Relaxed;

/// Whether all of `pieces` lie in `over` (a `MAP_FIXED` range that
/// replaces them).
pub(super) fn covered(pieces: &[Range<usize>], over: Option<&Range<usize>>) -> bool {
    over.is_some_and(|o| pieces.iter().all(|p| o.start <= p.start && p.end <= o.end))
}

/// The refusal of a second mapping of a file mapped writable and shared
/// (`name`): `ENODEV`, and a message naming `UFFD_PAGER_FILES`.
pub(super) fn refuse_second(st: &mut State, name: &str) -> Option<*mut c_void> {
    REFUSED.fetch_add(1, Relaxed);
    st.say(format!(
        "refusing a second mapping of {name}: a file mapped writable and shared can have \
         one mapping only where the pager maps it (the pager keeps a cache per mapping, the \
         kernel another); exclude it from UFFD_PAGER_FILES to let the kernel map it"
    ));
    crate::set_errno(libc::ENODEV);
    Some(libc::MAP_FAILED)
}

/// [`mmap`](super::mmap)'s decision, before the refusal of a writable shared kernel
/// mapping beside a pager mapping.
pub(super) fn place(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> Option<*mut c_void> {
    // The kernel's too: `MAP_32BIT` (an address below 4 GiB, which the
    // engine does not choose), `MAP_SYNC` and any map type but shared or
    // private (`MAP_SHARED_VALIDATE` checks flags the shim does not know:
    // the kernel refuses `MAP_SYNC` on a file that is not DAX, and libpmem
    // reads that refusal as "call msync"; mapped here, it stopped).
    let skip = libc::MAP_HUGETLB
        | libc::MAP_GROWSDOWN
        | libc::MAP_STACK
        | libc::MAP_32BIT
        | libc::MAP_SYNC;
    let map_type = flags & libc::MAP_TYPE;
    let anon = flags & libc::MAP_ANONYMOUS != 0;
    if len == 0
        || prot & libc::PROT_EXEC != 0
        || prot & libc::PROT_READ == 0
        || flags & skip != 0
        || (map_type != libc::MAP_SHARED && map_type != libc::MAP_PRIVATE)
    {
        // The kernel's, but a mapping of a file reads the file: what was
        // stored through the pager's writable mapping of it goes first
        // (a PROT_EXEC one showed the older bytes).
        if !anon && fd >= 0 && any_writable() {
            let mut guard = state();
            if let (Some(st), Some((_, id, _))) = (guard.as_mut(), fd_file(fd)) {
                write_back_before_a_mapping(st, id);
            }
        }
        return None;
    }
    let shared = map_type == libc::MAP_SHARED;
    let write = prot & libc::PROT_WRITE != 0;
    let fixed = flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE) != 0;
    // (A fixed anonymous mapping is the kernel's: the engine places
    // anonymous regions itself. So is a read-only one: the engine's
    // anonymous regions are writable, and zeros need no pager. Decided
    // before the table's lock: an allocator's own mmap, made under its
    // lock, must not wait for ours; see `spans`.)
    if anon && (shared || fixed || !write || len < ANON_MIN.load(Relaxed)) {
        return None;
    }
    let mut guard = state();
    let st = guard.as_mut()?;
    let mut opts = MapOptions {
        writable: write,
        populate: flags & libc::MAP_POPULATE != 0,
        pinned: flags & libc::MAP_LOCKED != 0,
        ..MapOptions::default()
    };
    if fixed {
        if !(addr as usize).is_multiple_of(PAGE) {
            return None; // the kernel's EINVAL
        }
        opts.fixed_addr = Some(addr as usize);
    }
    // (A length that rounds past the address space is the kernel's:
    // ENOMEM.)
    let rlen = pages_len(len)?;
    let entry = if anon {
        // (`MAP_POPULATE` and `MAP_LOCKED` are in `opts`; what is left to
        // the kernel was decided above.)
        let made = st
            .pager()
            .and_then(|p| p.map_anonymous_with(rlen, &opts).map_err(|e| e.to_string()));
        (made, None, 0, "anonymous memory".to_string(), true, None)
    } else {
        if st.cfg.files.is_empty() || fd < 0 {
            return None;
        }
        let (path, id, size) = fd_file(fd)?;
        // A new mapping of a file the pager maps writable and shared is the
        // kernel's, or refused (one pager mapping per such file), and the
        // kernel's reads the file: what was stored through the pager's
        // mapping is written back first, or it shows the older bytes (a
        // writable MAP_PRIVATE one, beside the pager's or over it with
        // MAP_FIXED, showed them every time).
        if any_writable() {
            write_back_before_a_mapping(st, id);
        }
        if !st.cfg.wants_path(&path) {
            return None;
        }
        let fl = open_flags(fd);
        if fl < 0 || fl & libc::O_PATH != 0 || fl & libc::O_ACCMODE == libc::O_WRONLY {
            // The kernel's EACCES (EBADF for O_PATH): a mapping must read
            // its file. Made here, its store could read nothing, and the
            // first touch was SIGBUS.
            return None;
        }
        let sealed = write_sealed(fd);
        if shared && write && sealed {
            // The kernel's EPERM: a memfd sealed against writes. (Its
            // store, an open file of its own, would take the writes until
            // the first write-back failed.)
            return None;
        }
        if shared && write && fl & libc::O_ACCMODE != libc::O_RDWR {
            // The kernel's EACCES: stores through it would write a file
            // the descriptor may not write. (Its store opens the file
            // again, for writing if the mode allows it.)
            return None;
        }
        let name = path.to_string_lossy().into_owned();
        if !shared && write {
            // A private writable mapping would be a snapshot that write(2)
            // to the file could not reach: the kernel keeps it.
            PASSED.fetch_add(1, Relaxed);
            st.say(format!(
                "{name}: a writable MAP_PRIVATE mapping is left to the kernel"
            ));
            return None;
        }
        if off < 0 || !(off as usize).is_multiple_of(PAGE) {
            return None; // the kernel's EINVAL
        }
        // (An end past 2^64 is the kernel's error: ENOMEM.)
        let end = (off as u64).checked_add(rlen as u64)?;
        if end > size.div_ceil(PAGE as u64) * PAGE as u64 {
            PASSED.fetch_add(1, Relaxed);
            st.say(format!(
                "{name}: a mapping past the end of the file is left to the kernel"
            ));
            return None;
        }
        let over =
            fixed.then(|| overlapping(st, addr as usize, (addr as usize).saturating_add(rlen)));
        if let Some(over) = over.filter(|o| !o.is_empty()) {
            // Over a pager mapping: the engine maps only into a free range,
            // so the kernel maps it (the engine follows the unmap through
            // its event). Refused as a second mapping of the file below, a
            // program's map of its file over its own mapping was ENODEV.
            // What was stored through a mapping it covers is written back
            // first: the kernel's new mapping of the file reads the file,
            // and the write-back that follows the event came after that
            // read now and then (the old bytes showed).
            write_back_covered(st, &over, "a MAP_FIXED over it");
            return None;
        }
        st.prune();
        let clash = st
            .maps
            .iter()
            .any(|e| e.file == Some(id) && (e.writable_shared || (shared && write)));
        if clash {
            return refuse_second(st, &name);
        }
        // A writable shared mapping of the kernel's keeps the file in its
        // page cache, which the pager's would not see (nor it the pager's):
        // with no pager mapping of the file, the kernel's cache is its
        // only one, and the new mapping is the kernel's too.
        let over = fixed.then(|| addr as usize..(addr as usize).saturating_add(rlen));
        if kernel_writes(id, over.as_ref()) {
            st.say(format!(
                "{name}: the kernel maps it writable and shared already: this mapping is left \
                 to the kernel too"
            ));
            return None;
        }
        // A read-only shared mapping of a descriptor opened for writing may
        // be made writable later (the kernel allows `mprotect(PROT_WRITE)`
        // there), so its store takes writes from the start; its pages go in
        // write-protected all the same, so the first write to each faults
        // and marks it dirty.
        let rdwr = fl & libc::O_ACCMODE == libc::O_RDWR && !sealed;
        let may_write = shared && (write || rdwr && st.cfg.kind == InstallKind::Shared);
        opts.kind = Some(if may_write {
            InstallKind::Shared
        } else {
            st.cfg.kind
        });
        // A fixed range is held before the store opens and the pager
        // starts: both map memory of their own, which the kernel may put in
        // a range the program has just freed, and the kernel's MAP_FIXED
        // after the engine's overlap would then have replaced the engine's
        // memory (`engine::AddressHold`). A range where something is mapped
        // is the kernel's to map over (MAP_FIXED) or refuse (EEXIST).
        let hold = fixed.then(|| engine::AddressHold::new(addr as usize, rlen));
        let _hold = match hold.transpose() {
            Ok(h) => h,
            Err(e) => {
                PASSED.fetch_add(1, Relaxed);
                st.say(format!("{name}: left to the kernel: {e}"));
                return None;
            }
        };
        let latency = st.cfg.latency;
        let mut unwritten = false;
        let mut kept = None;
        let made =
            crate::maps::file_store(fd, off as u64, rlen, may_write, latency).and_then(|s| {
                kept = shared.then(|| s.clone());
                st.pager()
                    // SAFETY: the program reaches the region's bytes through raw pointers only,
                    // and the shim makes no Rust slice of them: a file changed behind the
                    // engine shows its new bytes, as under the kernel's mmap, without breaking
                    // a Rust reference.
                    .and_then(|p| {
                        unsafe { p.map_store(s, rlen, &opts) }.map_err(|e| {
                            unwritten = matches!(e, engine::Error::UnwrittenPages { .. });
                            e.to_string()
                        })
                    })
            });
        if let (true, Err(e)) = (unwritten, &made) {
            // Pages an earlier mapping of the file stored, which the file
            // still refuses: a kernel mapping would show the older bytes,
            // and the engine would later write them over its writes.
            let msg = format!("{name}: refusing the mapping: {e}");
            st.say(msg);
            crate::set_errno(libc::EIO);
            return Some(libc::MAP_FAILED);
        }
        (made, Some(id), off as u64, name, may_write, kept)
    };
    let (made, file, base, path, may_write, shared_store) = entry;
    // (A map that failed took its hold over, or dropped it above: the
    // range is free again for the kernel's call.)
    match made {
        Ok(region) => Some(st.add(Entry {
            region,
            file,
            base,
            writable_shared: shared && write && file.is_some(),
            may_write,
            kernel_writable: false,
            shared_store,
            cap: rlen,
            path,
            span: None,
        })),
        Err(e) => {
            PASSED.fetch_add(1, Relaxed);
            st.say(format!("{path}: left to the kernel: {e}"));
            None
        }
    }
}

/// Writes back the writable shared ones of the entries `over` (indices
/// first) before `what` covers them; failures are said on stderr.
pub(super) fn write_back_covered(st: &mut State, over: &[(usize, Vec<Range<usize>>)], what: &str) {
    for &(i, _) in over {
        if st.maps[i].writable_shared {
            if let Err(err) = st.maps[i].region.flush() {
                let msg = format!(
                    "{}: write-back before {what} failed: {err}",
                    st.maps[i].path
                );
                st.say(msg);
            }
        }
    }
}

/// Writes back the pager's writable shared mappings of file `id` before
/// a new mapping of it (see `mmap`); failures are said on stderr.
pub(super) fn write_back_before_a_mapping(st: &mut State, id: (u64, u64)) {
    st.prune();
    let failed: Vec<String> = st
        .maps
        .iter()
        .filter(|e| e.writable_shared && e.file == Some(id))
        .filter_map(|e| {
            let err = e.region.flush().err()?;
            Some(format!(
                "{}: write-back before a mapping of it failed: {err}",
                e.path
            ))
        })
        .collect();
    for m in failed {
        st.say(m);
    }
}
