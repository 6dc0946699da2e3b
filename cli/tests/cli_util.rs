//! Running the built command line from integration tests.

#![allow(dead_code)]

use std::process::{Command, Output};

/// Runs the built binary with `args` (and no `RUST_LOG`).
pub fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_uffd-pager"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("running uffd-pager")
}
