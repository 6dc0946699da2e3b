//! C programs built with the system `cc` against the checked-in headers and
//! this package's `libuffd_pager.so` / `.a`, run on real faults.

use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "../../tests/cdylib/build_lib.rs"]
mod cdylib;
#[path = "../../tests/huge_util.rs"]
mod huge_util;
use cdylib::build_lib;

/// `target/<profile>`, with the libraries built, and the shared one under
/// its SONAME too (`libuffd_pager.so.1`: what a program linked against it
/// loads), as `make c-lib` installs it.
fn lib_dir() -> PathBuf {
    let d = build_lib("uffd-pager-capi");
    let link = d.join(format!("libuffd_pager.so.{ABI}"));
    if std::fs::read_link(&link).is_err() {
        // (Tests run in parallel: another may have made it first.)
        let _ = std::os::unix::fs::symlink("libuffd_pager.so", &link);
    }
    d
}

/// `UFFD_PAGER_ABI_VERSION` (the header's, checked below; `api.c` checks
/// the library's `uffd_pager_abi_version()` against it).
const ABI: u32 = 1;

/// The shared library's SONAME carries the ABI version the header and
/// `uffd_pager_abi_version()` say, so a program built against one ABI is
/// never run on a library of another.
#[test]
fn the_soname_carries_the_abi_version() {
    let so = lib_dir().join("libuffd_pager.so");
    let out = Command::new("readelf").arg("-d").arg(&so).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("Library soname: [libuffd_pager.so.{ABI}]")),
        "{text}"
    );
    let header =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("include/uffd_pager.h"))
            .unwrap();
    assert!(header.contains(&format!("#define UFFD_PAGER_ABI_VERSION {ABI}")));
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("uffd-capi-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// Builds `tests/c/<src>` into the executable `name` (a name of its own
/// per test: tests run in parallel); `link` are the link arguments.
fn build(src: &str, name: &str, link: &[&str]) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = scratch(name);
    let st = Command::new("cc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-pthread", "-I"])
        .arg(dir.join("include"))
        .arg(dir.join("tests/c").join(src))
        .arg("-o")
        .arg(&out)
        .args(link)
        .status()
        .expect("running cc");
    assert!(st.success(), "cc {src} failed");
    out
}

fn shared_link() -> Vec<String> {
    let d = lib_dir();
    assert!(
        d.join("libuffd_pager.so").exists(),
        "{} has no libuffd_pager.so",
        d.display()
    );
    vec![
        format!("-L{}", d.display()),
        "-luffd_pager".into(),
        format!("-Wl,-rpath,{}", d.display()),
    ]
}

fn run(cmd: &mut Command) -> String {
    // A program just linked may be "busy" (ETXTBSY) for a moment: a child
    // a parallel test forked (its `cc`) can still hold the descriptor the
    // linker wrote it through until that child execs.
    let mut tries = 0;
    let out = loop {
        match cmd.output() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 100 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => break r.unwrap(),
        }
    };
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn c_api_threads_over_a_file_four_times_the_budget() {
    let link = shared_link();
    let exe = build(
        "api.c",
        "api-shared",
        &link.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let out = run(Command::new(&exe).arg(scratch("api.dat")));
    assert!(out.contains("c api: ok"), "{out}");
}

#[test]
fn c_api_maps_2_mib_pages() {
    let _pool = huge_util::HugePool::take(4);
    let link = shared_link();
    let exe = build(
        "huge.c",
        "api-huge",
        &link.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let out = run(Command::new(&exe).arg(scratch("huge.dat")).arg("4"));
    assert!(out.contains("c api huge: ok"), "{out}");
}

#[test]
fn c_api_links_statically_too() {
    let a = lib_dir().join("libuffd_pager.a");
    let a = a.to_str().unwrap();
    let exe = build("api.c", "api-static", &[a, "-lpthread", "-ldl", "-lm"]);
    let out = run(Command::new(&exe).arg(scratch("api-static.dat")));
    assert!(out.contains("c api: ok"), "{out}");
}

#[test]
fn a_umap_program_runs_unchanged_on_the_engine() {
    let link = shared_link();
    let exe = build(
        "umap_random.c",
        "umap_random",
        &link.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    // 2048 pages through a buffer of 256 UMap pages, of 4 and of 8 KiB (the
    // budget is 256 × the UMap page).
    for (psize, threads) in [("4096", "1"), ("8192", "2")] {
        let out = run(Command::new(&exe)
            .env("UMAP_BUFSIZE", "256")
            .env("UMAP_PAGESIZE", psize)
            .arg(scratch("umap.dat"))
            .args(["2048", threads]));
        assert!(out.contains("umap: ok"), "{out}");
        assert!(
            out.contains(&format!("umap_page_size {psize} max_pages_in_buffer 256")),
            "{out}"
        );
    }
    // A bad setting: a message and a failed umap, not a crash.
    let out = Command::new(&exe)
        .env("UMAP_PAGESIZE", "1000")
        .arg(scratch("umap-bad.dat"))
        .args(["16", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("UMAP_PAGESIZE=1000"), "{err}");
    // A program that sets a good page size itself before its first umap
    // is not held to the bad variable (it was, whatever the setter said).
    let exe = build(
        "umap_set_page_size.c",
        "umap_set_page_size",
        &link.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let out = run(Command::new(&exe)
        .env("UMAP_PAGESIZE", "1000")
        .env("UMAP_READ_AHEAD", "lots")
        .arg(scratch("umap-set.dat")));
    assert!(out.contains("umap after set: ok"), "{out}");
    // (16 KiB: the page size set after four failed probes.)
    assert!(out.contains("prefetch read 4 pages"), "{out}");
}

/// UMap's messages go to stderr. With its reader gone (EPIPE, SIGPIPE
/// ignored) `eprintln!` panicked: in `umapcfg_set_umap_page_size`, which
/// has no unwind guard, and in `umap`'s fallback after the first panic was
/// caught, so the program aborted. The messages are dropped now.
#[test]
fn a_umap_message_to_a_broken_stderr_does_not_abort_the_program() {
    let link = shared_link();
    let exe = build(
        "umap_broken_stderr.c",
        "umap_broken_stderr",
        &link.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let out = cdylib::stdout_with_stderr_gone(&mut Command::new(&exe));
    assert_eq!(out, "page size 4096, umap failed (errno 22)\n");
}

/// A UMap program that exits without `uunmap` or `umap_flush`: what it
/// stored through a writable mapping reaches the file (the library writes
/// its regions back at exit). It was lost: the state is a static that is
/// never dropped.
#[test]
fn a_umap_program_that_exits_without_unmapping_keeps_its_stores() {
    let link = shared_link();
    let exe = build(
        "umap_exit.c",
        "umap_exit",
        &link.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let file = scratch("umap-exit.dat");
    run(Command::new(&exe).arg(&file));
    let data = std::fs::read(&file).unwrap();
    assert_eq!(&data[4096 + 8..4096 + 18], b"aastoredaa");
}

/// `umap` with `UMAP_FIXED` into a range the program had just freed: the
/// first `umap` builds the pager, whose own mappings went into that range,
/// and the map failed with `EEXIST`. A `uunmap` of no region is `EINVAL`
/// with a message for `uffd_pager_last_error` (it had none).
#[test]
fn a_umap_fixed_into_a_range_just_freed_lands_there() {
    let link = shared_link();
    let exe = build(
        "umap_fixed.c",
        "umap_fixed",
        &link.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let out = run(Command::new(&exe).arg(scratch("umap-fixed.dat")));
    assert_eq!(out, "umap fixed: at the address, read 'a'\nagain: said\n");
}

/// A UMap program whose main thread exits while another thread's `uunmap`
/// writes its region back keeps every store. The region had left the
/// library's list and the state's lock was let go before the write-back,
/// so the exit found nothing to write or wait for, and `exit` ended the
/// write-back part way (most of 16,384 stored pages lost).
#[test]
fn an_exit_during_another_threads_uunmap_keeps_its_stores() {
    let link = shared_link();
    let exe = build(
        "umap_exit_during_uunmap.c",
        "umap_exit_during_uunmap",
        &link.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let file = scratch("umap-exit-uunmap.dat");
    run(Command::new(&exe).arg(&file));
    let data = std::fs::read(&file).unwrap();
    let lost = data.chunks(4096).filter(|p| p[0] != b's').count();
    assert_eq!(lost, 0, "of {} pages", data.len() / 4096);
}

/// A UMap program that forks while another thread's `uunmap` writes back
/// (holding the library's state): the child's calls answer at once and
/// its exit does not wait. The child inherited the state locked by a
/// thread it does not have: every call waited for ever, and its exit
/// waited 10 s before it gave up.
#[test]
fn a_fork_during_another_threads_uunmap_leaves_a_child_that_answers() {
    let link = shared_link();
    let exe = build(
        "umap_fork_during_uunmap.c",
        "umap_fork_during_uunmap",
        &link.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let file = scratch("umap-fork-uunmap.dat");
    let out = run(Command::new(&exe).arg(&file));
    assert!(out.contains("forked inside the write-back"), "{out}");
}

/// A UMap program that forks while another thread's first UMap call is
/// making the library's state: the child's call answers at once. The
/// state was a `OnceLock` initialised with the environment's settings, and
/// the child waited for ever for an initialisation no thread of its own
/// was running (the program's own `getenv` makes that window 300 ms).
#[test]
fn a_fork_during_the_first_umap_call_leaves_a_child_that_answers() {
    let mut link = shared_link();
    link.push("-ldl".into());
    let exe = build(
        "umap_fork_during_first_call.c",
        "umap_fork_during_first_call",
        &link.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let out = run(&mut Command::new(&exe));
    assert!(out.contains("the child answered"), "{out}");
}

/// An empty UMap variable (a script's `export UMAP_READ_AHEAD=`) is unset,
/// and a buffer past the engine's largest budget (`UMAP_BUFSIZE` of
/// `UINT64_MAX`, "no limit") is that budget: both made every `umap` fail
/// with `EINVAL`.
#[test]
fn empty_and_unbounded_umap_settings_still_map() {
    let link = shared_link();
    // (Built under a name of its own: another test builds umap_random.)
    let exe = build(
        "umap_random.c",
        "umap_random_settings",
        &link.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    // (And a buffer of two pages, under the engine's least budget of four:
    // every umap failed with EINVAL once the engine refused such budgets.)
    for (name, value) in [
        ("UMAP_READ_AHEAD", ""),
        ("UMAP_BUFSIZE", "18446744073709551615"),
        ("UMAP_BUFSIZE", "2"),
    ] {
        let out = run(Command::new(&exe)
            .env(name, value)
            .arg(scratch("umap-settings.dat"))
            .args(["64", "1"]));
        assert!(out.contains("umap: ok"), "{name}={value:?}: {out}");
    }
}
