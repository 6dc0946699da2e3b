//! futex(2) wait and wake on a 32-bit atomic word.
//!
//! Cost: an uncontended wake with no waiters is avoided by callers (they keep
//! a waiters bit); a wait or wake that reaches the kernel is one syscall.

use std::sync::atomic::AtomicU32;

/// Sleeps while `*word == expected`. Returns on wake-up, on a value change,
/// or spuriously (EINTR): callers always re-check their condition.
#[inline]
pub fn wait(word: &AtomicU32, expected: u32) {
    // SAFETY: `word` is a valid, aligned 32-bit word for the duration of the
    // call; FUTEX_WAIT_PRIVATE only reads it. A null timeout means no timeout.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            std::ptr::null::<libc::timespec>(),
        );
    }
}

/// As [`wait`], but for at most `timeout_ns` nanoseconds.
#[inline]
pub fn wait_timeout(word: &AtomicU32, expected: u32, timeout_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (timeout_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: as in `wait`; `ts` is a valid relative timeout.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            &ts as *const libc::timespec,
        );
    }
}

/// Wakes at most `n` threads sleeping on `word`.
#[inline]
pub fn wake(word: &AtomicU32, n: i32) {
    // SAFETY: as in `wait`; FUTEX_WAKE does not touch the word's memory.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            n,
        );
    }
}

/// Wakes every thread sleeping on `word`.
#[inline]
pub fn wake_all(word: &AtomicU32) {
    wake(word, i32::MAX);
}
