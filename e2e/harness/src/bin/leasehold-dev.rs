//! `leasehold-dev`: a local control plane for development and the demo, running until
//! SIGTERM or SIGINT. It writes an admin kubeconfig to `--kubeconfig` and prints the
//! `export KUBECONFIG=...` line once the apiserver is ready.

use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut kubeconfig = PathBuf::from("kubeconfig");
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--kubeconfig" => {
                kubeconfig = PathBuf::from(args.next().ok_or_else(|| anyhow::anyhow!("--kubeconfig needs a path"))?)
            }
            other => anyhow::bail!("unknown argument {other:?}; usage: leasehold-dev [--kubeconfig PATH]"),
        }
    }
    let control_plane = leasehold_harness::ControlPlane::start()?;
    if let Some(dir) = kubeconfig.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::copy(control_plane.kubeconfig_path(), &kubeconfig)?;
    let kubeconfig = std::fs::canonicalize(&kubeconfig)?;
    println!(
        "control plane {} ready at {} (logs: {})",
        control_plane.version(),
        control_plane.server_url(),
        control_plane.work_dir().display()
    );
    println!("export KUBECONFIG={}", kubeconfig.display());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        anyhow::Ok(())
    })?;
    drop(control_plane);
    Ok(())
}
