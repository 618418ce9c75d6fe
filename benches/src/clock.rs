//! Fine-grained pacing for the open-loop load generator: `CLOCK_MONOTONIC` in nanoseconds,
//! a `timerfd` armed at absolute deadlines, and the thread's timer slack set to 1 ns.
//!
//! This is the one module of memroute-benches that allows `unsafe`: the three calls below
//! (`timerfd_create`/`timerfd_settime`, `clock_gettime`, `prctl`) have no wrapper in the
//! crates we already depend on. Each `unsafe` block passes only values it owns and checks
//! the return code.
//!
//! Why not tokio's timer: it ticks in 1 ms, so every send due within a millisecond is
//! released in one burst and the generator measures its own queueing. A timerfd is an
//! hrtimer with no slack of its own (the kernel arms it with a zero range), so it wakes
//! within the machine's timer latency (a few µs) of the deadline; timer slack is set to 1 ns
//! as well so nothing else this thread waits on (epoll timeouts) gets the default 50 µs.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `CLOCK_MONOTONIC` now, in nanoseconds (the clock timerfd deadlines are given in).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec owned by this frame. CLOCK_MONOTONIC always
    // exists on Linux, so the call cannot fail; it is served by the vDSO (no syscall).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Sets this thread's timer slack to 1 ns (the default is 50 µs, which the kernel may add to
/// any sleep or poll timeout of this thread to batch wake-ups).
pub fn set_min_timer_slack() -> io::Result<()> {
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and touches no memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A non-blocking `timerfd` on `CLOCK_MONOTONIC`. It becomes readable when the armed absolute
/// deadline passes, so it can sit in the same epoll set as the connections.
#[derive(Debug)]
pub struct Timer {
    fd: OwnedFd,
    /// The deadline currently armed (0 = none): re-arming to the same time is skipped.
    armed: u64,
}

impl Timer {
    pub fn new() -> io::Result<Timer> {
        // SAFETY: plain syscall with flag arguments; the returned descriptor is checked and
        // then owned by `OwnedFd`, which closes it exactly once.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by timerfd_create and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Timer { fd, armed: 0 })
    }

    /// Arms the timer to fire once at `deadline_ns` (CLOCK_MONOTONIC). A deadline already in
    /// the past fires at once. Arming also resets the expiry count, so the fd needs no read.
    pub fn arm_at(&mut self, deadline_ns: u64) -> io::Result<()> {
        if deadline_ns == self.armed {
            return Ok(());
        }
        let deadline_ns = deadline_ns.max(1); // 0 would disarm
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
                tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
            },
        };
        // SAFETY: `spec` is a valid itimerspec on this frame; the old-value pointer may be null.
        let rc = unsafe {
            libc::timerfd_settime(
                self.fd.as_raw_fd(),
                libc::TFD_TIMER_ABSTIME,
                &spec,
                std::ptr::null_mut(),
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        self.armed = deadline_ns;
        Ok(())
    }
}

impl AsRawFd for Timer {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}
