//! The images the node runs besides Leasehold's: the sandbox ("pause") image and a shell
//! image from Debian's busybox-static, written as OCI archives by the image builder
//! (`image/`) and imported into containerd before kubelet starts (nothing is ever pulled).

use std::path::Path;

use anyhow::Context as _;
use leasehold_image::{Entry, ImageSpec, Reference};

/// Debian's static busybox.
pub const BUSYBOX: &str = "/bin/busybox";

/// `PATH` of the busybox-based images.
const PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The pod sandbox image: the static `pause` from `e2e/node/build.sh`.
pub fn pause(binary: &Path) -> anyhow::Result<ImageSpec> {
    let mut spec = ImageSpec::new(Reference::parse(super::PAUSE_IMAGE)?);
    spec.entries.push(Entry::from_host("/pause", 0o755, binary)?);
    spec.entrypoint = vec!["/pause".into()];
    spec.user = Some("65535:65535".into());
    Ok(spec)
}

/// The files of a busybox userland: the binary, a link per applet, `/etc/passwd` with
/// root and nobody, and a world-writable `/tmp`.
pub fn busybox_entries() -> anyhow::Result<Vec<Entry>> {
    let output = std::process::Command::new(BUSYBOX)
        .arg("--list-full")
        .output()
        .with_context(|| format!("failed to run {BUSYBOX} (Debian's busybox-static)"))?;
    anyhow::ensure!(output.status.success(), "{BUSYBOX} --list-full failed");
    let mut entries = vec![
        Entry::from_host("/bin/busybox", 0o755, Path::new(BUSYBOX))?,
        Entry::file(
            "/etc/passwd",
            0o644,
            b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n".to_vec(),
        ),
        Entry::file("/etc/group", 0o644, b"root:x:0:\nnobody:x:65534:\n".to_vec()),
        Entry::dir("/tmp", 0o1777),
        Entry::dir("/root", 0o700),
    ];
    for applet in String::from_utf8_lossy(&output.stdout).lines().map(str::trim).filter(|a| !a.is_empty()) {
        let path = format!("/{applet}");
        if path != "/bin/busybox" {
            entries.push(Entry::symlink(&path, "/bin/busybox"));
        }
    }
    Ok(entries)
}

/// A busybox image named `reference`, running `sh` by default.
pub fn busybox(reference: &str) -> anyhow::Result<ImageSpec> {
    let mut spec = ImageSpec::new(Reference::parse(reference)?);
    spec.entries = busybox_entries()?;
    spec.env = vec![PATH.into()];
    spec.cmd = vec!["sh".into()];
    Ok(spec)
}

/// Adds a dynamically linked program and every library `ldd` says it loads (at their paths
/// on this machine, links resolved), and the dynamic loader.
pub fn add_dynamic(entries: &mut Vec<Entry>, program: &Path) -> anyhow::Result<()> {
    let output = std::process::Command::new("ldd").arg(program).output().context("failed to run ldd")?;
    anyhow::ensure!(output.status.success(), "ldd {} failed", program.display());
    let mut files = vec![program.to_owned(), "/lib64/ld-linux-x86-64.so.2".into()];
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        // "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x...)" or "/lib64/ld-linux... (0x...)"
        let path = line.split("=>").nth(1).unwrap_or(line).split_whitespace().next().unwrap_or_default();
        if path.starts_with('/') {
            files.push(path.into());
        }
    }
    for file in files {
        let inside = file.display().to_string();
        if entries.iter().any(|e| e.path == inside) {
            continue;
        }
        let real = std::fs::canonicalize(&file).with_context(|| format!("resolve {}", file.display()))?;
        entries.push(Entry::from_host(&inside, 0o755, &real)?);
    }
    Ok(())
}

/// The PostgreSQL server's user and group in the stand-in image (Alpine's `postgres`).
const POSTGRES_UID: u64 = 70;

/// The entrypoint of the PostgreSQL stand-in: the subset of the official image's
/// `docker-entrypoint.sh` that the examples use — `PGDATA`, `POSTGRES_USER`,
/// `POSTGRES_HOST_AUTH_METHOD`, and `/docker-entrypoint-initdb.d/*.sql` run once on an
/// empty data directory.
const POSTGRES_ENTRYPOINT: &str = r#"#!/bin/sh
set -e
if [ "$1" = postgres ]; then
  shift
  : "${PGDATA:=/var/lib/postgresql/data}" "${POSTGRES_USER:=postgres}"
  auth=${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}
  if [ ! -s "$PGDATA/PG_VERSION" ]; then
    initdb -D "$PGDATA" -U "$POSTGRES_USER" --auth-local=trust --auth-host="$auth" --locale=C --encoding=UTF8 >/dev/null
    echo "host all all all $auth" >> "$PGDATA/pg_hba.conf"
    pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    for f in /docker-entrypoint-initdb.d/*.sql; do
      [ -e "$f" ] && psql -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d postgres -f "$f"
    done
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  fi
  exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"
fi
exec "$@"
"#;

/// A PostgreSQL image from Debian's PostgreSQL 15 (server, initdb, pg_ctl, psql and their
/// libraries) on busybox, behaving like the official image for what the examples use.
pub fn postgres(reference: &str) -> anyhow::Result<ImageSpec> {
    let mut spec = busybox(reference)?;
    spec.entries.retain(|e| e.path != "/etc/passwd" && e.path != "/etc/group");
    spec.entries.push(Entry::file(
        "/etc/passwd",
        0o644,
        b"root:x:0:0:root:/root:/bin/sh\npostgres:x:70:70:postgres:/var/lib/postgresql:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n".to_vec(),
    ));
    spec.entries.push(Entry::file("/etc/group", 0o644, b"root:x:0:\npostgres:x:70:\nnobody:x:65534:\n".to_vec()));
    let bin = Path::new("/usr/lib/postgresql/15/bin");
    for program in ["postgres", "initdb", "pg_ctl", "psql"] {
        add_dynamic(&mut spec.entries, &bin.join(program))?;
        spec.entries
            .push(Entry::symlink(&format!("/usr/local/bin/{program}"), &bin.join(program).display().to_string()));
    }
    let lib = Path::new("/usr/lib/postgresql/15/lib");
    for name in ["plpgsql.so", "dict_snowball.so", "libpqwalreceiver.so"] {
        add_dynamic(&mut spec.entries, &lib.join(name))?;
    }
    // Character-set conversions initdb loads.
    for entry in std::fs::read_dir(lib).context("the PostgreSQL library directory")? {
        let path = entry?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if name.contains("_and_") || name.starts_with("utf8_and") || name.starts_with("euc") {
            add_dynamic(&mut spec.entries, &path)?;
        }
    }
    spec.add_tree(Path::new("/usr/share/postgresql/15"), "/usr/share/postgresql/15")?;
    spec.entries.push(Entry::from_host("/usr/share/zoneinfo/UTC", 0o644, Path::new("/usr/share/zoneinfo/UTC"))?);
    for dir in ["/var/run/postgresql", "/var/lib/postgresql", "/docker-entrypoint-initdb.d"] {
        spec.entries.push(Entry { uid: POSTGRES_UID, gid: POSTGRES_UID, ..Entry::dir(dir, 0o775) });
    }
    spec.entries.push(Entry::file(
        "/usr/local/bin/docker-entrypoint.sh",
        0o755,
        POSTGRES_ENTRYPOINT.as_bytes().to_vec(),
    ));
    spec.user = Some(format!("{POSTGRES_UID}:{POSTGRES_UID}"));
    spec.env.push("TZ=UTC".into());
    spec.env.push("PGDATA=/var/lib/postgresql/data".into());
    spec.entrypoint = vec!["docker-entrypoint.sh".into()];
    spec.cmd = vec!["postgres".into()];
    Ok(spec)
}
