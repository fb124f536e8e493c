//! The faults that hit every lock: the controllers (killed, paused, all down, their wall
//! clock jumped or frozen), the apiserver and etcd (restarted), and a lock deleted and
//! re-created. Recovery counts from the end of the outage or pause.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::DeleteParams;

use super::history::Fault;
use super::world::{ELECTION, LEASE, World, set_clock};

/// Faults that hit everything.
pub const GLOBAL: &[&str] = &[
    "pod-deleted-controllers-down",
    "leader-killed",
    "controller-clock-forward",
    "apiserver-restart",
    "leader-sigstop",
    "controller-clock-frozen",
    "etcd-restart",
    "controllers-down",
    "controller-clock-backward",
    "lock-recreated",
];

/// Global faults that run alone; the others run alongside the faults on single locks.
pub const EXCLUSIVE: &[&str] =
    &["controllers-down", "pod-deleted-controllers-down", "apiserver-restart", "etcd-restart", "lock-recreated"];

/// How long a controller stays paused, or its clock off.
const PAUSE: Duration = Duration::from_secs(6);

/// Injects global fault `kind`.
pub async fn global(world: &Arc<World>, kind: &'static str) -> Fault {
    let start = Instant::now();
    let leader = world.leader().await;
    let mut note = format!("leader: {leader:?}");
    match kind {
        "leader-killed" => {
            if let Some(i) = leader {
                world.kill_controller(i);
                world.start_controller(i).await;
            }
        }
        "leader-sigstop" => {
            // Longer than the election lease: the other replica takes over meanwhile.
            let i = leader.unwrap_or(0);
            world.signal_controller(i, libc::SIGSTOP);
            tokio::time::sleep(ELECTION + Duration::from_secs(3)).await;
            world.signal_controller(i, libc::SIGCONT);
        }
        "controller-clock-forward" | "controller-clock-backward" | "controller-clock-frozen" => {
            let i = leader.unwrap_or(0);
            let setting = match kind {
                "controller-clock-forward" => "+3600".to_owned(),
                "controller-clock-backward" => "-3600".to_owned(),
                _ => jiff::Timestamp::now().strftime("%Y-%m-%d %H:%M:%S").to_string(),
            };
            note = format!("{note}; replica {i}'s wall clock: {setting}");
            set_clock(world.controller_clock(i), &setting);
            tokio::time::sleep(PAUSE).await;
            set_clock(world.controller_clock(i), "+0");
        }
        "pod-deleted-controllers-down" => {
            // No controller can revoke the hold: the holder learns it is gone only from
            // its renewals being refused once its token is.
            let target = world.wait_holder(&world.locks[0]).await;
            world.kill_controller(0);
            world.kill_controller(1);
            if let Some(target) = target {
                super::inject::force_delete(world, &target).await;
                let refused = super::inject::refused(world, &target).await;
                note = format!("{note}; {}'s token refused after {:?}", target.name, refused.map(|r| r - start));
                // Time for its sidecar to tell its app, before a controller can revoke.
                tokio::time::sleep(LEASE).await;
                let (world, target) = (world.clone(), target.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(LEASE).await;
                    world.retire(&target).await;
                });
            }
            world.start_controller(0).await;
            world.start_controller(1).await;
        }
        "controllers-down" => {
            world.kill_controller(0);
            world.kill_controller(1);
            tokio::time::sleep(Duration::from_secs(3)).await;
            world.start_controller(0).await;
            world.start_controller(1).await;
        }
        "apiserver-restart" => {
            let cp = world.env.cp;
            tokio::task::spawn_blocking(move || cp.restart_apiserver())
                .await
                .expect("join")
                .expect("restart the apiserver");
        }
        "etcd-restart" => {
            let cp = world.env.cp;
            tokio::task::spawn_blocking(move || {
                cp.stop_etcd();
                cp.start_etcd()
            })
            .await
            .expect("join")
            .expect("restart etcd");
        }
        "lock-recreated" => {
            let lock = world.locks[0].clone();
            let _ = world.env.locks().delete(&lock, &DeleteParams::default()).await;
            crate::support::watch::until_gone(&world.env.locks(), &lock, Duration::from_secs(60), "the lock deleted")
                .await;
            world.env.lock(&lock, super::world::timing()).await;
        }
        other => panic!("unknown global fault {other}"),
    }
    let locks = if kind == "lock-recreated" { vec![world.locks[0].clone()] } else { world.all_locks() };
    Fault { kind, locks, start, recover_from: Instant::now(), lease: LEASE, victim: None, note }
}
