//! `CLOCK_BOOTTIME`: the kernel's monotonic clock that keeps counting while the host is
//! suspended, and timers on it.
//!
//! `std::time::Instant` (and every tokio timer) runs on `CLOCK_MONOTONIC`, which stops
//! while the host sleeps: a deadline counted on it would come late by the length of the
//! suspension, while the controller's clock kept going. Deadlines that must land before
//! somebody else can be granted the lock are therefore counted here. The same clock is
//! what every container of a pod reads in `/proc/uptime` (one kernel per pod), which is
//! why the hold file carries its validity deadline on it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use nix::time::{ClockId as Clock, clock_gettime};
use tokio::sync::Notify;

/// Time since boot on `CLOCK_BOOTTIME` (suspensions included).
pub fn now() -> Duration {
    // The clock exists on every Linux this runs on (2.6.39+); failing to read it is a
    // broken kernel, not a condition to handle.
    clock_gettime(Clock::CLOCK_BOOTTIME).map(Duration::from).expect("CLOCK_BOOTTIME is readable")
}

/// The `CLOCK_BOOTTIME` reading at which a deadline on `Instant`'s clock falls, rounded
/// down: the boot clock is read first, so the answer is never later than the deadline,
/// and a suspension after this call only makes it come sooner.
pub fn deadline_of(deadline: Instant) -> Duration {
    let boot = now();
    boot + deadline.saturating_duration_since(Instant::now())
}

/// Milliseconds of a boot-clock reading, rounded down (the unit of the hold file).
pub fn millis(reading: Duration) -> u64 {
    u64::try_from(reading.as_millis()).unwrap_or(u64::MAX)
}

/// When to next look for a renewal of a hold valid until `valid_until`, to pass its new
/// deadline on (to the hold file, to the guard of `leasehold run`).
///
/// A holder renews one retry period after its last renewal was sent, which was
/// `renew_deadline` before `valid_until`: look just after that, then every twentieth of a
/// retry period until the renewal shows. One or two looks per renewal, and the new
/// deadline is passed on within a round trip and a twentieth of a retry period — well
/// inside the margin between one renewal and the deadline of the previous one (the renew
/// deadline exceeds 1.2 retry periods).
pub fn next_look(valid_until: Instant, renew_deadline: Duration, retry_period: Duration, now: Instant) -> Instant {
    let poll = (retry_period / 20).clamp(Duration::from_millis(10), Duration::from_millis(250));
    let due = valid_until.checked_sub(renew_deadline).map(|sent| sent + retry_period);
    match due {
        Some(due) if due > now => due + poll,
        _ => now + poll,
    }
}

/// A re-armable timer on `CLOCK_BOOTTIME`.
///
/// A `timerfd` on the boot clock is waited on by a small thread of its own (tokio's
/// reactor registers descriptors only through an `unsafe` API), which wakes the async
/// side when it fires. The async side also sleeps on tokio's clock for the time left:
/// that never fires earlier than the boot clock (which runs at least as fast), so the
/// timer fires at the deadline without a suspension, and at the wake-up after one.
pub struct BootTimer {
    fd: Option<Arc<TimerFd>>,
    closed: Arc<AtomicBool>,
    fired: Arc<Notify>,
    deadline: Option<Duration>,
}

impl BootTimer {
    /// A timer, not armed. If the kernel refuses a `timerfd`, the timer still works on
    /// tokio's clock (and is late after a suspension).
    pub fn new() -> BootTimer {
        let (closed, fired) = (Arc::new(AtomicBool::new(false)), Arc::new(Notify::new()));
        let fd = TimerFd::new(ClockId::CLOCK_BOOTTIME, TimerFlags::TFD_CLOEXEC).map(Arc::new);
        let fd = match fd {
            Ok(fd) => {
                let (thread_fd, thread_closed, thread_fired) = (fd.clone(), closed.clone(), fired.clone());
                let spawned = std::thread::Builder::new().name("boottime-timer".into()).spawn(move || {
                    loop {
                        let waited = thread_fd.wait();
                        thread_fired.notify_one();
                        if waited.is_err() || thread_closed.load(Ordering::Acquire) {
                            return;
                        }
                    }
                });
                spawned.ok().map(|_| fd)
            }
            Err(_) => None,
        };
        BootTimer { fd, closed, fired, deadline: None }
    }

    /// Arms (or re-arms) the timer to fire when the boot clock reads `deadline`.
    pub fn arm(&mut self, deadline: Duration) {
        self.deadline = Some(deadline);
        if let Some(fd) = &self.fd {
            // A zero expiration would disarm it; nothing is due before the first nanosecond.
            let at = TimeSpec::from(deadline.max(Duration::from_nanos(1)));
            if fd.set(Expiration::OneShot(at), TimerSetTimeFlags::TFD_TIMER_ABSTIME).is_err() {
                self.fd = None;
            }
        }
    }

    /// The deadline armed, if any.
    pub fn deadline(&self) -> Option<Duration> {
        self.deadline
    }

    /// Resolves once the armed deadline has passed on the boot clock (never, unarmed).
    pub async fn expired(&self) {
        let Some(deadline) = self.deadline else { return std::future::pending().await };
        loop {
            let left = deadline.saturating_sub(now());
            if left.is_zero() {
                return;
            }
            tokio::select! {
                // A firing for an earlier arming is harmless: the loop checks the clock.
                _ = self.fired.notified(), if self.fd.is_some() => {}
                _ = tokio::time::sleep(left) => {}
            }
        }
    }
}

impl Default for BootTimer {
    fn default() -> BootTimer {
        BootTimer::new()
    }
}

impl Drop for BootTimer {
    fn drop(&mut self) {
        // Let the thread see it is no longer needed: fire once more, now.
        self.closed.store(true, Ordering::Release);
        if let Some(fd) = &self.fd {
            let _ = fd.set(Expiration::OneShot(TimeSpec::from(Duration::from_nanos(1))), TimerSetTimeFlags::empty());
        }
    }
}

/// Sleeps until `CLOCK_BOOTTIME` reads `deadline` (at once if it already has). Time the
/// host spends suspended counts.
pub async fn sleep_until(deadline: Duration) {
    if deadline <= now() {
        return;
    }
    let mut timer = BootTimer::new();
    timer.arm(deadline);
    timer.expired().await;
}

/// Sleeps for `duration` on `CLOCK_BOOTTIME`.
pub async fn sleep(duration: Duration) {
    sleep_until(now() + duration).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_boot_clock_is_what_proc_uptime_shows() {
        let before = now();
        let uptime = std::fs::read_to_string("/proc/uptime").expect("/proc/uptime");
        let after = now();
        let seconds: f64 = uptime.split_whitespace().next().expect("a field").parse().expect("a number");
        let shown = Duration::from_secs_f64(seconds);
        // /proc/uptime is truncated to hundredths of a second.
        assert!(shown <= after && shown + Duration::from_millis(10) >= before, "{shown:?} vs {before:?}..{after:?}");
    }

    #[test]
    fn a_monotonic_deadline_maps_to_no_later_on_the_boot_clock() {
        let before = now();
        let deadline = Instant::now() + Duration::from_secs(1);
        let mapped = deadline_of(deadline);
        let after = now();
        let elapsed = after - before;
        assert!(mapped <= after + Duration::from_secs(1), "{mapped:?} after {after:?}");
        assert!(
            mapped + elapsed + Duration::from_millis(1) >= before + Duration::from_secs(1),
            "{mapped:?} {before:?}"
        );
        // A deadline already past maps to the present.
        let past = deadline_of(Instant::now() - Duration::from_millis(1));
        assert!(past <= now());
    }

    #[test]
    fn next_look_table() {
        let now = Instant::now();
        let ms = Duration::from_millis;
        // (valid until, renew deadline, retry period) -> look after
        for (valid_until, deadline, retry, expected) in [
            // Renewed just now (valid 10 s, retry 2 s): look 2 s + 100 ms from now.
            (ms(10_000), 10_000, 2_000, ms(2_100)),
            // Renewed 1.5 s ago: 500 ms + 100 ms.
            (ms(8_500), 10_000, 2_000, ms(600)),
            // Renewal overdue (in flight or failing): every 100 ms.
            (ms(7_000), 10_000, 2_000, ms(100)),
            // Fast timing (deadline 2 s, retry 1 s): 1 s + 50 ms.
            (ms(2_000), 2_000, 1_000, ms(1_050)),
            // Short retry periods poll no faster than every 10 ms; long ones every 250 ms.
            (ms(10), 1_000, 100, ms(10)),
            (ms(0), 60_000, 30_000, ms(250)),
        ] {
            let look = next_look(now + valid_until, ms(deadline), ms(retry), now);
            assert_eq!(look - now, expected, "{valid_until:?} {deadline} {retry}");
        }
    }

    #[tokio::test]
    async fn timers_fire_on_the_boot_clock() {
        let start = now();
        sleep(Duration::from_millis(50)).await;
        assert!(now() >= start + Duration::from_millis(50));
        // A deadline in the past returns at once.
        sleep_until(start).await;
        // Re-arming moves the deadline; an earlier firing does not end the wait.
        let mut timer = BootTimer::new();
        timer.arm(now() + Duration::from_millis(20));
        timer.arm(now() + Duration::from_millis(80));
        let armed = timer.deadline().expect("armed");
        timer.expired().await;
        assert!(now() >= armed);
    }
}
