//! The torture's exact model of every word (see the parent module), its
//! PRNG and the mismatches it keeps.

use std::sync::atomic::AtomicU64;
use uffd_pager::PAGE_SIZE;

/// A small fast generator (splitmix64): deterministic per seed.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    pub(super) fn below(&mut self, n: u64) -> u64 {
        // Multiply-shift: unbiased enough for a test stream.
        ((self.next() as u128 * n as u128) >> 64) as u64
    }
}

pub(super) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The expected contents: per-word tags and published sequence numbers.
pub(super) struct Model {
    pub(super) seed: u64,
    /// Initial contents are the tagged pattern (files), not zeros.
    pub(super) tagged_init: bool,
    pub(super) seqs: Vec<AtomicU64>,
}

impl Model {
    pub(super) fn new(words: usize, seed: u64, tagged_init: bool) -> Model {
        Model {
            seed,
            tagged_init,
            seqs: (0..words).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Word `w`'s tag: never zero.
    pub(super) fn tag(&self, w: usize) -> u64 {
        (mix(self.seed ^ (w as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93)) >> 32) | 1
    }

    pub(super) fn encode(&self, w: usize, seq: u64) -> u64 {
        if seq == 0 && !self.tagged_init {
            0
        } else {
            (self.tag(w) << 32) | seq
        }
    }

    /// The sequence number `v` encodes for word `w`, if it is one of `w`'s.
    pub(super) fn decode(&self, w: usize, v: u64) -> Option<u64> {
        if v == self.encode(w, 0) {
            Some(0)
        } else if v >> 32 == self.tag(w) && v as u32 != 0 {
            Some(v & 0xffff_ffff)
        } else {
            None
        }
    }
}

/// Words per page.
pub(super) const WORDS_PER_PAGE: usize = PAGE_SIZE / 8;
