#!/usr/bin/env bash
# `make setup`: installs what `make test` needs beyond Rust, Go and kubectl, only if missing.
# Quiet when everything is there. Debian packages need root (as in CI); Rust components and
# targets go through rustup.
set -euo pipefail

# Installs Debian packages, quietly (with sudo unless root).
debian_install() {
  local sudo=""
  [[ $(id -u) == 0 ]] || sudo="sudo"
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

need=()
for tool in curl openssl python3 flock setsid file musl-gcc aarch64-linux-gnu-gcc; do
  command -v "$tool" >/dev/null || need+=("$tool")
done
if ((${#need[@]})); then
  echo "[setup] missing: ${need[*]}; installing from Debian" >&2
  sudo=""
  [[ $(id -u) == 0 ]] || sudo="sudo"
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq curl openssl python3 util-linux file musl-tools >/dev/null
  # The arm64 cross build is checked when it can be; its compiler is not required.
  $sudo apt-get install -y -qq gcc-aarch64-linux-gnu >/dev/null 2>&1 \
    || echo "[setup] gcc-aarch64-linux-gnu not installed: the arm64 check will be skipped" >&2
fi
# The real node (e2e/node.sh): containerd and runc, the CNI plugins, busybox for test pods,
# iptables for kube-proxy.
node_need=()
for tool in containerd runc ctr iptables ip; do command -v "$tool" >/dev/null || node_need+=("$tool"); done
[[ -x /usr/lib/cni/bridge ]] || node_need+=(cni)
[[ -x /bin/busybox ]] && /bin/busybox --list | grep -x httpd >/dev/null || node_need+=(busybox)
if ((${#node_need[@]})); then
  echo "[setup] missing for the real node: ${node_need[*]}; installing from Debian" >&2
  debian_install containerd runc containernetworking-plugins busybox-static iptables iproute2
fi
# faketime: agents with a wall clock ahead of the arbiter's (the trust-boundary tests and
# `make chaos`'s "candidate clock ahead" fault).
if ! command -v faketime >/dev/null; then
  echo "[setup] missing: faketime; installing from Debian" >&2
  debian_install faketime
fi
# ShellCheck: actionlint checks the workflows' shell steps with it (`make lint`).
if ! command -v shellcheck >/dev/null; then
  echo "[setup] missing: shellcheck; installing from Debian" >&2
  debian_install shellcheck
fi
for tool in go cargo rustup kubectl; do
  command -v "$tool" >/dev/null || { echo "[setup] $tool is required and not installed" >&2; exit 1; }
done
installed=$(rustup component list --installed 2>/dev/null)
for component in clippy rustfmt; do
  grep -q "^$component" <<<"$installed" || rustup component add "$component" >/dev/null
done
# The static (musl) build the Dockerfile makes is part of `make test`.
rustup target list --installed | grep -qx x86_64-unknown-linux-musl \
  || rustup target add x86_64-unknown-linux-musl >/dev/null
# The arm64 build (`make static-arm64`, checked by `make arm64-check`) when rustup can add it.
rustup target list --installed | grep -qx aarch64-unknown-linux-musl \
  || rustup target add aarch64-unknown-linux-musl >/dev/null 2>&1 \
  || echo "[setup] the aarch64-unknown-linux-musl target could not be added: the arm64 check will be skipped" >&2
