# The two commands a newcomer needs: `make demo` and `make test`. See README.md.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: crate-deps setup promtool image images go-example test demo lint static-arm64 arm64-check unit e2e crds control-plane static manifests render-manifests chaos chaos-short bench \
	release publish version tool-path docs helm-docs cli-docs check-links actionlint static-amd64 \
	model model-short e2e-matrix

# The static build the Dockerfile runs (`make static`); CI checks it.
STATIC_TARGET := x86_64-unknown-linux-musl
# The arm64 build (`make static-arm64`), cross-compiled with Debian's aarch64 gcc; CI checks that
# it compiles when the target is installed (`make setup` installs it when rustup can).
ARM64_TARGET := aarch64-unknown-linux-musl
ifneq ($(shell uname -m),aarch64)
ARM64_ENV := CC_aarch64_unknown_linux_musl=aarch64-linux-gnu-gcc \
	CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=aarch64-linux-gnu-gcc
endif

## setup: what the build and tests need beyond Rust and Go: the musl target and musl-tools for
## the static build, clippy and rustfmt, and a few Debian tools. Idempotent, and quiet when
## everything is there (installs from Debian only what is missing; needs root then).
setup:
	@e2e/setup.sh

## test: everything CI runs: format, lints (with the docs' links, the release workflow and go vet), unit
## tests and the drift of generated files, the static builds, chaos-short, and end-to-end on a
## real cluster, the release (both platforms) installed from a local registry among them
test: setup
	@$(MAKE) --no-print-directory lint unit static-check model-short chaos-short e2e

lint: check-links actionlint crate-deps
	$(CARGO) fmt --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy --test demo --test chaos --test bench -- -D warnings
	$(CARGO) clippy -p arbiter-election --test model -- -D warnings
	cd e2e && go vet ./lecandidate
	cd go && gofmt -l . | (! grep .) && go vet ./...

## crate-deps: each crate builds on its own, with only what its layer may depend on: the pure
## election rules without tokio, kube or a clock (jiff without `std`, which `Timestamp::now`
## needs), the candidate library without a web server, TLS stack or CLI parser; and the library
## crates' docs build without a broken link (docs/architecture.md)
crate-deps:
	$(CARGO) check --quiet -p arbiter-election
	$(CARGO) check --quiet -p arbiter-candidate
	@bad=$$($(CARGO) tree -p arbiter-election -e normal,features --prefix none | grep -E '^(tokio|kube|kube-client) |^jiff feature "std"' | sort -u); \
	  if [ -n "$$bad" ]; then echo "arbiter-election depends on what pure rules must not:"; echo "$$bad"; exit 1; fi
	@bad=$$($(CARGO) tree -p arbiter-candidate -e normal --prefix none | grep -E '^(axum|axum-server|rustls|rcgen|x509-parser|clap) ' | sort -u); \
	  if [ -n "$$bad" ]; then echo "arbiter-candidate depends on what a library must not:"; echo "$$bad"; exit 1; fi
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --quiet --no-deps -p arbiter-election -p arbiter-api -p arbiter-candidate

## check-links: every relative link and anchor in the repository's Markdown resolves
check-links:
	python3 e2e/tools/check_links.py .

## actionlint: the GitHub workflows (.github/workflows/) pass actionlint (with shellcheck's
## checks when shellcheck is installed)
actionlint:
	$$(e2e/cluster.sh tool actionlint) -no-color

## docs: regenerate the generated references (the CLI's help, the chart's values); unit tests
## and `make unit` fail when they drift
docs: cli-docs helm-docs

cli-docs:
	$(CARGO) run --quiet -- reference > docs/reference/cli.md

helm-docs:
	$$(e2e/cluster.sh tool helm-docs) --chart-search-root charts --template-files=$(CURDIR)/docs/reference/helm-values.md.gotmpl \
	  --output-file=../../docs/reference/helm-values.md --sort-values-order=file --log-level=warning >/dev/null

## unit: pure logic, table and property tests, the CRD and CLI reference drift checks, doc
## tests, the Helm values reference's drift, and the Go module's unit tests (go/)
unit:
	$(CARGO) test --workspace --lib --bins
	cd go && go test ./...
	$(CARGO) test --workspace --doc
	@cp docs/reference/helm-values.md target/helm-values.md.committed && $(MAKE) --no-print-directory -s helm-docs \
	  && if ! diff -u target/helm-values.md.committed docs/reference/helm-values.md; then \
	    echo "docs/reference/helm-values.md is stale: run make helm-docs and commit it"; exit 1; fi

## e2e: builds (or reuses) the control plane, then runs every e2e test against one shared cluster
e2e: control-plane promtool images release
	$(CARGO) test --test e2e

control-plane:
	e2e/cluster.sh build

## e2e-matrix: the e2e suite's compatibility subset on every tested Kubernetes minor
## (KUBE_VERSIONS, default 1.33 1.35 1.37; each control plane built from source and cached
## apart). One minor's whole suite: KUBE_VERSION=1.33 make e2e
KUBE_VERSIONS ?= 1.33 1.35 1.37
e2e-matrix: promtool images release
	@for v in $(KUBE_VERSIONS); do \
	  echo "== e2e-matrix: Kubernetes $$v"; \
	  KUBE_VERSION=$$v e2e/cluster.sh build >/dev/null \
	    && KUBE_VERSION=$$v ARBITER_E2E_SUBSET=compat $(CARGO) test --test e2e \
	    || { echo "== e2e-matrix: Kubernetes $$v failed"; exit 1; }; \
	done; echo "== e2e-matrix: passed on $(KUBE_VERSIONS)"

## promtool: build (or reuse) promtool for the chart's alert tests, before the e2e suite starts
## (built inside a test it would load the machine while other tests run)
promtool:
	e2e/cluster.sh promtool

## crds: regenerate crds/ and the chart's copy from the Rust types
crds:
	$(CARGO) run --quiet -- crd > crds/arbiter.dev_leasecandidates.yaml
	cp crds/arbiter.dev_leasecandidates.yaml charts/arbiter/files/leasecandidates.yaml

## demo: the chart (installed from a local registry holding `make release`), the operator and
## three agents on a local control plane, through a rolling
## upgrade and a rollback; stops everything it started
demo: setup control-plane images release
	$(CARGO) test --quiet --test demo

## static: the fully static musl release binary (what the Dockerfile builds)
static:
	$(CARGO) build --release --locked --target $(STATIC_TARGET) --bin arbiter

VERSION := $(shell awk -F'"' '/^version/ {print $$2; exit}' Cargo.toml)
# The commit `arbiter --version` names, set for the static builds only (build.rs): a commit
# does not rebuild the debug test binaries. `-dirty` when the work tree has changes.
# Outside a git checkout (a source tarball) it is empty, and `--version` says "unknown".
GIT_COMMIT ?= $(shell c=$$(git rev-parse HEAD 2>/dev/null) && { git diff --quiet HEAD -- || c=$$c-dirty; echo $$c; })
static static-arm64 arm64-check: export ARBITER_GIT_COMMIT = $(GIT_COMMIT)
IMAGE := ghcr.io/arbiter-dev/arbiter:$(VERSION)
BUILD_IMAGE := python3 e2e/images/build_image.py

## image: the arbiter image (target/images/arbiter.tar, tagged $(IMAGE)) without a Docker
## engine: the Dockerfile's final stage around `make static`'s binary. With ARBITER_E2E_DIR
## set to a harness cluster started with --node, also loads it into that node's containerd.
image: static
	$(BUILD_IMAGE) --dockerfile Dockerfile --build-arg VERSION=$(VERSION) \
	  --copy /arbiter=target/$(STATIC_TARGET)/release/arbiter --tag $(IMAGE) --out target/images/arbiter.tar
	@if [ -n "$$ARBITER_E2E_DIR" ] && [ -d "$$ARBITER_E2E_DIR/node" ]; then \
	  e2e/cluster.sh import "$$ARBITER_E2E_DIR" target/images/arbiter.tar && echo "loaded $(IMAGE) into $$ARBITER_E2E_DIR"; fi

## images: the arbiter image, the e2e tests' agent image (arbiter with busybox, for
## `arbiter run -- sh -c ...` workloads) and the Go module's example manager (go/examples/manager)
images: image go-example
	$(BUILD_IMAGE) --tag arbiter-e2e/go-manager:$(VERSION) --out target/images/go-manager.tar \
	  --add /manager=target/go/example-manager-static --entrypoint '["/manager"]' --user 65532:65532
	$(BUILD_IMAGE) --tag arbiter-e2e/agent:$(VERSION) --out target/images/agent.tar \
	  --add /arbiter=target/$(STATIC_TARGET)/release/arbiter --add /bin/busybox=/bin/busybox \
	  --link /bin/sh=busybox --link /bin/sleep=busybox --link /bin/date=busybox --link /bin/timeout=busybox \
	  --link /bin/nc=busybox \
	  --entrypoint '["/arbiter"]' --user 65532:65532

static-amd64: static

## go-example: the Go module's example controller-runtime manager, static (for its image)
go-example:
	cd go && CGO_ENABLED=0 go build -trimpath -o ../target/go/example-manager-static ./examples/manager

## static-arm64: the static arm64 binary (cross-compiled on other machines)
static-arm64:
	$(ARM64_ENV) $(CARGO) build --release --locked --target $(ARM64_TARGET) --bin arbiter

## arm64-check: the arm64 build compiles (skipped, saying so, when the target is not installed)
arm64-check:
	@if rustup target list --installed | grep -qx $(ARM64_TARGET) && command -v aarch64-linux-gnu-gcc >/dev/null; then \
	  $(ARM64_ENV) $(CARGO) check --locked --target $(ARM64_TARGET) --bin arbiter; \
	else echo "arm64-check: skipped ($(ARM64_TARGET) or aarch64-linux-gnu-gcc not installed)"; fi

## static-check: build it and prove it is static and runs
static-check: static
	@file target/$(STATIC_TARGET)/release/arbiter | grep -q "static" || { echo "arbiter is not statically linked"; exit 1; }
	target/$(STATIC_TARGET)/release/arbiter --version

## manifests: manifests/arbiter.yaml, the chart rendered with default values (an e2e test
## fails when it drifts)
manifests:
	$(MAKE) --no-print-directory -s render-manifests > manifests/arbiter.yaml

render-manifests:
	@helm=$$(e2e/cluster.sh build)/helm && \
	printf '# Rendered from charts/arbiter with default values, without its test pod, by `make manifests`; do not edit.\n' && \
	printf 'apiVersion: v1\nkind: Namespace\nmetadata:\n  name: arbiter-system\n' && \
	$$helm template arbiter charts/arbiter --namespace arbiter-system --kube-version 1.33.0 --skip-tests --no-hooks

## version: the crate's version, which the chart, the image and the release carry
version:
	@echo $(VERSION)

## tool-path: the path of a release tool, built from its Go module and cached (TOOL=crane,
## helm, syft, helm-docs, actionlint)
tool-path:
	@if [ "$(TOOL)" = helm ]; then echo "$$(e2e/cluster.sh build)/helm"; else e2e/cluster.sh tool $(TOOL); fi

## release: every file a release publishes, in dist/: the image index (linux/amd64 and
## linux/arm64, an OCI layout), the chart, arbiter.yaml and arbiter.crds.yaml, the kubectl
## plugin's archives and krew manifest, the SBOM, the release notes and SHA256SUMS
## (docs/development/release.md)
release: static static-arm64
	VERSION=$(VERSION) release/dist.sh

## publish: push dist/'s image index and chart to REGISTRY (e.g. ghcr.io/arbiter-dev;
## PLAIN_HTTP=1 for a registry without TLS)
publish:
	VERSION=$(VERSION) REGISTRY=$(REGISTRY) PLAIN_HTTP=$(PLAIN_HTTP) release/publish.sh

## model: the protocol model-checked with stateright (docs/model.md): every interleaving up to
## the bound, then each seeded mutation, which must be caught; MUTATION=name runs one
MUTATION ?=
model:
	$(CARGO) test --release -p arbiter-election --test model -- $(if $(MUTATION),--mutation $(MUTATION))

## model-short: the same at smaller bounds (2 candidates and 2 replicas for 8 s with 2 faults and
## for 13 s with 1; 1 replica for 7 s with 3 faults), part of `make test`
model-short:
	$(CARGO) test --release -p arbiter-election --test model -- --small

## chaos: randomized fault trials counting violations (TRIALS=200 SEED=<clock> by default)
TRIALS ?= 200
SEED ?=
chaos: control-plane images
	$(CARGO) test --release --test chaos -- --trials $(TRIALS) $(if $(SEED),--seed $(SEED))

## chaos-short: the same with 3 trials, part of `make test`
chaos-short: control-plane images
	$(CARGO) test --test chaos -- --trials 3 --seed 739

## bench: handover/failover side by side with client-go leader election and upstream
## coordinated leader election, then one operator at scale; prints tables (docs/development/benchmarks.md)
RUNS ?= 20
LEASES ?= 1000,10000
# Ordinary pods that are not candidates, beside the leases (and alone, for the memory they add).
UNRELATED_PODS ?= 30000
bench: control-plane images
	$(CARGO) test --release --test bench -- --runs $(RUNS) --leases $(LEASES) \
		--pods $(UNRELATED_PODS) --unrelated-pods $(UNRELATED_PODS)
