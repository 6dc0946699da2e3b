//! Counters, latency histograms and their snapshots.

pub mod histogram;
