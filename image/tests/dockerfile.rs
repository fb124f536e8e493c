//! The Dockerfile (for users with a container engine) and `make image` put the same
//! things into Leasehold's image: user, entrypoint, command, labels and files.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use leasehold_image::{Content, dockerfile, leasehold};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The files (not directories) under `dir`, as image paths below `at`.
fn tree(dir: &Path, at: &str, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).expect("list") {
        let entry = entry.expect("entry");
        let inside = format!("{}/{}", at.trim_end_matches('/'), entry.file_name().to_string_lossy());
        if entry.file_type().expect("type").is_dir() {
            tree(&entry.path(), &inside, out);
        } else {
            out.insert(inside);
        }
    }
}

#[test]
fn the_dockerfile_and_the_image_builder_agree_on_what_goes_in() {
    let repo = repo();
    let text = std::fs::read_to_string(repo.join("Dockerfile")).expect("Dockerfile");
    let stage = dockerfile::final_stage(&text).expect("the final stage is understood");
    // A placeholder for the binaries: only the contents' shape is compared here.
    let placeholder = tempfile::NamedTempFile::new().expect("temp file");
    let spec = leasehold::assemble(&repo, placeholder.path(), placeholder.path(), None).expect("the image spec");

    assert_eq!(stage.base, "scratch", "nothing but what is listed: no base image's files");
    assert_eq!(stage.user.as_deref(), spec.user.as_deref(), "USER");
    assert_eq!(stage.entrypoint, spec.entrypoint, "ENTRYPOINT");
    assert_eq!(stage.cmd, spec.cmd, "CMD");
    assert_eq!(stage.labels, spec.labels, "LABELs (the version is the chart's appVersion)");

    let mut from_dockerfile = BTreeSet::new();
    for (from, source, destination) in &stage.copies {
        match from.as_deref() {
            Some("build") => {
                assert!(["/leasehold", "/leasehold-sidecar"].contains(&source.as_str()), "the build stage's binaries");
                assert_eq!(source, destination, "a binary keeps its path");
                from_dockerfile.insert(destination.clone());
            }
            Some(other) => panic!("COPY --from={other} is not mirrored by the image builder"),
            None => tree(&repo.join(source), destination, &mut from_dockerfile),
        }
    }
    let from_builder: BTreeSet<String> =
        spec.entries.iter().filter(|e| !matches!(e.content, Content::Directory)).map(|e| e.path.clone()).collect();
    assert_eq!(from_dockerfile, from_builder, "files");
}

#[test]
fn a_dynamically_linked_binary_is_refused_with_the_fix() {
    let test_binary = std::env::current_exe().expect("this test's binary, dynamically linked");
    let error = leasehold::check_static(&test_binary).expect_err("refused").to_string();
    assert!(error.contains("crt-static"), "{error}");
}
