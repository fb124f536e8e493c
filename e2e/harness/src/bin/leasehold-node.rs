//! `leasehold-node`: a real single-node cluster in namespaces of its own (see
//! `leasehold_harness::node`).
//!
//! ```text
//! leasehold-node up   --dir DIR [--image ARCHIVE]... [--relay-port PORT]   # foreground; SIGTERM stops it
//! leasehold-node down --dir DIR                                           # stop it and remove its leftovers
//! ```
//! `up` first removes whatever an earlier run in DIR (or the last node on this machine)
//! left, and writes `DIR/node.json` and `DIR/kubeconfig` once the node is ready. Needs root.

use std::path::PathBuf;

use leasehold_harness::node::supervisor::{UpOptions, down, up};

fn usage() -> ! {
    eprintln!(
        "usage: leasehold-node up --dir DIR [--image ARCHIVE]... [--relay-port PORT]\n       leasehold-node down --dir DIR"
    );
    std::process::exit(64)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let command = args.next().unwrap_or_else(|| usage());
    let (mut dir, mut images, mut relay_port) = (None, Vec::new(), 0u16);
    while let Some(arg) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| usage());
        match arg.as_str() {
            "--dir" => dir = Some(PathBuf::from(value())),
            "--image" => images.push(PathBuf::from(value())),
            "--relay-port" => relay_port = value().parse().unwrap_or_else(|_| usage()),
            _ => usage(),
        }
    }
    let Some(dir) = dir else { usage() };
    let result = match command.as_str() {
        // Single-threaded until the namespaces are entered (inside `up`).
        "up" => up(UpOptions { dir, images, relay_port }),
        "down" => down(&dir).map(|found| {
            for line in found {
                eprintln!("leasehold-node: {line}");
            }
            eprintln!("leasehold-node: nothing of the node in {} is left", dir.display());
        }),
        _ => usage(),
    };
    if let Err(error) = result {
        eprintln!("leasehold-node: {error:#}");
        std::process::exit(1);
    }
}
