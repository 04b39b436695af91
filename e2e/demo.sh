#!/usr/bin/env bash
# `make demo`: a local control plane, arbiter's CRD, and three example candidates.
# Everything it starts is stopped when it ends (or is interrupted).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "Building arbiter"
cargo build --quiet
ARBITER=$PWD/target/debug/arbiter

step "Starting a local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok)"
cluster_env=$(e2e/cluster.sh up)
eval "$cluster_env"
trap 'step "Stopping the control plane"; e2e/cluster.sh down "$ARBITER_E2E_DIR"' EXIT
kubectl get nodes

step "Installing the LeaseCandidate CRD (arbiter crd | kubectl apply -f -)"
"$ARBITER" crd | kubectl apply -f -
kubectl wait --for=condition=Established crd/leasecandidates.arbiter.dev --timeout=30s

step "Three candidates for lease 'demo': 1.30.0, 1.31.0, 1.31.0"
for c in "a 1.30.0" "b 1.31.0" "c 1.31.0"; do
  set -- $c
  kubectl apply -f - <<YAML
apiVersion: arbiter.dev/v1alpha1
kind: LeaseCandidate
metadata: {name: candidate-$1}
spec: {leaseName: demo, binaryVersion: "$2", emulationVersion: "$2", strategy: OldestEmulationVersion}
YAML
done
kubectl get leasecandidates

step "A malformed candidate is refused at admission"
if kubectl apply -f - <<YAML 2>&1; then echo "unexpectedly accepted" >&2; exit 1; fi
apiVersion: arbiter.dev/v1alpha1
kind: LeaseCandidate
metadata: {name: bad}
spec: {leaseName: demo, binaryVersion: "1.30.1.6", strategy: foo}
YAML

step "Done"
