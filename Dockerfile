# Static, non-root image of the `arbiter` binary (operator, agent, status).
#
# The build stage runs `make static`, the same target CI runs to check the static musl build.
FROM rust:1.95-alpine AS build
RUN apk add --no-cache musl-dev make
WORKDIR /src
COPY Cargo.toml Cargo.lock Makefile ./
COPY src ./src
COPY crds ./crds
COPY charts/arbiter/files ./charts/arbiter/files
COPY e2e ./e2e
RUN make static && cp target/x86_64-unknown-linux-musl/release/arbiter /arbiter

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /arbiter /arbiter
USER 65532:65532
ENTRYPOINT ["/arbiter"]
CMD ["operator"]
