//! The faults. Each returns the instant from which recovery is measured: the injection
//! itself for faults of one holder (the next grant must come within a lease duration plus
//! a margin), the end of the outage for faults that stop the whole system.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use leasehold_harness::Fault as NetFault;

use super::history::{Fault, Op};
use super::world::{Clock, LEASE, Worker, World};

/// Faults that hit one lock's holder or waiter.
pub const LOCAL: &[&str] = &[
    "holder-sigstop",
    "waiter-sigstop",
    "holder-sigkill",
    "holder-pod-deleted",
    "holder-sigterm",
    "network-drop",
    "network-delay",
    "network-blackhole",
    "clock-ahead",
    "clock-behind",
    "lease-deleted",
];

/// Faults that hit everything.
pub const GLOBAL: &[&str] =
    &["leader-killed", "controllers-down", "apiserver-restart", "etcd-restart", "lock-recreated"];

/// Waits for `d` (the fault's duration: it holds a component stopped or a link broken).
async fn hold_fault(d: Duration) {
    tokio::time::sleep(d).await;
}

/// The holder of `lock`, waiting a little for one to appear (locks are busy).
async fn holder(world: &World, lock: &str) -> Option<Arc<Worker>> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Some(w) = world.holder(lock).await {
            return Some(w);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Injects local fault `kind` on `lock`; returns the fault record, or `None` if there was
/// no target (nobody held the lock).
pub async fn local(world: &Arc<World>, kind: &'static str, lock: &str) -> Option<Fault> {
    let start = Instant::now();
    let locks = vec![lock.to_owned()];
    let record = |end| Some(Fault { kind, locks: locks.clone(), start, end });
    match kind {
        "waiter-sigstop" => {
            let holder = world.holder(lock).await.map(|w| w.name.clone());
            let waiter = world.other_worker(lock, holder.as_deref())?;
            world.signal_sidecar(&waiter, libc::SIGSTOP);
            hold_fault(LEASE + Duration::from_secs(1)).await;
            world.signal_sidecar(&waiter, libc::SIGCONT);
            return record(start);
        }
        "lease-deleted" => {
            let _ = world.env.leases().delete(lock, &DeleteParams::default()).await;
            return record(start);
        }
        _ => {}
    }
    let target = holder(world, lock).await?;
    let start = Instant::now();
    let record = |end| Some(Fault { kind, locks: locks.clone(), start, end });
    match kind {
        "holder-sigstop" => {
            world.signal_sidecar(&target, libc::SIGSTOP);
            hold_fault(LEASE + Duration::from_secs(1)).await;
            world.signal_sidecar(&target, libc::SIGCONT);
            super::worker::zombie(world, &target).await;
        }
        "holder-sigkill" => {
            if let Some(mut p) = target.sidecar.lock().expect("lock").take() {
                world.history.log(&target.name, lock, Op::Died);
                p.kill();
            }
            world.start_sidecar(&target, Clock::Real).await;
        }
        "holder-sigterm" => {
            let process = target.sidecar.lock().expect("lock").take();
            if let Some(mut p) = process {
                world.history.log(&target.name, lock, Op::Died);
                p.terminate(Duration::from_secs(10)).await;
            }
            world.start_sidecar(&target, Clock::Real).await;
        }
        "clock-ahead" | "clock-behind" => {
            let shift = if kind == "clock-ahead" { 3600 } else { -3600 };
            let process = target.sidecar.lock().expect("lock").take();
            if let Some(mut p) = process {
                world.history.log(&target.name, lock, Op::Died);
                p.kill();
            }
            world.start_sidecar(&target, Clock::Shifted(shift)).await;
        }
        "holder-pod-deleted" => {
            world.history.log(&target.name, lock, Op::Died);
            target.stop.cancel();
            let pods: Api<Pod> = Api::namespaced(world.env.ns.client.clone(), world.env.name());
            let _ = pods
                .delete(&target.name, &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() })
                .await;
            if let Some(mut p) = target.sidecar.lock().expect("lock").take() {
                p.kill();
            }
            world.workers.lock().expect("lock").remove(&target.name);
            // Its replacement comes up alongside the recovery (see `World::ensure_workers`).
            let (world, lock, n) = (
                world.clone(),
                lock.to_owned(),
                super::world::WORKERS_PER_LOCK.load(std::sync::atomic::Ordering::Relaxed),
            );
            tokio::spawn(async move { world.ensure_workers(&lock, n).await });
        }
        "network-drop" => {
            target.proxy.set(NetFault::Drop);
            hold_fault(Duration::from_secs(3)).await;
            target.proxy.set(NetFault::Pass);
        }
        "network-delay" => {
            target.proxy.set(NetFault::Delay(Duration::from_millis(1500)));
            hold_fault(Duration::from_secs(5)).await;
            target.proxy.set(NetFault::Pass);
        }
        "network-blackhole" => {
            target.proxy.set(NetFault::Blackhole);
            hold_fault(LEASE + Duration::from_secs(1)).await;
            target.proxy.set(NetFault::Pass);
        }
        other => panic!("unknown local fault {other}"),
    }
    record(start)
}

/// Injects global fault `kind`.
pub async fn global(world: &Arc<World>, kind: &'static str) -> Fault {
    let start = Instant::now();
    let end = match kind {
        "leader-killed" => {
            if let Some(i) = world.leader().await {
                world.kill_controller(i);
                let recovery = Instant::now();
                world.start_controller(i).await;
                recovery
            } else {
                start
            }
        }
        "controllers-down" => {
            world.kill_controller(0);
            world.kill_controller(1);
            hold_fault(Duration::from_secs(3)).await;
            world.start_controller(0).await;
            world.start_controller(1).await;
            Instant::now()
        }
        "apiserver-restart" => {
            let cp = world.env.cp;
            tokio::task::spawn_blocking(move || {
                cp.stop_apiserver();
                cp.start_apiserver()
            })
            .await
            .expect("join")
            .expect("restart the apiserver");
            Instant::now()
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
            Instant::now()
        }
        "lock-recreated" => {
            let lock = world.locks[0].clone();
            let _ = world.env.locks().delete(&lock, &DeleteParams::default()).await;
            crate::support::watch::until_gone(&world.env.locks(), &lock, Duration::from_secs(30), "the lock deleted")
                .await;
            world.env.lock(&lock, super::world::timing()).await;
            Instant::now()
        }
        other => panic!("unknown global fault {other}"),
    };
    let locks = if kind == "lock-recreated" { vec![world.locks[0].clone()] } else { world.locks.clone() };
    Fault { kind, locks, start, end }
}
