# syntax=docker/dockerfile:1
# Two images from one build of the `vramguard` binary:
#   docker build --target controller -t vramguard:dev .        # webhook + operator
#   docker build --target agent -t vramguard-agent:dev .       # the node agent
# Both run on distroless/cc (glibc, libgcc; no shell, no package manager) as a non-root user.
# The binary loads libnvidia-ml and libcuda at run time; on a GPU node the NVIDIA container
# runtime mounts them into the agent. NVRTC (the CUDA run-time compiler) is not mounted by
# it and not carried here: only the opt-in memory check needs it (the chart's
# agent.nvrtcHostPath); every other measurement works without it.

# The toolchain CI builds and tests with.
ARG RUST_VERSION=1.95
ARG DEBIAN=bookworm

FROM rust:${RUST_VERSION}-${DEBIAN} AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src src
COPY kernels kernels
COPY benches benches
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --no-default-features --bin vramguard \
    && install -D -m 0755 target/release/vramguard /out/vramguard

# The builder's Debian release and distroless's match, so the binary's glibc is there.
FROM gcr.io/distroless/cc-debian12:nonroot AS controller
LABEL org.opencontainers.image.title="vramguard" \
      org.opencontainers.image.description="vramguard admission webhook and operator" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/vramguard /usr/local/bin/vramguard
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["/usr/local/bin/vramguard"]
CMD ["serve"]

FROM gcr.io/distroless/cc-debian12:nonroot AS agent
LABEL org.opencontainers.image.title="vramguard-agent" \
      org.opencontainers.image.description="vramguard node agent: what each GPU really has free" \
      org.opencontainers.image.licenses="Apache-2.0"
# Asks the NVIDIA container runtime for every GPU and for NVML and the driver API.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility,compute
COPY --from=build /out/vramguard /usr/local/bin/vramguard
USER 65532:65532
EXPOSE 9470
ENTRYPOINT ["/usr/local/bin/vramguard"]
CMD ["agent"]
