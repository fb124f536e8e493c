# syntax=docker/dockerfile:1
#
# The one Leasehold image: a static, non-root image of the `leasehold` binary (controller,
# webhooks, sidecar, `leasehold run`) and, beside it, `leasehold-sidecar` (the sidecar
# alone, mapping only its own code). The chart runs the first as the controller and injects
# the second as the sidecar.
#
# `make image` builds the same image without a container engine (image/, the
# `leasehold-image` builder) as an OCI archive; a test holds this file's final stage and
# that builder to the same contents (user, entrypoint, command, labels, files). With a
# container engine:
#   docker build -t ghcr.io/leasehold/leasehold:0.1.0 .

# ---- build: a statically linked binary ---------------------------------------------------
# glibc, linked statically (crt-static): no C library at run time. The explicit --target
# keeps the flag off build scripts and proc macros, which must stay dynamic.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
ENV RUSTFLAGS="-C target-feature=+crt-static"
# Only the `leasehold` package's binaries: not the test harness, tests or benchmarks.
# --locked: exactly the versions in Cargo.lock. The cache mounts keep the registry and
# the target directory between builds (BuildKit).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --package leasehold --bin leasehold --bin leasehold-sidecar \
      --target x86_64-unknown-linux-gnu \
 && cp target/x86_64-unknown-linux-gnu/release/leasehold /leasehold \
 && cp target/x86_64-unknown-linux-gnu/release/leasehold-sidecar /leasehold-sidecar \
 && ! readelf -l /leasehold | grep -q 'program interpreter' \
 && ! readelf -l /leasehold-sidecar | grep -q 'program interpreter'

# ---- run: nothing but the binary and its user ---------------------------------------------
# No shell, no package manager, no C library, no CA certificates (every component talks
# only to the apiserver, verified with the ServiceAccount's CA). image/rootfs holds
# /etc/passwd and /etc/group with the `nonroot` user (65532).
FROM scratch
COPY image/rootfs/ /
COPY --from=build /leasehold /leasehold
COPY --from=build /leasehold-sidecar /leasehold-sidecar
# Numeric, so that the kubelet can check runAsNonRoot (the chart also sets runAsUser).
USER 65532:65532
ENTRYPOINT ["/leasehold"]
CMD ["--help"]
LABEL org.opencontainers.image.title="leasehold" \
      org.opencontainers.image.description="Safe distributed locks for Kubernetes: FIFO grants, fencing tokens, a renewal sidecar" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.1.0"
