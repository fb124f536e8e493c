//! The OCI image archive: an image layout (`oci-layout`, `index.json`, `blobs/sha256/*`)
//! in one tar file, with the image's name in the index annotations so that
//! `ctr images import` stores it under that name.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use oci_spec::image::{
    ANNOTATION_REF_NAME, Arch, ConfigBuilder, Descriptor, DescriptorBuilder, Digest, HistoryBuilder,
    ImageConfigurationBuilder, ImageIndexBuilder, ImageManifestBuilder, MediaType, OciLayoutBuilder, Os,
    PlatformBuilder, RootFsBuilder,
};
use serde::Serialize;
use serde_json::Value;

use crate::layer::{self, sha256};
use crate::{Error, ImageSpec};

/// The annotation containerd reads for the full image name on import.
pub const ANNOTATION_CONTAINERD_NAME: &str = "io.containerd.image.name";

/// What was written.
#[derive(Debug, Clone)]
pub struct Built {
    /// The image's digest: its manifest's, `sha256:<hex>`.
    pub digest: String,
    /// The name it is stored under (containerd's normalized form).
    pub name: String,
    /// Size of the archive file in bytes.
    pub archive_size: u64,
    /// Size of the compressed layer.
    pub layer_size: u64,
    /// Size of the uncompressed layer (about what the image takes on disk).
    pub unpacked_size: u64,
}

/// JSON with every object's keys sorted (oci-spec keeps labels and annotations in hash
/// maps, whose order would otherwise change from run to run).
fn canonical_json(value: &impl Serialize, what: &'static str) -> Result<Vec<u8>, Error> {
    fn sort(value: Value) -> Value {
        match value {
            Value::Object(map) => {
                let sorted: BTreeMap<String, Value> = map.into_iter().map(|(k, v)| (k, sort(v))).collect();
                Value::Object(sorted.into_iter().collect())
            }
            Value::Array(items) => Value::Array(items.into_iter().map(sort).collect()),
            other => other,
        }
    }
    let value = serde_json::to_value(value).map_err(|e| Error::Io { what: what.into(), source: e.into() })?;
    serde_json::to_vec(&sort(value)).map_err(|e| Error::Io { what: what.into(), source: e.into() })
}

fn oci(what: &'static str) -> impl FnOnce(oci_spec::OciSpecError) -> Error {
    move |source| Error::Oci { what, source }
}

fn descriptor(media_type: MediaType, blob: &[u8]) -> Result<Descriptor, Error> {
    let digest: Digest = sha256(blob).parse().map_err(oci("digest"))?;
    DescriptorBuilder::default()
        .media_type(media_type)
        .digest(digest)
        .size(blob.len() as u64)
        .build()
        .map_err(oci("descriptor"))
}

/// The blobs and index of `spec`'s image.
struct Layout {
    index: Vec<u8>,
    blobs: BTreeMap<String, Vec<u8>>,
    manifest_digest: String,
    layer_size: u64,
    unpacked_size: u64,
}

fn layout(spec: &ImageSpec, cache: Option<&Path>) -> Result<Layout, Error> {
    let layer = layer::build_cached(&spec.entries, cache)?;
    let mut config = ConfigBuilder::default();
    if let Some(user) = &spec.user {
        config = config.user(user.clone());
    }
    if !spec.entrypoint.is_empty() {
        config = config.entrypoint(spec.entrypoint.clone());
    }
    if !spec.cmd.is_empty() {
        config = config.cmd(spec.cmd.clone());
    }
    if !spec.env.is_empty() {
        config = config.env(spec.env.clone());
    }
    if let Some(dir) = &spec.working_dir {
        config = config.working_dir(dir.clone());
    }
    if !spec.labels.is_empty() {
        config = config.labels(spec.labels.clone().into_iter().collect::<HashMap<_, _>>());
    }
    let configuration = ImageConfigurationBuilder::default()
        .architecture(Arch::Amd64)
        .os(Os::Linux)
        .config(config.build().map_err(oci("config"))?)
        .rootfs(
            RootFsBuilder::default()
                .typ("layers")
                .diff_ids(vec![layer.diff_id.clone()])
                .build()
                .map_err(oci("rootfs"))?,
        )
        .history(vec![HistoryBuilder::default().created_by("leasehold-image").build().map_err(oci("history"))?])
        .build()
        .map_err(oci("image configuration"))?;
    let config_blob = canonical_json(&configuration, "the image configuration")?;

    let manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(descriptor(MediaType::ImageConfig, &config_blob)?)
        .layers(vec![descriptor(MediaType::ImageLayerGzip, &layer.compressed)?])
        .build()
        .map_err(oci("manifest"))?;
    let manifest_blob = canonical_json(&manifest, "the manifest")?;

    let mut manifest_descriptor = descriptor(MediaType::ImageManifest, &manifest_blob)?;
    manifest_descriptor.set_platform(Some(
        PlatformBuilder::default().architecture(Arch::Amd64).os(Os::Linux).build().map_err(oci("platform"))?,
    ));
    manifest_descriptor.set_annotations(Some(HashMap::from([
        (ANNOTATION_CONTAINERD_NAME.to_owned(), spec.reference.normalized()),
        (ANNOTATION_REF_NAME.to_owned(), spec.reference.tag.clone()),
    ])));
    let index = ImageIndexBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageIndex)
        .manifests(vec![manifest_descriptor])
        .build()
        .map_err(oci("index"))?;

    let manifest_digest = sha256(&manifest_blob);
    let mut blobs = BTreeMap::new();
    blobs.insert(sha256(&config_blob), config_blob);
    blobs.insert(manifest_digest.clone(), manifest_blob);
    let layer_size = layer.compressed.len() as u64;
    blobs.insert(sha256(&layer.compressed), layer.compressed);
    Ok(Layout {
        index: canonical_json(&index, "the index")?,
        blobs,
        manifest_digest,
        layer_size,
        unpacked_size: layer.uncompressed_size,
    })
}

/// The archive's bytes: a tar of the image layout, deterministic like the layer.
pub fn archive_bytes(spec: &ImageSpec) -> Result<(Vec<u8>, Built), Error> {
    archive_bytes_cached(spec, None)
}

/// [`archive_bytes`], reusing compressed layers from `cache` (see [`layer::build_cached`]).
pub fn archive_bytes_cached(spec: &ImageSpec, cache: Option<&Path>) -> Result<(Vec<u8>, Built), Error> {
    let layout = layout(spec, cache)?;
    let oci_layout = OciLayoutBuilder::default().image_layout_version("1.0.0").build().map_err(oci("oci-layout"))?;
    let mut files: Vec<(String, Vec<u8>)> = vec![
        ("oci-layout".into(), canonical_json(&oci_layout, "oci-layout")?),
        ("index.json".into(), layout.index.clone()),
    ];
    let mut entries = vec![crate::Entry::dir("/blobs", 0o755), crate::Entry::dir("/blobs/sha256", 0o755)];
    for (digest, blob) in &layout.blobs {
        let hex = digest.trim_start_matches("sha256:");
        files.push((format!("blobs/sha256/{hex}"), blob.clone()));
    }
    entries.extend(files.into_iter().map(|(path, bytes)| crate::Entry::file(&format!("/{path}"), 0o644, bytes)));
    let bytes = layer::tar(&entries)?;
    let built = Built {
        digest: layout.manifest_digest,
        name: spec.reference.normalized(),
        archive_size: bytes.len() as u64,
        layer_size: layout.layer_size,
        unpacked_size: layout.unpacked_size,
    };
    Ok((bytes, built))
}

/// Writes `spec`'s image to `out` (through a temporary file, renamed into place).
pub fn write_archive(spec: &ImageSpec, out: &Path) -> Result<Built, Error> {
    write_archive_cached(spec, out, None)
}

/// [`write_archive`], reusing compressed layers from `cache` (see [`layer::build_cached`]).
pub fn write_archive_cached(spec: &ImageSpec, out: &Path, cache: Option<&Path>) -> Result<Built, Error> {
    let (bytes, built) = archive_bytes_cached(spec, cache)?;
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent).map_err(Error::io(format!("failed to create {}", parent.display())))?;
    }
    let partial = out.with_extension("partial");
    std::fs::write(&partial, &bytes).map_err(Error::io(format!("failed to write {}", partial.display())))?;
    std::fs::rename(&partial, out).map_err(Error::io(format!("failed to rename {} into place", partial.display())))?;
    Ok(built)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Entry, Reference};

    fn spec() -> ImageSpec {
        let mut spec = ImageSpec::new(Reference::parse("example.com/app:1.0").expect("reference"));
        spec.entries.push(Entry::file("/app", 0o755, b"\x7fELF".to_vec()));
        spec.user = Some("65532:65532".into());
        spec.entrypoint = vec!["/app".into()];
        spec.labels = (0..20).map(|i| (format!("label-{i}"), i.to_string())).collect();
        spec
    }

    fn read(bytes: &[u8]) -> BTreeMap<String, Vec<u8>> {
        use std::io::Read as _;
        let mut archive = tar::Archive::new(bytes);
        let mut files = BTreeMap::new();
        for entry in archive.entries().expect("entries") {
            let mut entry = entry.expect("entry");
            if entry.header().entry_type().is_file() {
                let mut data = Vec::new();
                entry.read_to_end(&mut data).expect("read");
                files.insert(entry.path().expect("path").display().to_string(), data);
            }
        }
        files
    }

    #[test]
    fn the_same_image_twice_is_the_same_bytes() {
        let (a, built_a) = archive_bytes(&spec()).expect("a");
        let (b, built_b) = archive_bytes(&spec()).expect("b");
        assert_eq!(a, b, "labels in a hash map must not change the bytes");
        assert_eq!(built_a.digest, built_b.digest);
        let mut other = spec();
        other.cmd = vec!["--help".into()];
        assert_ne!(archive_bytes(&other).expect("other").1.digest, built_a.digest);
    }

    #[test]
    fn a_cached_layer_gives_the_same_image() {
        let cache = tempfile::tempdir().expect("a cache directory");
        let (plain, built) = archive_bytes(&spec()).expect("plain");
        let (first, _) = archive_bytes_cached(&spec(), Some(cache.path())).expect("fills the cache");
        assert_eq!(std::fs::read_dir(cache.path()).expect("list").count(), 1, "one layer cached");
        let (second, again) = archive_bytes_cached(&spec(), Some(cache.path())).expect("from the cache");
        assert_eq!((&first, &second), (&plain, &plain));
        assert_eq!(again.digest, built.digest);
    }

    #[test]
    fn the_layout_names_the_image_and_every_blob_matches_its_digest() {
        let (bytes, built) = archive_bytes(&spec()).expect("archive");
        let files = read(&bytes);
        let index: Value = serde_json::from_slice(&files["index.json"]).expect("index");
        let manifest = &index["manifests"][0];
        assert_eq!(manifest["annotations"][ANNOTATION_CONTAINERD_NAME], "example.com/app:1.0");
        assert_eq!(manifest["annotations"][ANNOTATION_REF_NAME], "1.0");
        assert_eq!(manifest["digest"], built.digest.as_str());
        for (path, data) in &files {
            if let Some(hex) = path.strip_prefix("blobs/sha256/") {
                assert_eq!(sha256(data), format!("sha256:{hex}"), "{path}");
            }
        }
        let manifest: Value =
            serde_json::from_slice(&files[&format!("blobs/sha256/{}", &built.digest[7..])]).expect("manifest");
        let config = manifest["config"]["digest"].as_str().expect("config digest");
        let config: Value = serde_json::from_slice(&files[&format!("blobs/sha256/{}", &config[7..])]).expect("config");
        assert_eq!(config["config"]["User"], "65532:65532");
        assert_eq!(config["config"]["Entrypoint"][0], "/app");
        assert_eq!(config["os"], "linux");
        assert_eq!(config["architecture"], "amd64");
    }
}
