//! `leasehold run` pods: each runs, again and again, a command under the job lock. The
//! command is a shell that writes the fenced PostgreSQL row with its token five times a
//! second through two pipelines — one of them in a background subshell, so the writers
//! are the command's children and grandchildren — for two to six seconds.
//!
//! Every write is recorded with PostgreSQL's own clock, whether it was applied or not: a
//! command believes it holds the lock for as long as it writes, so a write from a command
//! (or from what it left behind) after the lock was granted to someone else is an overlap
//! of beliefs, whatever the fenced row did with it.

use std::os::unix::process::CommandExt as _;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_harness::Supervised;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use super::history::{Op, Resource};
use super::world::{JOB_LOCK, Worker, World, random};

/// The command: `RUN_STEPS` writes by the child pipeline, while a background subshell
/// writes until the child is done; nothing writes past `RUN_LIMIT` seconds after start.
const SCRIPT: &str = r#"
set -u
T="$LEASEHOLD_FENCING_TOKEN"
L="${LEASEHOLD_LOCK#*/}"
LIMIT_AT=$(( $(date +%s) + RUN_LIMIT ))
writer() {
  i=0
  while [ "$(date +%s)" -lt "$LIMIT_AT" ] && [ ! -e "$STOP" ]; do
    echo "WITH u AS (UPDATE fenced SET value = value + 1, token = $T WHERE id = '$L' AND token <= $T RETURNING id), a AS (INSERT INTO fenced_audit (id, writer, token) SELECT id, '$1', $T FROM u) INSERT INTO run_writes (run, writer, token, applied) SELECT '$RUN_ID', '$1', $T, EXISTS (SELECT 1 FROM u);"
    i=$((i + 1))
    if [ "$2" -gt 0 ] && [ "$i" -ge "$2" ]; then break; fi
    sleep 0.2
  done | psql -q -X "$PGURL" >/dev/null 2>&1
}
writer "$RUN_ID/grandchild" 0 &
writer "$RUN_ID/child" "$RUN_STEPS"
touch "$STOP"
wait
"#;

/// Kills process group `group` (what a command left behind), if it still exists.
pub fn kill_group(group: i32) {
    let _ = killpg(Pid::from_raw(group), Signal::SIGKILL);
}

/// The loop of a `leasehold run` pod, until it is stopped.
pub async fn run(world: Arc<World>, worker: Arc<Worker>) {
    let identity = worker.pod.identity().id;
    let dir = world.env.log_dir();
    let mut n = 0;
    while !worker.stop.is_cancelled() {
        n += 1;
        let id = format!("{}-r{n}", worker.name);
        world.identities.lock().expect("lock").insert(id.clone(), identity.clone());
        let mut command = Command::new(&world.run_bin);
        command
            .args(["run", "--lock", &format!("{}/{JOB_LOCK}", world.env.name()), "--wait", "30s", "--"])
            .args(["sh", "-c", SCRIPT])
            .env("KUBECONFIG", &worker.kubeconfig)
            .env("RUST_LOG", "info,kube=warn")
            .env("PGURL", world.pg.url())
            .env("RUN_ID", &id)
            .env("RUN_STEPS", (10 + random(21)).to_string())
            .env("RUN_LIMIT", "15")
            .env("STOP", dir.join(format!("stop-{id}")))
            // Its own process group: what the command leaves behind can be found (and
            // killed at the end of the run).
            .process_group(0);
        let log = std::env::temp_dir().join(format!("leasehold-e2e-{}-{}.log", worker.name, std::process::id()));
        let Ok(process) = Supervised::spawn(&id, command, &log) else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        world.groups.lock().expect("lock").push(i32::try_from(process.pid()).expect("a pid fits i32"));
        *worker.run.lock().expect("lock") = Some(process);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let exited = worker.run.lock().expect("lock").as_mut().is_none_or(|p| p.exit_status().is_some());
            if exited || Instant::now() > deadline {
                break;
            }
            tokio::select! {
                _ = worker.stop.cancelled() => break,
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
        // Dropping it kills `leasehold run` if it still runs (the run is stopping).
        drop(worker.run.lock().expect("lock").take());
        super::app::pace(&worker, 200).await;
    }
}

/// Sends `signal` to the `leasehold run` process of `worker`, if one runs.
pub fn signal_run(worker: &Worker, signal: i32) -> bool {
    let mut guard = worker.run.lock().expect("lock");
    let Some(p) = guard.as_mut() else { return false };
    if p.exit_status().is_some() {
        return false;
    }
    p.signal(signal);
    true
}

/// Reads back what every command wrote, into the history.
pub async fn collect(world: &World) {
    let rows = world
        .db
        .query(
            "SELECT run, token, applied, (extract(epoch from at) * 1000000)::bigint FROM run_writes ORDER BY seq",
            &[],
        )
        .await
        .expect("read the commands' writes");
    for row in rows {
        let (run, token, applied, micros): (String, i64, bool, i64) = (row.get(0), row.get(1), row.get(2), row.get(3));
        let Some(at) = world.pg_instant(micros) else { continue };
        world.history.log_at(at, &run, JOB_LOCK, Op::Act { token });
        world.history.log_at(
            at,
            &run,
            JOB_LOCK,
            Op::Write { resource: Resource::Postgres, token, applied, believed: true, sent: at },
        );
    }
}
