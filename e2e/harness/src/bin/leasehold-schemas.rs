//! `leasehold-schemas`: prints the directory of strict kubeconform schemas for the pinned
//! Kubernetes release (see `leasehold_harness::schemas`), after generating them from a
//! throwaway control plane's `/openapi/v2` if the cache lacks them. Used by `make lint`.

fn main() -> anyhow::Result<()> {
    if let Some(arg) = std::env::args().nth(1) {
        anyhow::bail!("unknown argument {arg:?}; usage: leasehold-schemas");
    }
    let root = leasehold_harness::schemas::root()?;
    let version = leasehold_harness::schemas::pinned_release()?;
    if !leasehold_harness::schemas::release_dir(&root, &version).is_dir() {
        eprintln!("leasehold-schemas: generating the {version} schemas from a throwaway control plane");
        let control_plane = leasehold_harness::ControlPlane::start()?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        runtime.block_on(leasehold_harness::schemas::ensure(&control_plane))?;
    }
    println!("{}", root.display());
    Ok(())
}
