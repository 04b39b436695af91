# Static, non-root image of the `arbiter` binary (operator, agent, status, handover), for
# linux/amd64 and linux/arm64.
#
# The build stage runs `make static-$TARGETARCH`, the targets CI builds. With an engine:
#   docker buildx build --platform linux/amd64,linux/arm64 --build-arg VERSION=0.1.0 .
# Without one, `make image` (this machine's platform) and `make release` (both, as an OCI image
# index) assemble the final stage below around those builds (e2e/images/build_image.py).
# Base images are named by tag; pin them by digest (`image@sha256:...`) in your registry mirror
# for reproducible builds.
ARG RUST_IMAGE=rust:1.95-alpine
ARG RUNTIME_IMAGE=scratch

FROM ${RUST_IMAGE} AS build
ARG TARGETARCH=amd64
# The commit `arbiter --version` names (e.g. --build-arg GIT_COMMIT=$(git rev-parse HEAD)).
ARG GIT_COMMIT=unknown
RUN apk add --no-cache musl-dev make
WORKDIR /src
COPY Cargo.toml Cargo.lock Makefile build.rs ./
COPY src ./src
COPY crates ./crates
COPY crds ./crds
COPY charts/arbiter/files ./charts/arbiter/files
COPY e2e ./e2e
RUN make static-${TARGETARCH} GIT_COMMIT=${GIT_COMMIT} \
 && cp "target/$(case ${TARGETARCH} in arm64) echo aarch64;; *) echo x86_64;; esac)-unknown-linux-musl/release/arbiter" /arbiter

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
