#!/usr/bin/env bash
# `make release`: every file a release publishes, in dist/, from the static builds `make static`
# and `make static-arm64` made. Reproducible: the same commit gives the same bytes. Archives hold
# their files (no `./` entry), modes 0755 / 0644, owner 0, and the commit's time as mtime
# (SOURCE_DATE_EPOCH, taken from git when unset); the SBOM's creation time is that time too.
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

# The one time every archive and the SBOM carry: the commit's, so two runs agree.
if [[ -z ${SOURCE_DATE_EPOCH:-} ]]; then
  SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null) \
    || die "not a git checkout: set SOURCE_DATE_EPOCH (seconds since 1970) to the release commit's time"
fi
[[ $SOURCE_DATE_EPOCH =~ ^[0-9]+$ ]] || die "SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH is not a number of seconds"
export SOURCE_DATE_EPOCH

# A reproducible tar.gz of NAMES under DIR: sorted, the commit's mtime, owner 0, files 0644 or
# 0755 (executables), directories 0755, no entry for DIR itself, gzip without a name or time.
reproducible_tgz() {
  local out=$1 dir=$2; shift 2
  tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
    --mode='u=rwX,go=rX' --format=gnu -C "$dir" -cf - "$@" | gzip -n -9 >"$out"
}

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
# `helm package` stamps every entry with the time it ran: unpack its archive and pack the same
# files again reproducibly (files only, as helm writes them).
chart_stage=$(mktemp -d)
"$helm" package charts/arbiter --version "$VERSION" --app-version "$VERSION" -d "$chart_stage" >/dev/null
tar -xzf "$chart_stage/arbiter-$VERSION.tgz" -C "$chart_stage"
(cd "$chart_stage" && find arbiter -type f | LC_ALL=C sort >files)
mapfile -t chart_files <"$chart_stage/files"
reproducible_tgz "$DIST/arbiter-$VERSION.tgz" "$chart_stage" --no-recursion "${chart_files[@]}"
rm -rf "$chart_stage"

log "manifests"
{
  printf '# arbiter %s: the Helm chart rendered with default values, without its test pod.\n' "$VERSION"
  printf '# kubectl apply --server-side -f arbiter.yaml\n'
  printf 'apiVersion: v1\nkind: Namespace\nmetadata:\n  name: arbiter-system\n'
  "$helm" template arbiter "$DIST/arbiter-$VERSION.tgz" --namespace arbiter-system \
    --kube-version 1.33.0 --skip-tests --no-hooks
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
  reproducible_tgz "$DIST/kubectl-arbiter-$VERSION-linux-$arch.tar.gz" "$stage" \
    kubectl-arbiter LICENSE completions man
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
# syft stamps the document with the time it ran and a random namespace: the commit's time, and
# a namespace named by the document's own content, instead.
python3 - "$DIST/arbiter.spdx.json" "$REPO_URL" "$VERSION" <<'EOF'
import datetime, hashlib, json, os, sys
path, repo, version = sys.argv[1:]
doc = json.load(open(path))
epoch = int(os.environ["SOURCE_DATE_EPOCH"])
when = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc)
doc["creationInfo"]["created"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
doc["documentNamespace"] = ""
digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
doc["documentNamespace"] = f"{repo}/spdx/arbiter-{version}-{digest[:32]}"
with open(path, "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
EOF

log "release notes"
awk -v v="$VERSION" '
  /^## \[/ { if (found) exit; if (index($0, "## [" v "]") == 1) { found = 1; next } }
  /^\[[^]]+\]: / { next }
  found { print }
' CHANGELOG.md | sed -e '/./,$!d' >"$DIST/RELEASE-NOTES.md"
[[ -s $DIST/RELEASE-NOTES.md ]] || die "CHANGELOG.md's section for $VERSION is empty"

(cd "$DIST" && sha256sum -- *.yaml *.tgz *.tar.gz *.json RELEASE-NOTES.md >SHA256SUMS)
log "done: $(cd "$DIST" && ls | tr '\n' ' ')"
