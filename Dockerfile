# Static, non-root image of the `arbiter` binary (operator, agent, status, handover).
#
# The build stage runs `make static`, the same target CI runs to check the static musl build.
# Build it with `docker build -t arbiter:0.1.0 --build-arg VERSION=0.1.0 .` (or buildah, kaniko).
# Base images are named by tag; pin them by digest (`image@sha256:...`) in your registry mirror
# for reproducible builds: this repository's CI has no registry to resolve digests from.
ARG RUST_IMAGE=rust:1.95-alpine
ARG RUNTIME_IMAGE=scratch

FROM ${RUST_IMAGE} AS build
RUN apk add --no-cache musl-dev make
WORKDIR /src
COPY Cargo.toml Cargo.lock Makefile ./
COPY src ./src
COPY crds ./crds
COPY charts/arbiter/files ./charts/arbiter/files
COPY e2e ./e2e
RUN make static && cp target/x86_64-unknown-linux-musl/release/arbiter /arbiter

FROM ${RUNTIME_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="arbiter" \
      org.opencontainers.image.description="Coordinated leader election for Kubernetes: one holder per Lease by version and skew rules, and deposed holders made to stop" \
      org.opencontainers.image.source="https://github.com/arbiter-dev/arbiter" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /arbiter /arbiter
USER 65532:65532
ENTRYPOINT ["/arbiter"]
CMD ["operator"]
