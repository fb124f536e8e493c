//! The image's one layer: a tar of its entries, deterministic, and its gzip.

use std::collections::BTreeMap;
use std::io::Write as _;

use flate2::{Compression, GzBuilder};
use sha2::{Digest as _, Sha256};

use crate::{Content, Entry, Error};

/// A layer as it goes into the image.
#[derive(Debug, Clone)]
pub struct Layer {
    /// The gzip-compressed tar (the blob).
    pub compressed: Vec<u8>,
    /// `sha256:<hex>` of the uncompressed tar (the config's `diff_id`).
    pub diff_id: String,
    /// Size of the uncompressed tar.
    pub uncompressed_size: u64,
}

/// `sha256:<hex>` of `bytes`.
pub fn sha256(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    let mut hex = String::with_capacity(71);
    hex.push_str("sha256:");
    for byte in hash {
        use std::fmt::Write as _;
        let _ = write!(hex, "{byte:02x}"); // writing to a String cannot fail
    }
    hex
}

/// Checks paths and adds the parent directories that are not listed; sorted by path.
fn complete(entries: &[Entry]) -> Result<BTreeMap<String, Entry>, Error> {
    let mut all = BTreeMap::new();
    for entry in entries {
        let relative = entry
            .path
            .strip_prefix('/')
            .filter(|p| !p.is_empty() && !p.split('/').any(|part| part.is_empty() || part == "." || part == ".."))
            .ok_or_else(|| Error::Path {
                path: entry.path.clone(),
                problem: "must be absolute and normal (no empty, . or .. parts)",
            })?;
        if all.insert(relative.to_owned(), entry.clone()).is_some() {
            return Err(Error::Path { path: entry.path.clone(), problem: "is listed twice" });
        }
    }
    let parents: Vec<String> = all
        .keys()
        .flat_map(|path| {
            let parts: Vec<&str> = path.split('/').collect();
            (1..parts.len()).map(move |n| parts[..n].join("/")).collect::<Vec<_>>()
        })
        .collect();
    for parent in parents {
        match all.get(&parent) {
            Some(Entry { content: Content::Directory, .. }) => {}
            Some(entry) => {
                return Err(Error::Path { path: entry.path.clone(), problem: "is a parent but not a directory" });
            }
            None => {
                all.insert(parent.clone(), Entry::dir(&format!("/{parent}"), 0o755));
            }
        }
    }
    Ok(all)
}

/// The uncompressed tar of `entries`: ustar headers, mtime 0, numeric owners, no names.
pub fn tar(entries: &[Entry]) -> Result<Vec<u8>, Error> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, entry) in complete(entries)? {
        let mut header = tar::Header::new_ustar();
        header.set_mode(entry.mode);
        header.set_uid(entry.uid);
        header.set_gid(entry.gid);
        header.set_mtime(0);
        let appended = match &entry.content {
            Content::File(bytes) => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(bytes.len() as u64);
                builder.append_data(&mut header, &path, bytes.as_slice())
            }
            Content::Directory => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_size(0);
                builder.append_data(&mut header, format!("{path}/"), std::io::empty())
            }
            Content::Symlink(target) => {
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_size(0);
                builder.append_link(&mut header, &path, target)
            }
        };
        appended.map_err(Error::io(format!("failed to add {} to the layer", entry.path)))?;
    }
    builder.into_inner().map_err(Error::io("failed to finish the layer"))
}

/// Gzip without a file name or timestamp, at a fixed level (the default, 6: level 9 is
/// 0.5 % smaller on these binaries and two to three times slower).
pub fn gzip(bytes: &[u8]) -> Result<Vec<u8>, Error> {
    let mut encoder = GzBuilder::new().mtime(0).write(Vec::new(), Compression::default());
    encoder.write_all(bytes).map_err(Error::io("failed to compress the layer"))?;
    encoder.finish().map_err(Error::io("failed to compress the layer"))
}

/// How long an unused layer stays in a cache.
const CACHE_KEEP: std::time::Duration = std::time::Duration::from_secs(3 * 24 * 3600);

/// Removes layers of `dir` unused for [`CACHE_KEEP`].
fn prune(dir: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.filter_map(Result::ok) {
        let stale = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > CACHE_KEEP);
        if stale {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// The layer of `entries`.
pub fn build(entries: &[Entry]) -> Result<Layer, Error> {
    build_cached(entries, None)
}

/// The layer of `entries`, its compressed form reused from `cache` (a directory, keyed by
/// the uncompressed layer's digest) when an earlier build wrote it: compression is most of
/// the time of building an image, and its output is a function of the input alone.
pub fn build_cached(entries: &[Entry], cache: Option<&std::path::Path>) -> Result<Layer, Error> {
    let tar = tar(entries)?;
    let diff_id = sha256(&tar);
    let cached = cache.map(|dir| dir.join(format!("{}.tar.gz", diff_id.trim_start_matches("sha256:"))));
    let compressed = match cached.as_ref().and_then(|path| std::fs::read(path).ok()) {
        Some(compressed) => {
            // Marks it used, so that pruning keeps it.
            if let Some(file) = cached.as_ref().and_then(|path| std::fs::File::options().append(true).open(path).ok()) {
                let _ = file.set_modified(std::time::SystemTime::now());
            }
            compressed
        }
        None => {
            if let Some(dir) = cache {
                prune(dir);
            }
            let compressed = gzip(&tar)?;
            if let (Some(path), Some(dir)) = (&cached, cache) {
                // A failed write only costs the next build its compression.
                let partial = path.with_extension(format!("partial-{}", std::process::id()));
                if std::fs::create_dir_all(dir).is_ok() && std::fs::write(&partial, &compressed).is_ok() {
                    let _ = std::fs::rename(&partial, path);
                }
            }
            compressed
        }
    };
    Ok(Layer { diff_id, uncompressed_size: tar.len() as u64, compressed })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(tar: &[u8]) -> Vec<(String, u32, u64)> {
        let mut archive = tar::Archive::new(tar);
        archive
            .entries()
            .expect("entries")
            .map(|e| {
                let e = e.expect("entry");
                let header = e.header();
                (
                    e.path().expect("path").display().to_string(),
                    header.mode().expect("mode"),
                    header.mtime().expect("mtime"),
                )
            })
            .collect()
    }

    #[test]
    fn parents_are_added_sorted_and_every_mtime_is_zero() {
        let entries = vec![
            Entry::file("/usr/bin/b", 0o755, b"b".to_vec()),
            Entry::file("/etc/passwd", 0o644, b"root".to_vec()),
            Entry::symlink("/bin", "usr/bin"),
        ];
        let listed = paths(&tar(&entries).expect("tar"));
        let names: Vec<&str> = listed.iter().map(|(p, _, _)| p.as_str()).collect();
        assert_eq!(names, ["bin", "etc/", "etc/passwd", "usr/", "usr/bin/", "usr/bin/b"]);
        assert!(listed.iter().all(|(_, _, mtime)| *mtime == 0));
        assert_eq!(listed[5].1, 0o755);
    }

    #[test]
    fn same_entries_in_any_order_give_the_same_bytes() {
        let a = vec![Entry::file("/a", 0o644, b"1".to_vec()), Entry::file("/d/b", 0o600, b"2".to_vec())];
        let b: Vec<Entry> = a.iter().rev().cloned().collect();
        let (la, lb) = (build(&a).expect("a"), build(&b).expect("b"));
        assert_eq!(la.compressed, lb.compressed);
        assert_eq!(la.diff_id, lb.diff_id);
    }

    #[test]
    fn bad_paths_are_refused_with_the_path_named() {
        for bad in ["relative", "/a/../b", "/a//b", "/"] {
            let error = tar(&[Entry::file(bad, 0o644, Vec::new())]).expect_err(bad).to_string();
            assert!(error.contains(bad), "{error}");
        }
        let twice = [Entry::file("/x", 0o644, Vec::new()), Entry::dir("/x", 0o755)];
        assert!(tar(&twice).expect_err("twice").to_string().contains("twice"));
        let file_parent = [Entry::file("/x", 0o644, Vec::new()), Entry::file("/x/y", 0o644, Vec::new())];
        assert!(tar(&file_parent).expect_err("file parent").to_string().contains("not a directory"));
    }
}
