//! `leasehold-image`: writes Leasehold's image as an OCI image archive (`make image`).
//!
//! ```text
//! leasehold-image --binary target/x86_64-unknown-linux-gnu/release/leasehold
//!                 --sidecar-binary target/x86_64-unknown-linux-gnu/release/leasehold-sidecar
//!                 --out target/image/leasehold.oci.tar [--repo DIR] [--reference NAME:TAG]
//! ```
//! The reference defaults to the chart's `image.repository:appVersion`. Prints the image's
//! name, digest and sizes.

use std::path::PathBuf;

use anyhow::Context as _;
use leasehold_image::{Reference, leasehold, write_archive};

fn usage() -> ! {
    eprintln!(
        "usage: leasehold-image --binary PATH --sidecar-binary PATH --out PATH [--repo DIR] [--reference NAME:TAG]"
    );
    std::process::exit(64)
}

fn main() -> anyhow::Result<()> {
    let (mut binary, mut sidecar, mut out, mut repo, mut reference) = (None, None, None, PathBuf::from("."), None);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| usage());
        match arg.as_str() {
            "--binary" => binary = Some(PathBuf::from(value())),
            "--sidecar-binary" => sidecar = Some(PathBuf::from(value())),
            "--out" => out = Some(PathBuf::from(value())),
            "--repo" => repo = PathBuf::from(value()),
            "--reference" => reference = Some(Reference::parse(&value())?),
            _ => usage(),
        }
    }
    let (Some(binary), Some(sidecar), Some(out)) = (binary, sidecar, out) else { usage() };
    let spec = leasehold::spec(&repo, &binary, &sidecar, reference)?;
    let built = write_archive(&spec, &out).with_context(|| format!("failed to write {}", out.display()))?;
    println!("image:     {}", built.name);
    println!("digest:    {}", built.digest);
    println!("archive:   {} ({} bytes)", out.display(), built.archive_size);
    println!("layer:     {} bytes compressed, {} bytes unpacked", built.layer_size, built.unpacked_size);
    Ok(())
}
