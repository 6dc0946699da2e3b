//! What a run changes outside itself is put back when it ends: a kernel
//! setting it raised for the run.

use std::process::Command;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

const MAX_MAP_COUNT: &str = "/proc/sys/vm/max_map_count";

fn max_map_count() -> usize {
    std::fs::read_to_string(MAX_MAP_COUNT)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Puts `vm.max_map_count` back whatever the test saw.
struct PutBack(usize);

impl Drop for PutBack {
    fn drop(&mut self) {
        if max_map_count() != self.0 {
            let _ = std::fs::write(MAX_MAP_COUNT, self.0.to_string());
        }
    }
}

/// `bench scale` raises `vm.max_map_count` where it is too low for
/// `--many` regions (3 mappings each above 65536); before, the raised
/// value stayed after the run.
#[test]
fn scale_puts_max_map_count_back() {
    if !is_root() {
        eprintln!("skipped: needs root (to raise vm.max_map_count)");
        return;
    }
    let before = max_map_count();
    let _put_back = PutBack(before);
    let many = before.saturating_sub(65536) / 3 + 1;
    if many > 10_000 {
        eprintln!("skipped: vm.max_map_count is {before}, which --many {many} would need");
        return;
    }
    let many = many.max(2).to_string();
    let args = [
        "bench", "scale", "--few", "1", "--many", &many, "--faults", "64", "--passes", "1",
    ];
    let o = Command::new(env!("CARGO_BIN_EXE_uffd-pager"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {:?}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(max_map_count(), before, "{args:?} left it changed");
}
