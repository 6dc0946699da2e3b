//! The calls on pager memory the engine serves besides `mmap` and
//! `munmap`: `mremap`, `mprotect` (and `pkey_mprotect`), `msync` and
//! `madvise`.

use super::*;

/// mremap of a whole pager mapping goes through the engine; of part of
/// one (or a length of 0, which duplicates a shared mapping) is refused
/// (EINVAL): the kernel would move or copy the part with its
/// userfaultfd registration, and the engine, which follows only whole
/// regions, has no region there, so each touch of it was SIGSEGV (and a
/// writable shared mapping's write-back could not follow it). Anything
/// else is the kernel's.
pub fn mremap(
    old: usize,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new: usize,
) -> Option<*mut c_void> {
    // (A length that rounds past the address space is the kernel's.)
    let old_len = pages_len(old_len)?;
    let new_len_r = pages_len(new_len)?;
    // (What is not the pager's is moved by the kernel, wherever it goes.)
    if !spans::may_be_ours(old, old.saturating_add(old_len.max(1))) {
        return None;
    }
    let mut guard = state();
    let st = guard.as_mut()?;
    let fail = |e: c_int| {
        crate::set_errno(e);
        Some(libc::MAP_FAILED)
    };
    // (Pruned first: the indices below stay those of the table.)
    st.prune();
    let Some(mut i) = whole(st, old, old_len) else {
        let touched = overlapping(st, old, old.saturating_add(old_len.max(1)));
        if let Some(&(i, _)) = touched.first() {
            REFUSED.fetch_add(1, Relaxed);
            let msg = format!(
                "{}: refusing an mremap of part of the mapping (EINVAL): the pager moves whole \
             mappings only",
                st.maps[i].path
            );
            st.say(msg);
            return fail(libc::EINVAL);
        }
        return None;
    };
    let known = libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP;
    if flags & !known != 0 {
        // The kernel's answer to a flag it does not know (the engine's
        // move took it for a plain one).
        return fail(libc::EINVAL);
    }
    if flags & libc::MREMAP_DONTUNMAP != 0 || new_len == 0 || st.maps[i].kernel_writable {
        return fail(libc::EINVAL);
    }
    let may_move = flags & libc::MREMAP_MAYMOVE != 0;
    if flags & libc::MREMAP_FIXED != 0 && !may_move {
        return fail(libc::EINVAL); // as the kernel answers
    }
    if new_len_r > old_len && !may_move {
        return fail(libc::ENOMEM); // growing in place is not offered
    }
    let to = (flags & libc::MREMAP_FIXED != 0).then_some(new);
    if to.is_some_and(|t| t < old.saturating_add(old_len) && old < t.saturating_add(new_len_r)) {
        // The kernel's answer to a target over the mapping itself (the
        // engine's was EEXIST, which mremap never gives).
        return fail(libc::EINVAL);
    }
    // The kernel's move replaces whatever is mapped at the target (a range
    // the program reserved for it, as a rule); the engine's moves only
    // into a free range (`EEXIST`, which mremap never answers). The
    // program's own memory there is replaced by the engine, once the
    // move's checks have passed (a refused move, a growth past the end of
    // the file, leaves it as it was: unmapped before the engine's call, it
    // was gone then). Pager mappings there go first, written back (their
    // pieces in the target replaced by the kernel, in one step, with
    // reserved memory the engine's move replaces in turn; the engine
    // follows through its events), once the engine's own check of the
    // length has passed here.
    let fixed_to = to.filter(|t| t.is_multiple_of(PAGE) && *t != 0);
    if let Some(t) = fixed_to {
        let target = t..t.saturating_add(new_len_r);
        let over = overlapping(st, target.start, target.end);
        // (`overlapping` pruned the table again: an entry an event of
        // another thread's call removed meanwhile moved the indices, and
        // `i` named another mapping, or none: found by review. Gone whole,
        // the range is the kernel's to answer for; in part, it is refused
        // as above.)
        i = match whole(st, old, old_len) {
            Some(i) => i,
            None if overlapping(st, old, old.saturating_add(old_len.max(1))).is_empty() => {
                return None
            }
            None => return fail(libc::EINVAL),
        };
        if !over.is_empty() {
            if new_len_r > st.maps[i].cap {
                return fail(libc::EINVAL); // as the engine answers below
            }
            write_back_covered(st, &over, "an mremap onto it");
            for p in over.iter().flat_map(|(_, pieces)| pieces) {
                let (a, b) = (p.start.max(target.start), p.end.min(target.end));
                if a < b {
                    let flags = libc::MAP_PRIVATE
                        | libc::MAP_ANONYMOUS
                        | libc::MAP_FIXED
                        | libc::MAP_NORESERVE;
                    let none = libc::PROT_NONE;
                    // SAFETY: replaces pager memory the program asked the
                    // move to replace (MREMAP_FIXED).
                    let r = unsafe { sys::mmap(a as *mut c_void, b - a, none, flags, -1, 0) };
                    if r == libc::MAP_FAILED {
                        return fail(crate::errno());
                    }
                }
            }
        }
    }
    let e = &mut st.maps[i];
    let r = match fixed_to {
        Some(t) => {
            // SAFETY: the program asked for this range to be replaced by
            // the move (MREMAP_FIXED).
            unsafe { e.region.remap_over(new_len_r, t) }
        }
        _ => e.region.remap_to(new_len_r, to),
    };
    // Where the region is now: moved on success, and also where the kernel
    // moved it but the engine could not register it (see `remap_to`).
    let s = e.region.as_ptr() as usize;
    spans::set(e.span, s..s + e.region.len());
    match r {
        Ok(()) => Some(s as *mut c_void),
        Err(err) => fail(err.errno()),
    }
}

/// mprotect (and pkey_mprotect with `pkey`) of a whole pager mapping, to
/// `PROT_READ` with or without `PROT_WRITE`, goes through the engine;
/// anything else on pager memory is the kernel's, called here under the
/// table's lock, so the entries' flags follow what it did. `PROT_WRITE` on
/// a mapping whose store takes no writes (`Entry::may_write`) is `EACCES`,
/// as the kernel answers for a file opened read-only, and so is making a
/// file mapping writable while the pager maps that file elsewhere too
/// (each mapping has its own cache: the other would not see the writes;
/// the kernel allows it).
pub fn mprotect(addr: usize, len: usize, prot: c_int, pkey: Option<c_int>) -> Option<c_int> {
    // The kernel's: a call that changes nothing (length 0) or that it
    // refuses before it changes anything (an unaligned start, an end past
    // the top). Taken here, each marked the mappings it met writable.
    let rlen = pages_len(len)?;
    let end = kernel_range(addr, rlen)?;
    // Nor a protection it refuses first: an unknown bit, or
    // `PROT_GROWSDOWN`/`PROT_GROWSUP`, which no pager mapping (never a
    // stack) takes. Taken here as a plain `PROT_READ`, each was answered 0.
    // (`PROT_SEM`, 0x8 in `asm-generic/mman-common.h`, which `libc` does
    // not name: the kernel accepts it and ignores it on x86-64.)
    let known = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC | 0x8;
    if prot & !known != 0 {
        return None;
    }
    let write = prot & libc::PROT_WRITE != 0;
    // (Made writable, the kernel's mapping of a file the pager maps is
    // refused below: that needs the table, where the range has a shared
    // file mapping at all.)
    if !(spans::may_be_ours(addr, end)
        || write && any_file() && spans::shared_file_map_in(addr, end))
    {
        return None;
    }
    let mut guard = state();
    let st = guard.as_mut()?;
    let hits = overlapping(st, addr, end);
    if hits.is_empty() {
        if write && any_file() {
            // A shared mapping of the kernel's made writable while the
            // pager maps its file: the kernel's page cache and the
            // pager's would be two copies of the file.
            let range = addr..end;
            let paged = kernel_shared_maps().into_iter().find_map(|k| {
                let over = k.range.start < range.end && range.start < k.range.end;
                let e = st.maps.iter().find(|e| e.file.is_some_and(|id| k.is(id)))?;
                over.then(|| e.path.clone())
            });
            if let Some(path) = paged {
                return refuse_writable(st, &path, "the pager maps the file");
            }
        }
        return None;
    }
    if write {
        for &(i, _) in &hits {
            let e = &st.maps[i];
            if !e.may_write {
                crate::set_errno(libc::EACCES);
                return Some(-1);
            }
            if e.writable_shared {
                continue;
            }
            let Some(id) = e.file else { continue };
            let why = if st
                .maps
                .iter()
                .enumerate()
                .any(|(j, o)| j != i && o.file == Some(id))
            {
                "the file has another pager mapping"
            } else if kernel_writes(id, None) {
                "the kernel maps the file writable and shared"
            } else {
                continue;
            };
            let path = e.path.clone();
            return refuse_writable(st, &path, why);
        }
    }
    let e = crate::errno();
    let engine = whole(st, addr, rlen).filter(|_| {
        prot & (libc::PROT_READ | libc::PROT_EXEC) == libc::PROT_READ
            && pkey.is_none_or(|k| k == -1)
    });
    let rc = match engine {
        Some(i) => match st.maps[i].region.protect(write) {
            Ok(()) => 0,
            Err(err) => {
                crate::set_errno(err.errno());
                return Some(-1);
            }
        },
        None => {
            // Made writable in part by the kernel: an anonymous mapping the
            // engine made read-only must be read-only in the kernel first,
            // where it is only write-protected (writable in its mapping,
            // which this call would then not change, and the engine would
            // refuse the writes it allows: `Region::protect_in_kernel`).
            if write {
                for &(i, _) in &hits {
                    if let Err(err) = st.maps[i].region.protect_in_kernel() {
                        crate::set_errno(err.errno());
                        return Some(-1);
                    }
                }
            }
            let (nr, k) = match pkey {
                Some(k) => (libc::SYS_pkey_mprotect, k as usize),
                None => (libc::SYS_mprotect, 0),
            };
            // SAFETY: the program's own call on this range, passed on
            // unchanged.
            unsafe { sys::call(nr, addr, len, prot as usize, k, 0) as c_int }
        }
    };
    // ENOMEM (a hole in the range) comes after the kernel changed the
    // mappings before the hole: made writable, in part, they are marked so
    // below all the same (else fsync and the exit skipped their stores).
    let after = crate::errno();
    if rc != 0 && !(engine.is_none() && write && after == libc::ENOMEM) {
        return Some(rc);
    }
    for &(i, _) in &hits {
        let en = &mut st.maps[i];
        if en.file.is_none() {
            continue;
        }
        if write {
            // Writable from here on, in whole or in part: `msync`,
            // `fsync`, `read` and the exit write its dirty pages back. (The
            // engine sees each first write, in a part the kernel made
            // writable too, through the write protection its pages went in
            // with.)
            if !en.writable_shared {
                en.writable_shared = true;
                WRITABLE_ENTRIES.fetch_add(1, Relaxed);
            }
            en.kernel_writable |= engine.is_none();
        } else if engine == Some(i) && en.writable_shared && !en.kernel_writable {
            // Read-only again, all of it: once its dirty pages are
            // written, it no longer keeps the file from other mappings.
            if en.region.flush().is_ok() {
                en.writable_shared = false;
                WRITABLE_ENTRIES.fetch_sub(1, Relaxed);
            }
        }
    }
    crate::set_errno(if rc == 0 { e } else { after });
    Some(rc)
}

/// The refusal of `mprotect(PROT_WRITE)` that would give file `path` a
/// writable shared mapping beside another (`why`): `EACCES`, the kernel's
/// answer for a file it may not write through the mapping.
fn refuse_writable(st: &mut State, path: &str, why: &str) -> Option<c_int> {
    REFUSED.fetch_add(1, Relaxed);
    st.say(format!(
        "{path}: refusing mprotect(PROT_WRITE): {why}, and a file mapped writable and shared \
         can have one mapping only where the pager maps it (the pager keeps a cache per \
         mapping, the kernel another); exclude it from UFFD_PAGER_FILES to let the kernel \
         map it"
    ));
    crate::set_errno(libc::EACCES);
    Some(-1)
}

/// msync: every pager mapping in the range writes its dirty pages back,
/// then the kernel's msync runs on the range (a no-op on pager memory,
/// but its checks of the flags and the range are the answer); with
/// `MS_SYNC` each shared file mapping's file is synced, as the kernel's
/// `msync` syncs the file (`fdatasync`'s range): what `write(2)` put in
/// the mapped range is made durable too, which the write-back syncs only
/// when it wrote something itself.
pub fn msync(addr: usize, len: usize, flags: c_int) -> Option<c_int> {
    if !spans::may_be_ours(addr, addr.saturating_add(len.max(1))) {
        return None;
    }
    let mut guard = state();
    let st = guard.as_mut()?;
    let e = crate::errno();
    let hits = overlapping(st, addr, addr.saturating_add(len.max(1)));
    for &(i, _) in &hits {
        if let Err(err) = st.maps[i].region.flush() {
            crate::set_errno(err.errno());
            return Some(-1);
        }
    }
    crate::set_errno(e);
    if hits.is_empty() {
        return None;
    }
    // SAFETY: the program's own call on this range, passed on unchanged.
    let rc = unsafe { sys::call(libc::SYS_msync, addr, len, flags as usize, 0, 0) as c_int };
    // ENOMEM (a hole in the range) comes after the kernel has synced the
    // mappings before the hole, so the pager's are synced too (all of them:
    // a sync more than asked for loses nothing).
    let after = crate::errno();
    if rc != 0 && after != libc::ENOMEM || flags & libc::MS_SYNC == 0 {
        return Some(rc);
    }
    for (i, _) in hits {
        if let Some(Err(err)) = st.maps[i].shared_store.as_ref().map(|s| s.sync()) {
            crate::set_errno(err.0);
            return Some(-1);
        }
    }
    crate::set_errno(after);
    Some(rc)
}

/// madvise: MADV_DONTNEED drops pages through the engine (shared pages
/// stay cached; anonymous ones read as zeros again), MADV_WILLNEED faults
/// them in, MADV_RANDOM / MADV_NORMAL / MADV_SEQUENTIAL set the region's
/// access advice ([`Region::advise`]), MADV_REMOVE on a writable shared
/// file mapping and MADV_DOFORK are refused (see [`remove`], [`dofork`]);
/// other advice is the kernel's.
pub fn madvise(addr: usize, len: usize, advice: c_int) -> Option<c_int> {
    // The access advice: the whole of each pager mapping the range touches
    // takes it (the kernel would split the VMA at the range's ends; the
    // engine's flag is per region). MADV_SEQUENTIAL clears the random
    // advice, as it clears the kernel's `VM_RAND_READ`; the engine's
    // readahead then ramps up on the sequential faults by itself.
    let access = match advice {
        libc::MADV_RANDOM => Some(engine::Access::Random),
        libc::MADV_NORMAL | libc::MADV_SEQUENTIAL => Some(engine::Access::Normal),
        libc::MADV_DONTNEED | libc::MADV_WILLNEED | libc::MADV_FREE => None,
        libc::MADV_REMOVE | libc::MADV_DOFORK => None,
        _ => return None,
    };
    // A range the kernel refuses (an unaligned start, an end past the
    // top: EINVAL) is the kernel's: dropped here first, the pager's
    // mappings in it lost their pages to a call that changes nothing.
    let (a, b) = (addr, kernel_range(addr, pages_len(len)?)?);
    if !spans::may_be_ours(a, b) {
        return None;
    }
    let mut guard = state();
    let st = guard.as_mut()?;
    let hits = overlapping(st, a, b);
    if hits.is_empty() {
        return None;
    }
    if advice == libc::MADV_REMOVE {
        return remove(st, &hits);
    }
    if advice == libc::MADV_DOFORK {
        return dofork(st, &hits);
    }
    let e = crate::errno();
    if let Some(access) = access {
        // The kernel's call first: advice it refuses (an unaligned start,
        // a length that overflows) changes nothing in the engine either.
        // ENOMEM (a hole in the range) still advises what is mapped, as
        // the kernel's own madvise does.
        // SAFETY: the program asked for this call on this range (see the function's comment).
        let rc = unsafe { sys::call(libc::SYS_madvise, addr, len, advice as usize, 0, 0) as c_int };
        let after = crate::errno();
        if rc != 0 && after != libc::ENOMEM {
            return Some(rc);
        }
        for (i, _) in hits {
            if let Err(err) = st.maps[i].region.advise(access) {
                crate::set_errno(err.errno());
                return Some(-1);
            }
        }
        crate::set_errno(if rc == 0 { e } else { after });
        return Some(rc);
    }
    // Piece by piece: after the program's own partial munmap the range
    // may span a hole, and each mapped piece in it takes the advice, as
    // each VMA does under the kernel's madvise (which answers ENOMEM for
    // the hole below). A piece the program moved out of the mapping's own
    // range is left to the kernel's call.
    let mut willneed_left = willneed_pages(st.cfg.budget) * PAGE;
    for (i, pieces) in hits {
        let file = st.maps[i].file.is_some();
        let r = &mut st.maps[i].region;
        let start = r.as_ptr() as usize;
        let end = start + r.len();
        for p in pieces {
            let (lo, hi) = (a.max(p.start), b.min(p.end));
            if lo >= hi || p.start < start || p.end > end {
                continue;
            }
            // MADV_FREE: the kernel posts the event `MADV_DONTNEED` posts
            // but keeps the pages mapped until it needs the memory, and a
            // page written again stays: the engine, which took them for
            // dropped, then had them mapped outside its budget (a
            // program that freed and reused its heap this way grew past
            // it). Dropped at once instead, which MADV_FREE allows (a
            // freed page reads as its old bytes or as zeros). A file
            // mapping gets the kernel's EINVAL.
            let res = if advice == libc::MADV_FREE && file {
                crate::set_errno(libc::EINVAL);
                return Some(-1);
            } else if advice == libc::MADV_DONTNEED || advice == libc::MADV_FREE {
                r.dontneed(lo - start, hi - lo)
            } else {
                // MADV_WILLNEED: a hint. The kernel reads ahead a bounded
                // part of the range (`force_page_cache_ra`: at most the
                // readahead window or the device's I/O size) and answers
                // 0 whatever the reads do; past the end of the file it
                // reads nothing. The whole range was read in here, past
                // the budget and synchronously (4,096 page reads for a
                // budget of 256), and a page past the end of the file
                // made the call fail with EIO (found by review).
                let n = (hi - lo).min(willneed_left);
                willneed_left -= n;
                if n > 0 {
                    let _ = r.populate(lo - start, n);
                }
                Ok(())
            };
            if let Err(err) = res {
                crate::set_errno(err.errno());
                return Some(-1);
            }
        }
    }
    // Memory in the range outside pager mappings gets the kernel's advice,
    // and the kernel's answer is the call's: ENOMEM for a hole in the
    // range (the shim answered 0 to MADV_WILLNEED, found by review).
    crate::set_errno(e);
    // SAFETY: the program asked for this call on this range (see the function's comment).
    let rc = unsafe { sys::call(libc::SYS_madvise, addr, len, advice as usize, 0, 0) as c_int };
    Some(rc)
}

/// Pages one `MADV_WILLNEED` reads in at most, with a budget of `budget`
/// bytes (0: none): 2 MiB (the kernel reads ahead at most its window or
/// the device's best I/O size, 128 KiB to a few MiB), and no more than a
/// quarter of the budget, so that the advice does not evict the pages it
/// just read, or the program's working set.
fn willneed_pages(budget: u64) -> usize {
    let pages = (2usize << 20) / PAGE;
    match budget.div_ceil(PAGE as u64) {
        0 => pages,
        b => pages.min((b / 4).max(1) as usize),
    }
}

/// The end of `[addr, addr + rlen)` (`rlen` rounded to pages), or `None`
/// where the kernel's call would act on nothing: an empty range, an
/// unaligned start, an end past the top of the address space.
fn kernel_range(addr: usize, rlen: usize) -> Option<usize> {
    if rlen == 0 || !addr.is_multiple_of(PAGE) {
        return None;
    }
    addr.checked_add(rlen)
}

/// `MADV_DOFORK` on pager mappings: refused with `EINVAL`, the kernel's
/// answer for a mapping it will not copy into a child, and nothing changes.
/// Passed on, it undid the engine's `MADV_DONTFORK`, and a child forked
/// after it got the engine's memfd mapping with no pager behind it: the
/// pages the pager had dropped read as zeros there (found by review).
fn dofork(st: &mut State, hits: &[(usize, Vec<Range<usize>>)]) -> Option<c_int> {
    let &(i, _) = hits.first()?;
    let why = "a child would get its memory without the pager";
    refuse(st, i, "MADV_DOFORK", (libc::EINVAL, "EINVAL"), why)
}

/// Refuses `advice` on mapping `i` with `errno` (and its name), saying
/// why; counts it.
fn refuse(
    st: &mut State,
    i: usize,
    advice: &str,
    errno: (c_int, &str),
    why: &str,
) -> Option<c_int> {
    REFUSED.fetch_add(1, Relaxed);
    let msg = format!(
        "{}: refusing {advice} on the mapping ({}): {why}",
        st.maps[i].path, errno.1
    );
    st.say(msg);
    crate::set_errno(errno.0);
    Some(-1)
}

/// `MADV_REMOVE` over pager memory. The kernel punches a hole in the
/// mapped file of a writable shared mapping; passed on, it punched the
/// engine's memfd instead, and the file kept its bytes while the mapping
/// showed them again (found by review). The shim does not punch files: it
/// answers `EOPNOTSUPP`, the kernel's answer for a file system that cannot
/// punch holes, once, on stderr, said why. Private and anonymous pager
/// memory is the kernel's to refuse (`EACCES`: its mapping is private).
fn remove(st: &mut State, hits: &[(usize, Vec<Range<usize>>)]) -> Option<c_int> {
    let &(i, _) = hits.iter().find(|(i, _)| st.maps[*i].writable_shared)?;
    let why = "the pager does not punch holes in mapped files";
    refuse(st, i, "MADV_REMOVE", (libc::EOPNOTSUPP, "EOPNOTSUPP"), why)
}
