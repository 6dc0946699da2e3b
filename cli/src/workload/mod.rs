//! Workloads: reusable drivers for the CLI, the benches and the tests. Each
//! takes every knob as a parameter ([`Knobs`]) and returns a [`RunResult`]
//! with its throughput and the pager's counters.

pub mod churn;
pub mod common;
pub mod deadline;
pub mod filemap;
pub mod launch;
pub mod noise;
pub mod pattern_file;
pub mod random;
pub mod scan;
pub mod soak;
pub mod swap;
pub mod torture;

pub use common::{Knobs, RunResult};
