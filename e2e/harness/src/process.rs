//! Child processes of the control plane, and the guarantees that none outlives the tests.
//!
//! - Every child is spawned by one dedicated, never-ending thread, with
//!   `PR_SET_PDEATHSIG(SIGKILL)`: Linux sends that signal when the *thread* that forked
//!   the child exits, so spawning from a test's thread would kill the shared control plane
//!   as soon as that test finished.
//! - Every live child is listed in a registry that an `atexit` hook empties (SIGKILL, then
//!   reap), because the shared control plane is a static and statics are never dropped.
//! - A [`Supervised`] child is killed and reaped when dropped.

#![allow(unsafe_code)] // prctl/getppid in pre_exec, kill/waitpid and atexit: all libc.

use std::{
    fs::OpenOptions,
    io,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{
        Mutex, MutexGuard, Once, OnceLock, PoisonError,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    thread,
};

use anyhow::Context as _;

/// A running child process whose output goes to a log file; killed and reaped on drop,
/// and killed by the kernel if the test process dies first.
#[derive(Debug)]
pub struct Supervised {
    name: String,
    child: Child,
    log: PathBuf,
    /// Length of the log when this child started: earlier lines belong to predecessors.
    log_start: u64,
    reaped: bool,
    /// SIGTERM and this long to exit before SIGKILL (a child that cleans up after itself).
    graceful: Option<std::time::Duration>,
}

impl Supervised {
    /// Spawns `command` (from the spawner thread, armed with `PR_SET_PDEATHSIG`), with
    /// stdin closed and stdout and stderr appended to `log`.
    pub fn spawn(name: &str, command: Command, log: &Path) -> anyhow::Result<Supervised> {
        Self::spawn_with(name, command, log, None)
    }

    /// Like [`Self::spawn`], for a child that must clean up after itself (the node
    /// supervisor): it gets SIGTERM, and `grace` to exit before SIGKILL, when dropped,
    /// when the test process exits, and (as its parent-death signal) when the test process
    /// dies.
    pub fn spawn_graceful(
        name: &str,
        command: Command,
        log: &Path,
        grace: std::time::Duration,
    ) -> anyhow::Result<Supervised> {
        Self::spawn_with(name, command, log, Some(grace))
    }

    fn spawn_with(
        name: &str,
        mut command: Command,
        log: &Path,
        graceful: Option<std::time::Duration>,
    ) -> anyhow::Result<Supervised> {
        let output = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("failed to open log file {}", log.display()))?;
        let log_start = output.metadata().map_or(0, |meta| meta.len());
        let errors = output.try_clone().with_context(|| format!("failed to duplicate log file {}", log.display()))?;
        command.stdin(Stdio::null()).stdout(Stdio::from(output)).stderr(Stdio::from(errors));
        let death_signal = if graceful.is_some() { libc::SIGTERM } else { libc::SIGKILL };
        let child = spawn_on_spawner_thread(command, death_signal)
            .with_context(|| format!("failed to start {name} (log: {})", log.display()))?;
        match graceful {
            Some(grace) => register_graceful(child.id(), grace),
            None => register(child.id()),
        }
        Ok(Supervised { name: name.to_owned(), child, log: log.to_owned(), log_start, reaped: false, graceful })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The component name, e.g. `kube-apiserver`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The log file that receives the child's stdout and stderr.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Sends `signal` (e.g. `libc::SIGSTOP`) to the child, if it has not been reaped.
    pub fn signal(&self, signal: i32) {
        if self.reaped {
            return;
        }
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: a plain syscall on our own, not yet reaped, child.
            unsafe { libc::kill(pid, signal) };
        }
    }

    /// Waits up to `timeout` for the child to exit (polling without blocking the async
    /// runtime); returns its status, or `None` if it is still running.
    pub async fn wait_exit(&mut self, timeout: std::time::Duration) -> Option<ExitStatus> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.exit_status() {
                return Some(status);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// What this child (not its predecessors) wrote to the log: the last `lines` lines.
    pub fn log_tail(&self, lines: usize) -> String {
        let Ok(bytes) = std::fs::read(&self.log) else {
            return String::new();
        };
        let start = usize::try_from(self.log_start).map_or(bytes.len(), |start| start.min(bytes.len()));
        let text = String::from_utf8_lossy(&bytes[start..]);
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The exit status if the child has exited (and is then reaped), without blocking.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        match self.child.try_wait() {
            Ok(Some(status)) => {
                self.mark_reaped();
                Some(status)
            }
            Ok(None) | Err(_) => None,
        }
    }

    /// SIGKILLs the child and waits for it, so that its pid and ports are free on return.
    pub fn kill_and_reap(mut self) {
        self.kill_and_reap_in_place();
    }

    /// SIGKILLs the child at once, even a graceful one (a crash: no teardown), and waits
    /// for it, so that everything it held (its locks, its pid) is released on return.
    pub fn crash(mut self) {
        self.graceful = None;
        self.kill_and_reap_in_place();
    }

    fn kill_and_reap_in_place(&mut self) {
        if self.reaped {
            return;
        }
        if let Some(grace) = self.graceful {
            self.signal(libc::SIGTERM);
            let deadline = std::time::Instant::now() + grace;
            while std::time::Instant::now() < deadline {
                if self.exit_status().is_some() {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
        // kill() fails only if the child already exited; wait() reaps it either way.
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.mark_reaped();
    }

    fn mark_reaped(&mut self) {
        self.reaped = true;
        unregister(self.child.id());
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.kill_and_reap_in_place();
    }
}

/// Whether `pid` names a live process or an unreaped zombie (`kill(pid, 0)` succeeds or
/// fails with EPERM rather than ESRCH).
#[must_use]
pub fn process_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 performs only the existence and permission checks.
    let result = unsafe { libc::kill(pid, 0) };
    result == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

type SpawnRequest = (Command, libc::c_int, mpsc::Sender<io::Result<Child>>);

/// Sends `command` to the spawner thread and waits for the spawned child.
fn spawn_on_spawner_thread(command: Command, death_signal: libc::c_int) -> io::Result<Child> {
    static SPAWNER: OnceLock<mpsc::Sender<SpawnRequest>> = OnceLock::new();
    let requests = SPAWNER.get_or_init(|| {
        let (requests, incoming) = mpsc::channel::<SpawnRequest>();
        // The sender lives in a static, so this thread never ends, and neither does the
        // PR_SET_PDEATHSIG protection of the children it spawns.
        thread::Builder::new()
            .name("leasehold-harness-spawner".into())
            .spawn(move || {
                for (mut command, death_signal, reply) in incoming {
                    let _ = reply.send(spawn_with_parent_death_signal(&mut command, death_signal));
                }
            })
            .expect("the OS refused to start the harness spawner thread");
        requests
    });
    let (reply, response) = mpsc::channel();
    requests
        .send((command, death_signal, reply))
        .map_err(|_| io::Error::other("the harness spawner thread is gone"))?;
    response.recv().map_err(|_| io::Error::other("the harness spawner thread dropped a request"))?
}

fn spawn_with_parent_death_signal(command: &mut Command, death_signal: libc::c_int) -> io::Result<Child> {
    ensure_exit_hook();
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and calls only the
    // async-signal-safe prctl and getppid; it does not allocate (last_os_error and
    // from_raw_os_error build the error without allocating).
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, death_signal as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // If the test process died between fork and prctl, no signal will ever come.
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    command.spawn()
}

/// Pids of children that are running or not yet reaped.
fn live_children() -> MutexGuard<'static, Vec<u32>> {
    static LIVE: Mutex<Vec<u32>> = Mutex::new(Vec::new());
    LIVE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Directories removed at exit, after the children that write to them are dead.
fn exit_cleanup_dirs() -> MutexGuard<'static, Vec<PathBuf>> {
    static DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
    DIRS.lock().unwrap_or_else(PoisonError::into_inner)
}

fn register(pid: u32) {
    live_children().push(pid);
}

fn unregister(pid: u32) {
    live_children().retain(|live| *live != pid);
    graceful_children().retain(|(live, _)| *live != pid);
}

/// Children that get SIGTERM and a grace period at exit, before the others are killed.
fn graceful_children() -> MutexGuard<'static, Vec<(u32, std::time::Duration)>> {
    static LIVE: Mutex<Vec<(u32, std::time::Duration)>> = Mutex::new(Vec::new());
    LIVE.lock().unwrap_or_else(PoisonError::into_inner)
}

fn register_graceful(pid: u32, grace: std::time::Duration) {
    graceful_children().push((pid, grace));
}

/// Removes `dir` when the process exits, unless a test failed (see [`keep_logs`]).
pub(crate) fn remove_at_exit(dir: PathBuf) {
    ensure_exit_hook();
    exit_cleanup_dirs().push(dir);
}

/// Remembers that something failed, so that control-plane directories (and the child
/// logs in them) are kept for inspection instead of being removed.
pub(crate) fn keep_logs() {
    KEEP_LOGS.store(true, Ordering::SeqCst);
}

/// Whether [`keep_logs`] was called.
pub(crate) fn logs_kept() -> bool {
    KEEP_LOGS.load(Ordering::SeqCst)
}

static KEEP_LOGS: AtomicBool = AtomicBool::new(false);

fn ensure_exit_hook() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        // SAFETY: registers a plain `extern "C"` function that never unwinds.
        let registered = unsafe { libc::atexit(kill_children_at_exit) };
        // Without the hook the shared control plane would be left running when tests pass.
        assert_eq!(registered, 0, "atexit refused the harness exit hook");
    });
}

/// SIGKILLs and reaps every registered child, then removes the registered directories.
extern "C" fn kill_children_at_exit() {
    let graceful: Vec<(u32, std::time::Duration)> = graceful_children().drain(..).collect();
    for &(pid, _) in &graceful {
        if let Ok(pid) = libc::pid_t::try_from(pid) {
            // SAFETY: plain syscall on our own child's pid.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
    }
    for (pid, grace) in graceful {
        let Ok(pid) = libc::pid_t::try_from(pid) else { continue };
        let deadline = std::time::Instant::now() + grace;
        loop {
            let mut status = 0;
            // SAFETY: as above; `status` is a valid out-pointer.
            let done = unsafe { libc::waitpid(pid, &raw mut status, libc::WNOHANG) };
            if done != 0 {
                break;
            }
            if std::time::Instant::now() >= deadline {
                // SAFETY: as above.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &raw mut status, 0);
                }
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    let pids: Vec<u32> = live_children().drain(..).collect();
    for &pid in &pids {
        if let Ok(pid) = libc::pid_t::try_from(pid) {
            // SAFETY: plain syscalls on our own children's pids.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    for &pid in &pids {
        if let Ok(pid) = libc::pid_t::try_from(pid) {
            let mut status = 0;
            // SAFETY: as above; `status` is a valid out-pointer.
            unsafe { libc::waitpid(pid, &raw mut status, 0) };
        }
    }
    let dirs: Vec<PathBuf> = exit_cleanup_dirs().drain(..).collect();
    for dir in dirs {
        if logs_kept() {
            eprint_direct(&format!(
                "leasehold-harness: kept control-plane directory {} (a test failed)",
                dir.display()
            ));
        } else {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// Writes a line straight to the stderr file descriptor, bypassing libtest's capture,
/// for the few messages that must show even when the test that triggered them passes.
pub(crate) fn eprint_direct(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(io::stderr(), "{line}");
}
