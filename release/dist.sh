#!/usr/bin/env bash
# `make release`: every file a release publishes, in dist/, from the static builds `make static`
# and `make static-arm64` made. Reproducible: archives and image layers carry no times or owners.
#
#   dist/image/                                  OCI image layout: the index for linux/amd64 and
#                                                linux/arm64, tagged VERSION
#   dist/arbiter-VERSION.tgz                     the chart (version and appVersion = VERSION)
#   dist/arbiter.yaml, dist/arbiter.crds.yaml    all in one (no `helm test` pod), the CRD alone
#   dist/kubectl-arbiter-VERSION-linux-ARCH.tar.gz   the CLI as a kubectl plugin, with shell
#                                                completions, the man page and the licence
#   dist/arbiter.krew.yaml                       the krew plugin manifest (URLs and sha256)
#   dist/arbiter.spdx.json                       the SBOM (SPDX, by syft, of Cargo.lock's crates)
#   dist/RELEASE-NOTES.md                        this version's section of CHANGELOG.md
#   dist/SHA256SUMS                              of every file above but the image layout
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=${VERSION:?VERSION}
DIST=${DIST:-dist}
REPO_URL=https://github.com/arbiter-dev/arbiter
declare -A TARGET=([amd64]=x86_64-unknown-linux-musl [arm64]=aarch64-unknown-linux-musl)

log() { echo "[release] $*" >&2; }
die() { echo "[release] error: $*" >&2; exit 1; }

for arch in amd64 arm64; do
  bin=target/${TARGET[$arch]}/release/arbiter
  [[ -x $bin ]] || die "$bin is missing: run make static static-arm64 first"
  file "$bin" | grep -Eq "statically linked|static-pie linked" || die "$bin is not statically linked"
done
chart_version=$(awk '$1 == "version:" {print $2; exit}' charts/arbiter/Chart.yaml)
[[ $chart_version == "$VERSION" ]] || die "charts/arbiter/Chart.yaml has version $chart_version, Cargo.toml $VERSION"
grep -q "^## \[$VERSION\]" CHANGELOG.md || die "CHANGELOG.md has no section for $VERSION"

helm=$(e2e/cluster.sh build)/helm
syft=$(e2e/cluster.sh tool syft)
host=target/${TARGET[amd64]}/release/arbiter
[[ $(uname -m) == aarch64 ]] && host=target/${TARGET[arm64]}/release/arbiter

rm -rf "$DIST"
mkdir -p "$DIST"

log "image index (linux/amd64, linux/arm64) in $DIST/image"
for arch in amd64 arm64; do
  python3 e2e/images/build_image.py --dockerfile Dockerfile --build-arg "VERSION=$VERSION" \
    --copy "/arbiter=target/${TARGET[$arch]}/release/arbiter" \
    --tag "$VERSION" --arch "$arch" --oci-layout "$DIST/image" >/dev/null
done

log "chart"
"$helm" package charts/arbiter --version "$VERSION" --app-version "$VERSION" -d "$DIST" >/dev/null

log "manifests"
{
  printf '# arbiter %s: the Helm chart rendered with default values, without its test pod.\n' "$VERSION"
  printf '# kubectl apply --server-side -f arbiter.yaml\n'
  printf 'apiVersion: v1\nkind: Namespace\nmetadata:\n  name: arbiter-system\n'
  "$helm" template arbiter "$DIST/arbiter-$VERSION.tgz" --namespace arbiter-system \
    --kube-version 1.33.0 --skip-tests
} >"$DIST/arbiter.yaml"
grep -q 'helm.sh/hook' "$DIST/arbiter.yaml" && die "arbiter.yaml holds a Helm hook"
cp crds/arbiter.dev_leasecandidates.yaml "$DIST/arbiter.crds.yaml"

log "kubectl plugin archives"
extras=$(mktemp -d)
trap 'rm -rf "$extras"' EXIT
mkdir -p "$extras/completions" "$extras/man"
"$host" completion bash >"$extras/completions/arbiter.bash"
"$host" completion zsh >"$extras/completions/_arbiter"
"$host" completion fish >"$extras/completions/arbiter.fish"
"$host" man >"$extras/man/arbiter.1"
cp LICENSE "$extras/LICENSE"
for arch in amd64 arm64; do
  stage=$(mktemp -d)
  cp -r "$extras/." "$stage/"
  install -m 0755 "target/${TARGET[$arch]}/release/arbiter" "$stage/kubectl-arbiter"
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$stage" -cf - . \
    | gzip -n >"$DIST/kubectl-arbiter-$VERSION-linux-$arch.tar.gz"
  rm -rf "$stage"
done

log "krew manifest"
sha() { sha256sum "$1" | cut -d' ' -f1; }
python3 - "$VERSION" "$REPO_URL" \
  "$(sha "$DIST/kubectl-arbiter-$VERSION-linux-amd64.tar.gz")" \
  "$(sha "$DIST/kubectl-arbiter-$VERSION-linux-arm64.tar.gz")" >"$DIST/arbiter.krew.yaml" <<'EOF'
import sys
version, repo, amd64, arm64 = sys.argv[1:]
platforms = "".join(f"""  - selector:
      matchLabels:
        os: linux
        arch: {arch}
    uri: {repo}/releases/download/v{version}/kubectl-arbiter-{version}-linux-{arch}.tar.gz
    sha256: {digest}
    bin: kubectl-arbiter
""" for arch, digest in (("amd64", amd64), ("arm64", arm64)))
print(f"""apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: arbiter
spec:
  version: v{version}
  homepage: {repo}
  shortDescription: Show and hand over leases elected by arbiter
  description: |
    arbiter elects one holder per Lease by version and skew rules. This plugin shows each
    lease's holder, term and candidates (kubectl arbiter status), and asks for a planned
    switchover (kubectl arbiter handover).
  platforms:
{platforms.rstrip()}""")
EOF

log "SBOM"
# The crates of Cargo.lock (dev-dependencies among them: the lock file does not tell them apart).
"$syft" scan dir:. --quiet --source-name arbiter --source-version "$VERSION" \
  --override-default-catalogers rust-cargo-lock-cataloger \
  --exclude './e2e/**' --exclude './target/**' --exclude './dist/**' --exclude "./$DIST/**" \
  -o "spdx-json=$DIST/arbiter.spdx.json"

log "release notes"
awk -v v="$VERSION" '
  /^## \[/ { if (found) exit; if (index($0, "## [" v "]") == 1) { found = 1; next } }
  /^\[[^]]+\]: / { next }
  found { print }
' CHANGELOG.md | sed -e '/./,$!d' >"$DIST/RELEASE-NOTES.md"
[[ -s $DIST/RELEASE-NOTES.md ]] || die "CHANGELOG.md's section for $VERSION is empty"

(cd "$DIST" && sha256sum -- *.yaml *.tgz *.tar.gz *.json RELEASE-NOTES.md >SHA256SUMS)
log "done: $(cd "$DIST" && ls | tr '\n' ' ')"
