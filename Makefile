# The two commands a newcomer needs: `make demo` and `make test`. See README.md.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: test demo lint unit e2e crds control-plane cluster-up

## test: everything CI runs: format, lints, unit tests, CRD drift, end-to-end on a real cluster
test: lint unit e2e

lint:
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets -- -D warnings

## unit: pure logic, table and property tests, the CRD drift check, doc tests
unit:
	$(CARGO) test --lib --bins
	$(CARGO) test --doc

## e2e: builds (or reuses) the control plane, then runs every e2e test against one shared cluster
e2e: control-plane
	$(CARGO) test --test e2e

control-plane:
	e2e/cluster.sh build

## crds: regenerate crds/ from the Rust types
crds:
	$(CARGO) run --quiet -- crd > crds/arbiter.dev_leasecandidates.yaml

## demo: a local control plane, the CRD, example candidates; cleans up after itself
demo:
	e2e/demo.sh
