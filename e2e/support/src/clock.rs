//! Wall clocks a test can move: a process started under libfaketime reads its wall clock
//! from a timestamp file the test rewrites (its monotonic clock is left alone).

use std::path::Path;
use std::process::Command;

/// libfaketime's preload library (Debian package libfaketime).
fn faketime_lib() -> &'static str {
    ["/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1", "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("libfaketime is installed (Debian package faketime)")
}

/// Runs `command` under a wall clock set by the timestamp file `clock` (re-read on every
/// call; the monotonic clock is left alone).
pub fn under_clock(command: &mut Command, clock: &Path) {
    command
        .env("LD_PRELOAD", faketime_lib())
        .env("FAKETIME_TIMESTAMP_FILE", clock)
        .env("FAKETIME_NO_CACHE", "1")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .env("TZ", "UTC");
}

/// Sets the wall clock behind timestamp file `clock`: `+3600`, `-3600`, `+0`, or an
/// absolute `YYYY-MM-DD hh:mm:ss` (UTC), at which the clock stands still.
pub fn set_clock(clock: &Path, setting: &str) {
    let tmp = clock.with_extension("tmp");
    std::fs::write(&tmp, format!("{setting}\n")).expect("write a clock setting");
    std::fs::rename(&tmp, clock).expect("install a clock setting");
}
