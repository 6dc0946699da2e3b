//! The `exec` family, and the calls that start another process: what was
//! stored through the pager's mappings is written back before the process
//! image is replaced, or the other process starts.
//!
//! Under the kernel, stores through a writable shared mapping are in the
//! file's page cache, so the new image (or anyone) reads them. The
//! pager's copies die with the image: the write-back at exit ([`unload`])
//! never runs at an exec. So each exec call writes back first, as exit
//! does, and writes the counters (the new image reports only if it makes
//! a pager of its own). A failed exec goes on with the mappings as they
//! were, written back.
//!
//! Interposed: `execve`, `execveat` (raw system calls after the write-back)
//! and `execv`, `execvp`, `execvpe`, `fexecve` (the next definition, libc's,
//! after it). glibc's `execl`, `execle` and `execlp` are variadic and reach
//! the kernel through glibc's internal calls: not seen (see the README).
//!
//! Another process started without an exec of this one (`fork`,
//! `posix_spawn`, `posix_spawnp`, `system`, `popen`, interposed: glibc's
//! spawn calls exec through its own internal calls) reads the file too, as under the kernel it reads the
//! stores from the page cache: the writable shared mappings are written
//! back first (`before_spawn`; before, the child read the older bytes),
//! and synced: a fork costs an `fsync` of each file written since. A
//! `vfork()`ed child that execs is not seen (it shares the parent's table),
//! nor `_Fork` or a raw `clone` (Python's `subprocess` uses `vfork`).
//!
//! Hazard: POSIX allows `execve` in a signal handler, and the write-back
//! allocates and takes the engine's locks. One that interrupted the shim's
//! or the engine's own work on its thread is told apart and skips the
//! write-back, as an exit does; one that interrupted `malloc` is not.
//!
//! [`unload`]: crate::maps::unload

use crate::{in_shim, in_shim_here, maps, programs_own};
use std::ffi::{c_char, c_int, CStr};

/// The write-back before an exec (see the module docs).
fn before_exec() {
    // (Not in a `vfork()`ed child: it shares the parent's table and lock,
    // and the parent's pager serves nothing there.)
    if programs_own() && !in_shim_here() && maps::active() && maps::made_here() {
        in_shim("exec", || maps::finish("exec"));
    }
}

/// The write-back before another process starts (see the module docs).
pub(crate) fn before_spawn() {
    if programs_own()
        && !in_shim_here()
        && maps::active()
        && maps::made_here()
        && maps::any_to_sync()
    {
        // (A failure was said on stderr; the child starts anyway, as the
        // program asked, with the program's errno.)
        let saved = crate::errno();
        in_shim("spawn", || {
            let _ = maps::flush_all("before a child process starts");
        });
        crate::set_errno(saved);
    }
}

/// fork(2), after the write-back. Interposed rather than seen through a
/// `pthread_atfork` prepare handler, which runs after the program's own
/// handlers (newest first) have taken their locks, an allocator's among
/// them: the write-back allocates (found by review). A fork glibc makes
/// through its own internal calls is not seen.
///
/// # Safety
/// As fork(2).
#[no_mangle]
pub unsafe extern "C" fn fork() -> libc::pid_t {
    before_spawn();
    // SAFETY: libc's fork, no arguments.
    via_libc(c"fork", |f: unsafe extern "C" fn() -> libc::pid_t| unsafe {
        f()
    })
}

/// libc's definition of `name`, the next after this library's; `None` if
/// there is none.
fn next(name: &CStr) -> Option<*mut std::ffi::c_void> {
    // SAFETY: `name` is a NUL-terminated string; RTLD_NEXT looks past this
    // library.
    let f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    (!f.is_null()).then_some(f)
}

type Argv = *const *const c_char;

/// Calls libc's `name` with `args` (through `call`), or fails with ENOSYS
/// where it has none.
fn via_libc<F: Copy>(name: &CStr, call: impl FnOnce(F) -> c_int) -> c_int {
    match next(name) {
        // SAFETY: `F` is the type of libc's `name`, as each caller
        // declares it (the prototype in <unistd.h>), and a function
        // pointer is the size of a data pointer here.
        Some(f) => call(unsafe { std::mem::transmute_copy::<*mut std::ffi::c_void, F>(&f) }),
        None => {
            crate::set_errno(libc::ENOSYS);
            -1
        }
    }
}

/// execve(2), after the write-back.
///
/// # Safety
/// As execve(2).
#[no_mangle]
pub unsafe extern "C" fn execve(path: *const c_char, argv: Argv, envp: Argv) -> c_int {
    before_exec();
    // SAFETY: the program's own call, passed on unchanged.
    unsafe { libc::syscall(libc::SYS_execve, path, argv, envp) as c_int }
}

/// execveat(2), after the write-back.
///
/// # Safety
/// As execveat(2).
#[no_mangle]
pub unsafe extern "C" fn execveat(
    dirfd: c_int,
    path: *const c_char,
    argv: Argv,
    envp: Argv,
    flags: c_int,
) -> c_int {
    before_exec();
    // SAFETY: the program's own call, passed on unchanged.
    unsafe { libc::syscall(libc::SYS_execveat, dirfd, path, argv, envp, flags) as c_int }
}

/// execv(3), after the write-back.
///
/// # Safety
/// As execv(3).
#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: Argv) -> c_int {
    before_exec();
    // SAFETY: libc's execv with the program's own arguments.
    via_libc(
        c"execv",
        |f: unsafe extern "C" fn(*const c_char, Argv) -> c_int| unsafe { f(path, argv) },
    )
}

/// execvp(3), after the write-back.
///
/// # Safety
/// As execvp(3).
#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: Argv) -> c_int {
    before_exec();
    // SAFETY: libc's execvp with the program's own arguments.
    via_libc(
        c"execvp",
        |f: unsafe extern "C" fn(*const c_char, Argv) -> c_int| unsafe { f(file, argv) },
    )
}

/// execvpe(3), after the write-back.
///
/// # Safety
/// As execvpe(3).
#[no_mangle]
pub unsafe extern "C" fn execvpe(file: *const c_char, argv: Argv, envp: Argv) -> c_int {
    before_exec();
    // SAFETY: libc's execvpe with the program's own arguments.
    via_libc(
        c"execvpe",
        |f: unsafe extern "C" fn(*const c_char, Argv, Argv) -> c_int| unsafe {
            f(file, argv, envp)
        },
    )
}

/// fexecve(3), after the write-back.
///
/// # Safety
/// As fexecve(3).
#[no_mangle]
pub unsafe extern "C" fn fexecve(fd: c_int, argv: Argv, envp: Argv) -> c_int {
    before_exec();
    // SAFETY: libc's fexecve with the program's own arguments.
    via_libc(
        c"fexecve",
        |f: unsafe extern "C" fn(c_int, Argv, Argv) -> c_int| unsafe { f(fd, argv, envp) },
    )
}

type SpawnFn = unsafe extern "C" fn(
    *mut libc::pid_t,
    *const c_char,
    *const libc::posix_spawn_file_actions_t,
    *const libc::posix_spawnattr_t,
    Argv,
    Argv,
) -> c_int;

/// libc's `name` (`posix_spawn` or `posix_spawnp`) after the write-back.
///
/// # Safety
/// As posix_spawn(3).
unsafe fn spawn_via(
    name: &CStr,
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: Argv,
    envp: Argv,
) -> c_int {
    before_spawn();
    match next(name) {
        // SAFETY: libc's function of that name has this prototype
        // (<spawn.h>); the program's own arguments.
        Some(f) => unsafe {
            std::mem::transmute_copy::<*mut std::ffi::c_void, SpawnFn>(&f)(
                pid, path, actions, attr, argv, envp,
            )
        },
        None => libc::ENOSYS,
    }
}

/// posix_spawn(3), after the write-back.
///
/// # Safety
/// As posix_spawn(3).
#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: Argv,
    envp: Argv,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { spawn_via(c"posix_spawn", pid, path, actions, attr, argv, envp) }
}

/// posix_spawnp(3), after the write-back.
///
/// # Safety
/// As posix_spawnp(3).
#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: Argv,
    envp: Argv,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { spawn_via(c"posix_spawnp", pid, file, actions, attr, argv, envp) }
}

/// system(3), after the write-back.
///
/// # Safety
/// As system(3).
#[no_mangle]
pub unsafe extern "C" fn system(command: *const c_char) -> c_int {
    before_spawn();
    // SAFETY: libc's system with the program's own argument.
    via_libc(
        c"system",
        |f: unsafe extern "C" fn(*const c_char) -> c_int| unsafe { f(command) },
    )
}

/// popen(3), after the write-back.
///
/// # Safety
/// As popen(3).
#[no_mangle]
pub unsafe extern "C" fn popen(command: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    before_spawn();
    type PopenFn = unsafe extern "C" fn(*const c_char, *const c_char) -> *mut libc::FILE;
    match next(c"popen") {
        // SAFETY: libc's popen has this prototype (<stdio.h>); the
        // program's own arguments.
        Some(f) => unsafe {
            std::mem::transmute_copy::<*mut std::ffi::c_void, PopenFn>(&f)(command, mode)
        },
        None => {
            crate::set_errno(libc::ENOSYS);
            std::ptr::null_mut()
        }
    }
}
