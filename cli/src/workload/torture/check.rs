//! The torture's checks: a word the workers read against the model, and
//! the region's and its file's words against the final model (see the
//! parent module for why the bounds are exact).

use super::model::{Model, WORDS_PER_PAGE};
use super::report::{Findings, Mismatch, Phase};
use std::sync::atomic::{AtomicU64, Ordering::*};
use uffd_pager::InstallKind;

/// Word `w` of the region, as an atomic.
///
/// # Safety
/// `base` is a live region of more than `w` words.
pub(super) unsafe fn word_at<'a>(base: usize, w: usize) -> &'a AtomicU64 {
    // SAFETY: in bounds and 8-byte aligned (the region is page-aligned);
    // the region's memory stays mapped for the caller's use, and the
    // engine never changes its contents behind the application's back.
    unsafe { &*((base + w * 8) as *const AtomicU64) }
}

/// Word `w` and the first word of its page (the same word for a page's
/// first word): what one access touches (see the parent module's docs).
fn with_first(w: usize) -> ([usize; 2], usize) {
    let first = w - w % WORDS_PER_PAGE;
    ([w, first], if w == first { 1 } else { 2 })
}

/// Writes the next sequence number of word `w` and of its page's first
/// word, region first, then the model.
///
/// # Safety
/// `base` is a live region of more than `w` words, whose page holding `w`
/// only the calling thread writes.
pub(super) unsafe fn write_word(base: usize, w: usize, model: &Model) {
    let (words, n) = with_first(w);
    for &x in &words[..n] {
        // SAFETY: the caller's contract; `x` is at or below `w`.
        let cell = unsafe { word_at(base, x) };
        let m = &model.seqs[x];
        let seq = m.load(Relaxed) + 1;
        cell.store(model.encode(x, seq), Release);
        m.store(seq, Release);
    }
}

/// Checks word `w` and its page's first word against the model, as
/// thread `t` reads them (`own`: `t` is the page's only writer).
///
/// # Safety
/// `base` is a live region of more than `w` words.
pub(super) unsafe fn read_word(
    t: usize,
    own: bool,
    base: usize,
    w: usize,
    model: &Model,
    findings: &Findings,
) {
    let (words, n) = with_first(w);
    for &x in &words[..n] {
        // SAFETY: the caller's contract; `x` is at or below `w`.
        unsafe { check_word(t, own, base, x, model, findings) };
    }
}

/// Checks word `x` of the region against the model, as thread `t` reads
/// it (`own`: `t` is its page's only writer); see the module docs.
///
/// # Safety
/// `base` is a live region of more than `x` words.
unsafe fn check_word(
    t: usize,
    own: bool,
    base: usize,
    x: usize,
    model: &Model,
    findings: &Findings,
) {
    // SAFETY: the caller's contract.
    let cell = unsafe { word_at(base, x) };
    let m = &model.seqs[x];
    let (lo, r, hi) = if own {
        let s = m.load(Relaxed);
        (s, cell.load(Acquire), s)
    } else {
        let m1 = m.load(Acquire);
        let r = cell.load(Acquire);
        let m2 = m.load(Acquire);
        (m1, r, m2 + 1)
    };
    let got = model.decode(x, r);
    if !got.is_some_and(|s| s >= lo && s <= hi) {
        findings.record(Mismatch {
            phase: Phase::Run,
            word: x,
            got: r,
            want_min_seq: lo,
            want_max_seq: hi,
            got_seq: got,
            thread: Some(t),
        });
    }
}

/// Compares `words` (a snapshot of the region or file) with the final model.
pub(super) fn verify_words(
    model: &Model,
    phase: Phase,
    findings: &Findings,
    words: impl Iterator<Item = (usize, u64)>,
) -> u64 {
    let mut n = 0;
    for (w, v) in words {
        n += 1;
        let s = model.seqs[w].load(Acquire);
        if v != model.encode(w, s) {
            findings.record(Mismatch {
                phase,
                word: w,
                got: v,
                want_min_seq: s,
                want_max_seq: s,
                got_seq: model.decode(w, v),
                thread: None,
            });
        }
    }
    n
}

/// Compares the region's file or object, read back after the unmap, with
/// the final model (a shared region writes its pages back to it) or with
/// the initial pattern (an anonymous one is a private copy, whose writes
/// go to the pager's swap and never reach its source).
pub(super) fn verify_source(
    model: &Model,
    install: InstallKind,
    findings: &Findings,
    bytes: &[u8],
) -> u64 {
    let words = bytes.chunks_exact(8).enumerate().map(|(w, c)| {
        let mut a = [0u8; 8];
        a.copy_from_slice(c);
        (w, u64::from_ne_bytes(a))
    });
    if install == InstallKind::Shared {
        return verify_words(model, Phase::File, findings, words);
    }
    let mut n = 0;
    for (w, v) in words {
        n += 1;
        if v != model.encode(w, 0) {
            findings.record(Mismatch {
                phase: Phase::File,
                word: w,
                got: v,
                want_min_seq: 0,
                want_max_seq: 0,
                got_seq: model.decode(w, v),
                thread: None,
            });
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A page that comes back as an older copy of itself is caught at a
    /// read of a word the copy still has right: before, a read checked
    /// only its own word, so the stale page passed until a read happened
    /// on a word written since the copy.
    #[test]
    fn a_stale_page_is_caught_at_a_read_of_a_word_it_kept() {
        let model = Model::new(2 * WORDS_PER_PAGE, 9, false);
        let mut region = vec![0u64; 2 * WORDS_PER_PAGE];
        let base = region.as_mut_ptr() as usize;
        let findings = Findings {
            count: AtomicU64::new(0),
            first: Mutex::new(Vec::new()),
        };
        // SAFETY: `region` holds both pages and outlives the calls; this
        // thread is the only writer.
        unsafe {
            write_word(base, 5, &model);
            let copy = std::slice::from_raw_parts(base as *const u64, WORDS_PER_PAGE).to_vec();
            write_word(base, 7, &model);
            // The engine hands back the older copy of page 0.
            let base_ptr = base as *mut u64;
            std::ptr::copy_nonoverlapping(copy.as_ptr(), base_ptr, WORDS_PER_PAGE);
            // Word 5 is as the model says; the page is not.
            read_word(0, true, base, 5, &model, &findings);
        }
        assert_eq!(findings.count.load(Relaxed), 1);
        let m = &findings.first.lock().unwrap()[0];
        assert_eq!((m.word, m.got_seq, m.want_min_seq), (0, Some(1), 2));
    }
}
