//! What goes into an image: its name, its files and its run-time configuration.

use std::collections::BTreeMap;
use std::path::Path;

use crate::Error;

/// `name:tag`, e.g. `ghcr.io/leasehold/leasehold:0.1.0`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reference {
    /// Everything before the tag: registry, path and repository name.
    pub name: String,
    /// The tag.
    pub tag: String,
}

impl Reference {
    /// Parses `name:tag` (the tag is after the last `:` that follows the last `/`).
    pub fn parse(reference: &str) -> Result<Reference, Error> {
        let slash = reference.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match reference[slash..].rfind(':') {
            Some(colon) => (&reference[..slash + colon], &reference[slash + colon + 1..]),
            None => return Err(Error::Reference(reference.to_owned())),
        };
        let tag_ok = !tag.is_empty()
            && tag.len() <= 128
            && tag.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
        if name.is_empty() || !tag_ok || reference.contains('@') {
            return Err(Error::Reference(reference.to_owned()));
        }
        Ok(Reference { name: name.to_owned(), tag: tag.to_owned() })
    }

    /// The name as containerd stores it: a name without a registry is Docker Hub's
    /// (`busybox:1.36` is `docker.io/library/busybox:1.36`), as the kubelet resolves it.
    pub fn normalized(&self) -> String {
        let first = self.name.split('/').next().unwrap_or_default();
        let has_registry =
            self.name.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
        match (has_registry, self.name.contains('/')) {
            (true, _) => format!("{}:{}", self.name, self.tag),
            (false, true) => format!("docker.io/{}:{}", self.name, self.tag),
            (false, false) => format!("docker.io/library/{}:{}", self.name, self.tag),
        }
    }
}

impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.name, self.tag)
    }
}

/// What a path in the image is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Content {
    /// A regular file with these bytes.
    File(Vec<u8>),
    /// A directory.
    Directory,
    /// A symbolic link to this target.
    Symlink(String),
}

/// One path in the image's only layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Absolute path inside the image, e.g. `/etc/passwd`.
    pub path: String,
    /// Permission bits, e.g. `0o755`.
    pub mode: u32,
    /// Numeric owner.
    pub uid: u64,
    /// Numeric group.
    pub gid: u64,
    /// What it is.
    pub content: Content,
}

impl Entry {
    /// A root-owned regular file.
    pub fn file(path: &str, mode: u32, bytes: Vec<u8>) -> Entry {
        Entry { path: path.to_owned(), mode, uid: 0, gid: 0, content: Content::File(bytes) }
    }

    /// A root-owned regular file read from `source`.
    pub fn from_host(path: &str, mode: u32, source: &Path) -> Result<Entry, Error> {
        let bytes = std::fs::read(source).map_err(Error::io(format!("failed to read {}", source.display())))?;
        Ok(Entry::file(path, mode, bytes))
    }

    /// A root-owned directory.
    pub fn dir(path: &str, mode: u32) -> Entry {
        Entry { path: path.to_owned(), mode, uid: 0, gid: 0, content: Content::Directory }
    }

    /// A symbolic link.
    pub fn symlink(path: &str, target: &str) -> Entry {
        Entry { path: path.to_owned(), mode: 0o777, uid: 0, gid: 0, content: Content::Symlink(target.to_owned()) }
    }
}

/// An image: its reference, its files and how it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageSpec {
    /// The name it is stored and referred to by.
    pub reference: Reference,
    /// Its files; parent directories that are not listed are added (root, 0755).
    pub entries: Vec<Entry>,
    /// `USER`: a numeric `uid:gid` so that the kubelet can check `runAsNonRoot`.
    pub user: Option<String>,
    /// `ENTRYPOINT`.
    pub entrypoint: Vec<String>,
    /// `CMD`.
    pub cmd: Vec<String>,
    /// `ENV`, as `NAME=value`.
    pub env: Vec<String>,
    /// `WORKDIR`.
    pub working_dir: Option<String>,
    /// `LABEL`s.
    pub labels: BTreeMap<String, String>,
}

impl ImageSpec {
    /// An image with no files and no configuration.
    pub fn new(reference: Reference) -> ImageSpec {
        ImageSpec {
            reference,
            entries: Vec::new(),
            user: None,
            entrypoint: Vec::new(),
            cmd: Vec::new(),
            env: Vec::new(),
            working_dir: None,
            labels: BTreeMap::new(),
        }
    }

    /// Adds every file, directory and symlink under `dir` on the host, at the same path
    /// below `at` in the image (root-owned; permission bits kept).
    pub fn add_tree(&mut self, dir: &Path, at: &str) -> Result<(), Error> {
        use std::os::unix::fs::PermissionsExt as _;
        let mut stack = vec![(dir.to_owned(), at.trim_end_matches('/').to_owned())];
        while let Some((host, image)) = stack.pop() {
            let listing = std::fs::read_dir(&host).map_err(Error::io(format!("failed to list {}", host.display())))?;
            for item in listing {
                let item = item.map_err(Error::io(format!("failed to list {}", host.display())))?;
                let path = item.path();
                let inside = format!("{image}/{}", item.file_name().to_string_lossy());
                let meta = std::fs::symlink_metadata(&path)
                    .map_err(Error::io(format!("failed to stat {}", path.display())))?;
                let mode = meta.permissions().mode() & 0o7777;
                if meta.file_type().is_symlink() {
                    let target =
                        std::fs::read_link(&path).map_err(Error::io(format!("failed to read {}", path.display())))?;
                    self.entries.push(Entry::symlink(&inside, &target.to_string_lossy()));
                } else if meta.is_dir() {
                    self.entries.push(Entry::dir(&inside, mode));
                    stack.push((path, inside));
                } else {
                    self.entries.push(Entry::from_host(&inside, mode, &path)?);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Reference;

    #[test]
    fn references_parse_and_normalize_like_the_kubelet() {
        let cases = [
            ("ghcr.io/leasehold/leasehold:0.1.0", "ghcr.io/leasehold/leasehold:0.1.0"),
            ("busybox:1.36", "docker.io/library/busybox:1.36"),
            ("curlimages/curl:8.0", "docker.io/curlimages/curl:8.0"),
            ("localhost:5000/x:1", "localhost:5000/x:1"),
            ("registry.k8s.io/pause:3.10", "registry.k8s.io/pause:3.10"),
        ];
        for (reference, normalized) in cases {
            let parsed = Reference::parse(reference).expect(reference);
            assert_eq!(parsed.to_string(), reference);
            assert_eq!(parsed.normalized(), normalized, "{reference}");
        }
        for bad in ["busybox", "localhost:5000/x", "x:", ":1", "x:a b", "x@sha256:00"] {
            assert!(Reference::parse(bad).is_err(), "{bad} should be refused");
        }
    }
}
