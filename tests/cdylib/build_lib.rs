//! Shared by the tests of the C API and of the LD_PRELOAD shim (included
//! with `#[path]`): building the cdylib under test, and running a program
//! whose stderr has no reader.

use std::path::PathBuf;
use std::process::Command;

/// Builds package `pkg`'s library with the profile these tests were built
/// with and returns `target/<profile>` (once per test binary). `cargo test`
/// builds a cdylib only when something links it, which nothing here does,
/// so without this a test would run against a stale library.
pub fn build_lib(pkg: &str) -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "--quiet", "--lib", "-p", pkg])
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let st = cmd.status().expect("running cargo build");
        assert!(st.success(), "cargo build -p {pkg} failed");
        dir
    })
    .clone()
}

/// Runs `cmd` with stderr a pipe whose reader is gone at once (its writes
/// fail with `EPIPE` where the program ignores SIGPIPE); asserts it exits
/// 0 and returns its stdout.
#[allow(dead_code)]
pub fn stdout_with_stderr_gone(cmd: &mut Command) -> String {
    use std::process::Stdio;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stderr.take());
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}: {text}", out.status);
    text
}
