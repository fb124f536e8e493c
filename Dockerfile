# syntax=docker/dockerfile:1
#
# The one Leasehold image: a static, non-root image of the `leasehold` binary (controller,
# webhooks, sidecar, `leasehold run`). The chart runs it as the controller and injects it
# as the sidecar.
#
# No container engine exists on the development machines, so this file is kept correct by
# review, not by a build (see README.md, "Image"). To build it elsewhere:
#   docker build -t ghcr.io/leasehold/leasehold:0.1.0 .

# ---- build: a fully static musl binary ------------------------------------------------
# The Alpine Rust image builds for musl natively, and Rust links musl statically by
# default: no C library at run time. `ring` (TLS) needs a C compiler.
FROM rust:1.95-alpine AS build
RUN apk add --no-cache musl-dev gcc
WORKDIR /src
COPY . .
# Only the `leasehold` package's binary: not the test harness, tests or benchmarks.
# --locked: exactly the versions in Cargo.lock. The cache mounts keep the registry and
# the target directory between builds (BuildKit).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --package leasehold --bin leasehold \
 && cp target/release/leasehold /leasehold \
 && ! ldd /leasehold 2>/dev/null | grep -q '=>'

# ---- run: nothing but the binary -------------------------------------------------------
# distroless/static: no shell, no package manager; CA certificates and /etc/passwd with
# the `nonroot` user (65532). The controller reaches the apiserver with the
# ServiceAccount's CA, so nothing else is needed.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /leasehold /leasehold
# Numeric, so that the kubelet can check runAsNonRoot (the chart also sets runAsUser).
USER 65532:65532
ENTRYPOINT ["/leasehold"]
CMD ["--help"]
LABEL org.opencontainers.image.title="leasehold" \
      org.opencontainers.image.description="Safe distributed locks for Kubernetes: FIFO grants, fencing tokens, a renewal sidecar" \
      org.opencontainers.image.licenses="Apache-2.0"
