//! [`Postgres`]: a throwaway PostgreSQL server on loopback, for tests and examples of
//! resource-side fencing (a database that rejects writes carrying a stale fencing token).
//!
//! It uses the server binaries of the machine's PostgreSQL installation (Debian's
//! `postgresql` package), found with `pg_config --bindir` or under
//! `/usr/lib/postgresql/<version>/bin`. Each instance gets a fresh temporary cluster
//! (`initdb`), listens on `127.0.0.1:<free port>` only (its Unix socket lives in the
//! temporary directory, not in `/var/run/postgresql`), trusts every local connection,
//! and runs with `fsync=off`: durability across an OS crash is worthless here, and
//! skipping it makes start-up and writes fast. `synchronous_commit` stays on (without
//! fsync it costs only a `write`), so a commit is in the OS's page cache before it is
//! acknowledged and survives [`Postgres::stop`], which kills the server like a crash.
//!
//! PostgreSQL refuses to run as root, and tests do run as root on the CI machines, so
//! `initdb` and `postgres` then run as the `postgres` OS user (set with `setuid`/`setgid`
//! when spawning: no `su`/`runuser` needed), in a directory handed over to that user.
//!
//! The server is a [`Supervised`] child: killed if the test process dies, whatever the
//! way. Dropping a [`Postgres`] shuts the server down and removes its directory.

#![allow(unsafe_code)] // geteuid and getpwnam_r: libc.

use std::{
    ffi::CString,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Command,
    sync::{Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use anyhow::{Context as _, anyhow, bail};
use tempfile::TempDir;

use crate::{
    components,
    process::Supervised,
    wait::{self, Probe},
};

/// What is needed from the installation: cluster creation, the server, and a readiness
/// check that speaks the protocol (a TCP connect succeeds before the server is ready).
const REQUIRED_BINARIES: [&str; 3] = ["initdb", "postgres", "pg_isready"];

const NOT_FOUND: &str =
    "PostgreSQL server binaries not found: install the Debian package postgresql (apt-get install -y postgresql)";

/// The OS user that runs the server when the tests run as root.
const SERVER_USER: &str = "postgres";

/// Creating a cluster takes about a second; a loaded 2-core machine can take much longer.
const INITDB_TIMEOUT: Duration = Duration::from_secs(120);

/// Start-up takes about a second; a loaded 2-core machine can take much longer.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// An immediate shutdown takes milliseconds; past this the server is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// Attempts at starting on a free port, which another process may take first.
const PORT_ATTEMPTS: u32 = 3;

/// Log lines quoted in start-up errors.
const LOG_LINES_IN_ERRORS: usize = 20;

/// A running PostgreSQL server with a fresh cluster: superuser `postgres`, database
/// `postgres`, no password.
///
/// Blocking methods block the calling thread (the waiting runs on a helper thread with
/// its own runtime), so they may be called from `#[tokio::test]`.
pub struct Postgres {
    // Declared first so that the server stops before its directory goes.
    server: Mutex<Option<Supervised>>,
    bin_dir: PathBuf,
    run_as: Option<Owner>,
    port: u16,
    log: PathBuf,
    dir: TempDir,
}

/// The uid and gid the server runs as.
#[derive(Debug, Clone, Copy)]
struct Owner {
    uid: u32,
    gid: u32,
}

impl Postgres {
    /// Creates a cluster in a temporary directory and starts a server on a free loopback
    /// port; returns once it accepts connections. Takes one to a few seconds.
    pub fn start() -> anyhow::Result<Postgres> {
        let bin_dir = locate_binaries()?;
        let run_as = server_owner()?;
        let dir = tempfile::Builder::new()
            .prefix("leasehold-postgres-")
            .tempdir()
            .context("failed to create a directory for PostgreSQL")?;
        if let Some(owner) = run_as {
            std::os::unix::fs::chown(dir.path(), Some(owner.uid), Some(owner.gid))
                .with_context(|| format!("failed to hand {} to the {SERVER_USER} user", dir.path().display()))?;
        }
        let log = dir.path().join("postgres.log");
        let mut postgres = Postgres { server: Mutex::new(None), bin_dir, run_as, port: 0, log, dir };
        match postgres.init_and_start() {
            Ok(()) => Ok(postgres),
            Err(error) => {
                // The logs the error points to must outlive this handle.
                postgres.dir.disable_cleanup(true);
                Err(error.context(format!(
                    "failed to start a test PostgreSQL (files kept in {})",
                    postgres.dir.path().display()
                )))
            }
        }
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's log (stdout and stderr of every start).
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The postmaster's process id, if the server is running.
    pub fn pid(&self) -> Option<u32> {
        let mut server = self.lock();
        let running = server.as_mut()?;
        running.exit_status().is_none().then(|| running.pid())
    }

    /// Stops the server the way a crash would, as far as clients can tell: an immediate
    /// shutdown (SIGQUIT) closes every connection at once, skips the checkpoint, and the
    /// next start recovers from the WAL; committed data survives. Returns once the server
    /// has exited. Does nothing if it is not running.
    pub fn stop(&self) {
        let Some(mut server) = self.lock().take() else {
            return;
        };
        // Not SIGKILL: that would orphan the backends, whose shared memory would keep a
        // new server from starting until they noticed and exited.
        server.signal(libc::SIGQUIT);
        if wait::block_on(server.wait_exit(STOP_TIMEOUT)).is_none() {
            tracing::warn!(log = %self.log.display(), "PostgreSQL ignored an immediate shutdown; killing it");
        }
        server.kill_and_reap();
    }

    /// Starts the server again on the same port with the same data, and waits until it
    /// accepts connections. Does nothing if it is running. Fails if another process took
    /// the port meanwhile.
    pub fn start_again(&self) -> anyhow::Result<()> {
        let mut slot = self.lock();
        if let Some(server) = slot.as_mut()
            && server.exit_status().is_none()
        {
            return Ok(());
        }
        let mut server = Supervised::spawn("postgres", self.server_command(), &self.log)?;
        wait::block_on(self.wait_ready(&mut server)).with_context(|| format!("log: {}", self.log.display()))?;
        *slot = Some(server);
        Ok(())
    }

    fn init_and_start(&mut self) -> anyhow::Result<()> {
        self.init_cluster()?;
        for attempt in 1..=PORT_ATTEMPTS {
            let [port] = components::free_ports()?;
            self.port = port;
            match self.start_again() {
                Ok(()) => return Ok(()),
                Err(_) if attempt < PORT_ATTEMPTS && self.lost_port_race() => {}
                Err(error) => return Err(error),
            }
        }
        bail!("PostgreSQL lost the race for its port {PORT_ATTEMPTS} times")
    }

    fn lock(&self) -> MutexGuard<'_, Option<Supervised>> {
        self.server.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// A command for one of the installation's binaries, run as the server's owner from
    /// inside its directory (the test's working directory may be closed to that user).
    fn command(&self, binary: &str) -> Command {
        use std::os::unix::process::CommandExt as _;
        let mut command = Command::new(self.bin_dir.join(binary));
        command.current_dir(self.dir.path());
        // Connection settings of the developer's environment must not redirect anything.
        for variable in ["PGHOST", "PGPORT", "PGDATA", "PGUSER", "PGDATABASE", "PGSERVICE", "PGPASSWORD"] {
            command.env_remove(variable);
        }
        if let Some(owner) = self.run_as {
            // std sets these before the harness's pre_exec hook runs, so the
            // parent-death signal set there survives the change of user.
            command.uid(owner.uid).gid(owner.gid);
        }
        command
    }

    /// `initdb`: superuser `postgres`, trust authentication, C locale. Supervised like
    /// the server, so that it too dies with the test process.
    fn init_cluster(&self) -> anyhow::Result<()> {
        let mut initdb = self.command("initdb");
        initdb.arg("--pgdata").arg(self.data_dir()).args([
            "--username=postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        ]);
        let log = self.dir.path().join("initdb.log");
        let mut initdb = Supervised::spawn("initdb", initdb, &log)?;
        match wait::block_on(initdb.wait_exit(INITDB_TIMEOUT)) {
            Some(status) if status.success() => Ok(()),
            Some(status) => bail!(
                "initdb failed ({status}); last lines of {}:\n{}",
                log.display(),
                initdb.log_tail(LOG_LINES_IN_ERRORS)
            ),
            None => bail!("initdb did not finish within {INITDB_TIMEOUT:?}; log: {}", log.display()),
        }
    }

    fn server_command(&self) -> Command {
        let mut postgres = self.command("postgres");
        postgres.arg("-D").arg(self.data_dir()).arg("-p").arg(self.port.to_string());
        postgres.arg("-c").arg(format!("unix_socket_directories={}", self.dir.path().display()));
        for setting in [
            "listen_addresses=127.0.0.1",
            "fsync=off",
            "full_page_writes=off",
            "shared_buffers=32MB",
            "max_connections=50",
            "lc_messages=C",
        ] {
            postgres.arg("-c").arg(setting);
        }
        postgres
    }

    /// Waits until `pg_isready` reports that the server accepts connections, failing fast
    /// if the server exits.
    async fn wait_ready(&self, server: &mut Supervised) -> anyhow::Result<()> {
        let port = self.port.to_string();
        wait::poll("PostgreSQL to accept connections", READY_TIMEOUT, || {
            let exited = server.exit_status().map(|status| {
                anyhow!(
                    "postgres exited ({status}); log {}, last lines:\n{}",
                    server.log().display(),
                    server.log_tail(LOG_LINES_IN_ERRORS)
                )
            });
            let mut probe = tokio::process::Command::from(self.command("pg_isready"));
            probe.args(["--host", &Ipv4Addr::LOCALHOST.to_string(), "--port", &port, "--timeout=2"]);
            probe.args(["--username=postgres", "--dbname=postgres"]);
            async move {
                if let Some(error) = exited {
                    return Probe::Fatal(error);
                }
                match probe.output().await {
                    Ok(output) if output.status.success() => Probe::Ready(()),
                    Ok(output) => Probe::NotYet(String::from_utf8_lossy(&output.stdout).trim().to_owned()),
                    Err(error) => Probe::Fatal(anyhow!(error).context("failed to run pg_isready")),
                }
            }
        })
        .await
    }

    fn lost_port_race(&self) -> bool {
        std::fs::read_to_string(&self.log).is_ok_and(|log| log.contains("could not bind IPv4 address"))
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            self.dir.disable_cleanup(true);
            eprintln!("leasehold-harness: kept PostgreSQL directory {} (a test failed)", self.dir.path().display());
        }
    }
}

/// The directory with the server binaries: `pg_config --bindir` if it has them, else the
/// newest `/usr/lib/postgresql/<version>/bin`.
fn locate_binaries() -> anyhow::Result<PathBuf> {
    let from_pg_config = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()));
    let mut debian: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| Some((entry.file_name().to_str()?.parse().ok()?, entry.path().join("bin"))))
        .collect();
    debian.sort_by_key(|(version, _)| std::cmp::Reverse(*version));
    from_pg_config
        .into_iter()
        .chain(debian.into_iter().map(|(_, dir)| dir))
        .find(|dir| REQUIRED_BINARIES.iter().all(|binary| dir.join(binary).is_file()))
        .ok_or_else(|| anyhow!(NOT_FOUND))
}

/// Who runs the server: nobody in particular (the current user) unless that is root.
fn server_owner() -> anyhow::Result<Option<Owner>> {
    // SAFETY: geteuid cannot fail and has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let owner = user_ids(SERVER_USER).with_context(|| {
        format!(
            "PostgreSQL refuses to run as root and there is no {SERVER_USER} user to run it as \
             (the Debian package postgresql creates it)"
        )
    })?;
    Ok(Some(owner))
}

/// The uid and gid of user `name`, from the system's user database.
fn user_ids(name: &str) -> Option<Owner> {
    let name = CString::new(name).ok()?;
    // SAFETY: `passwd` is plain data (integers and pointers); all-zero is a valid value.
    let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
    let mut strings = vec![0 as libc::c_char; 16 * 1024];
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call and `strings.len()` is its real size;
    // the reentrant variant keeps no static state. Only the integer ids are read after.
    let status =
        unsafe { libc::getpwnam_r(name.as_ptr(), &raw mut entry, strings.as_mut_ptr(), strings.len(), &raw mut found) };
    (status == 0 && !found.is_null()).then_some(Owner { uid: entry.pw_uid, gid: entry.pw_gid })
}
