//! Exposes the resolved kube-lease-manager and kube versions (from Cargo.lock)
//! as compile-time environment variables, so the JSON names exactly what was
//! measured without a hand-maintained constant.

use std::{env, fs, path::Path};

fn locked_version(lock: &str, name: &str) -> String {
    let needle = format!("name = \"{name}\"\nversion = \"");
    lock.find(&needle)
        .and_then(|i| {
            let rest = &lock[i + needle.len()..];
            rest.find('"').map(|end| rest[..end].to_string())
        })
        .unwrap_or_else(|| "unknown".to_string())
}

fn main() {
    let dir = env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR");
    let lock_path = Path::new(&dir).join("Cargo.lock");
    println!("cargo:rerun-if-changed={}", lock_path.display());
    let lock = fs::read_to_string(&lock_path).unwrap_or_default();
    println!("cargo:rustc-env=PEER_CRATE_VERSION={}", locked_version(&lock, "kube-lease-manager"));
    println!("cargo:rustc-env=PEER_KUBE_VERSION={}", locked_version(&lock, "kube"));
}
