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
/// word, region first, then the model, as thread `t`. Each word is checked
/// first against the model, exactly (the caller is the page's only
/// writer): a page that came back stale and was then written lost the
/// evidence, a lost write to its first word for good, and a run of writes
/// only checked nothing until the end (found by review).
///
/// # Safety
/// `base` is a live region of more than `w` words, whose page holding `w`
/// only the calling thread writes.
pub(super) unsafe fn write_word(
    t: usize,
    base: usize,
    w: usize,
    model: &Model,
    findings: &Findings,
) {
    let (words, n) = with_first(w);
    for &x in &words[..n] {
        // SAFETY: the caller's contract; `x` is at or below `w`.
        unsafe { check_word(t, true, base, x, model, findings) };
        // SAFETY: as above.
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
            write_word(0, base, 5, &model, &findings);
            let copy = std::slice::from_raw_parts(base as *const u64, WORDS_PER_PAGE).to_vec();
            write_word(0, base, 7, &model, &findings);
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

    fn findings() -> Findings {
        Findings {
            count: AtomicU64::new(0),
            first: Mutex::new(Vec::new()),
        }
    }

    /// A write onto a page that came back stale is caught at the write
    /// (the owner knows each word exactly), before it hides the evidence.
    #[test]
    fn a_write_onto_a_stale_page_is_caught() {
        let model = Model::new(WORDS_PER_PAGE, 3, false);
        let mut region = vec![0u64; WORDS_PER_PAGE];
        let base = region.as_mut_ptr() as usize;
        let f = findings();
        // SAFETY: `region` holds the page and outlives the calls; this
        // thread is its only writer.
        unsafe {
            write_word(0, base, 9, &model, &f);
            assert_eq!(f.count.load(Relaxed), 0);
            // The engine hands back the page as it was before the write.
            *(base as *mut u64).add(9) = 0;
            write_word(0, base, 9, &model, &f);
        }
        assert_eq!(f.count.load(Relaxed), 1);
        let m = &f.first.lock().unwrap()[0];
        assert_eq!((m.word, m.got_seq, m.want_min_seq), (9, Some(0), 1));
    }

    /// The final checks fire on a wrong file: another page's words, a
    /// zeroed page, a word one write behind, and for an anonymous region a
    /// write that reached the source.
    #[test]
    fn the_final_checks_catch_a_wrong_page() {
        let words = 2 * WORDS_PER_PAGE;
        let model = Model::new(words, 5, true);
        for w in 0..words {
            model.seqs[w].store(2, Relaxed);
        }
        let good: Vec<u8> = (0..words)
            .flat_map(|w| model.encode(w, 2).to_ne_bytes())
            .collect();
        let count = |bytes: &[u8], kind| {
            let f = findings();
            verify_source(&model, kind, &f, bytes);
            f.count.load(Relaxed)
        };
        assert_eq!(count(&good, InstallKind::Shared), 0);
        let page = WORDS_PER_PAGE * 8;
        let mut swapped = good.clone();
        swapped.copy_within(0..page, page);
        assert_eq!(count(&swapped, InstallKind::Shared), WORDS_PER_PAGE as u64);
        let mut zeroed = good.clone();
        zeroed[page..].fill(0);
        assert_eq!(count(&zeroed, InstallKind::Shared), WORDS_PER_PAGE as u64);
        let mut behind = good.clone();
        behind[8..16].copy_from_slice(&model.encode(1, 1).to_ne_bytes());
        assert_eq!(count(&behind, InstallKind::Shared), 1);
        // An anonymous region's source keeps its initial words.
        assert_eq!(count(&good, InstallKind::Anonymous), words as u64);
    }
}
