//! The three worker "pods": a Pod object with a Pod-bound token, a real sidecar process,
//! and the app loop — acquire through the sidecar, decrement the stock with the fencing
//! token, hold a moment, release.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::ResourceExt;
use leasehold_harness::{Supervised, TestNamespace};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// Something a worker did.
#[derive(Debug)]
pub enum Happened {
    /// Granted; the worker waits for `proceed` before its critical section (the director
    /// uses that moment to freeze it).
    Acquired { worker: String, token: i64, waited: Duration, proceed: oneshot::Sender<()> },
    /// The decrement was applied.
    Decremented { worker: String, token: i64, stock: i64 },
    /// The decrement was refused: a higher token had written.
    Rejected { worker: String, token: i64, current: i64 },
    /// Nothing left to decrement.
    SoldOut { worker: String },
    /// Released; `was_held` as the sidecar reported it.
    Released { worker: String, token: i64, was_held: bool },
}

/// One worker pod.
pub struct Worker {
    /// Pod name.
    pub name: String,
    /// Its sidecar (SIGSTOP/SIGCONT for the freeze).
    pub sidecar: Mutex<Option<Supervised>>,
    /// The sidecar's lock API.
    pub api: SocketAddr,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(17070)
}

impl Worker {
    /// Creates the Pod and starts its sidecar.
    pub async fn start(ns: &TestNamespace, leasehold: &Path, name: &str, dir: &Path) -> anyhow::Result<Worker> {
        let pod = ns.pod(name, "worker", &[("app", "demo-worker")]).await;
        let token = ns.pod_token("worker", &pod).await;
        let kubeconfig = dir.join(format!("{name}.kubeconfig"));
        ns.kubeconfig_for_token(&token, &kubeconfig)?;
        let api = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut command = Command::new(leasehold);
        command
            .args(["sidecar", "--listen", &api.to_string(), "--admin-addr", &admin.to_string()])
            .env("KUBECONFIG", &kubeconfig)
            .env("POD_NAMESPACE", &ns.name)
            .env("POD_NAME", name)
            .env("POD_UID", pod.uid().unwrap_or_default())
            .env("RUST_LOG", "info,kube=warn");
        let sidecar = Supervised::spawn(&format!("sidecar-{name}"), command, &dir.join(format!("{name}.log")))?;
        crate::setup::wait_healthy(admin, Duration::from_secs(60)).await?;
        Ok(Worker { name: name.to_owned(), sidecar: Mutex::new(Some(sidecar)), api })
    }

    /// Sends a signal to the sidecar.
    pub fn signal(&self, signal: i32) {
        if let Some(s) = self.sidecar.lock().expect("not poisoned").as_ref() {
            s.signal(signal);
        }
    }
}

/// The app loop of `worker` until `stop`.
pub async fn run(
    worker: Arc<Worker>,
    db: Arc<tokio_postgres::Client>,
    events: mpsc::UnboundedSender<Happened>,
    stop: CancellationToken,
) {
    let lock = crate::LOCK;
    while !stop.is_cancelled() {
        let asked = Instant::now();
        let body = r#"{"waitSeconds": 30}"#;
        let path = format!("/v1/locks/{lock}/acquire");
        let reply = tokio::select! {
            _ = stop.cancelled() => return,
            r = crate::http::request(worker.api, "POST", &path, Some(body)) => r,
        };
        let Some((200, granted)) = reply else { continue };
        let Some(token) = granted["fencingToken"].as_i64() else { continue };
        let (proceed, go) = oneshot::channel();
        let _ =
            events.send(Happened::Acquired { worker: worker.name.clone(), token, waited: asked.elapsed(), proceed });
        // Frozen here if the director chose us: we resume with the token we had, like an
        // app that paused (GC, swap, a stopped VM) between its check and its write.
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = go => {}
        }
        match db.query(crate::setup::DECREMENT, &[&token]).await {
            Ok(rows) if !rows.is_empty() => {
                let stock: i64 = rows[0].get(0);
                let _ = events.send(Happened::Decremented { worker: worker.name.clone(), token, stock });
            }
            Ok(_) => {
                let (stock, current) = db
                    .query_one("SELECT stock, token FROM inventory WHERE item = 'widget'", &[])
                    .await
                    .map(|r| (r.get::<_, i64>(0), r.get::<_, i64>(1)))
                    .unwrap_or((0, 0));
                let happened = if current > token {
                    Happened::Rejected { worker: worker.name.clone(), token, current }
                } else {
                    let _ = stock;
                    Happened::SoldOut { worker: worker.name.clone() }
                };
                let _ = events.send(happened);
            }
            Err(_) => {}
        }
        // The rest of the critical section: work done while holding (the workload, not a wait).
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(800)) => {}
        }
        let released = crate::http::request(worker.api, "POST", &format!("/v1/locks/{lock}/release"), None).await;
        let was_held = released.is_some_and(|(_, body)| body["wasHeld"].as_bool() == Some(true));
        let _ = events.send(Happened::Released { worker: worker.name.clone(), token, was_held });
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(300)) => {}
        }
    }
}
