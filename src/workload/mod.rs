//! Workloads: reusable drivers for the CLI, the benches and the tests.
