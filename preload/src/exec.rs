//! The `exec` family: what was stored through the pager's mappings is
//! written back before the process image is replaced.
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
