#!/usr/bin/env bash
# Write the Go module that builds one Kubernetes release's control plane for the e2e harness.
#
#   e2e/gen-gomod.sh v1.33.13 e2e/versions/1.33
#
# A go.mod that requires k8s.io/kubernetes needs a replace line for every staging module the
# release's own go.mod points at ./staging (k8s.io/api, client-go, ...): this reads that list
# from the release's go.mod, pins each to the matching v0.Y.Z, requires the etcd server the
# release pins, and runs `go mod tidy` against tools.go's blank imports. The pinned release
# (e2e/go.mod) is generated the same way, into e2e/ itself.
set -euo pipefail
version=${1:?usage: gen-gomod.sh vX.Y.Z DIR}
dir=${2:?usage: gen-gomod.sh vX.Y.Z DIR}
[[ $version =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || { echo "not a Kubernetes release: $version" >&2; exit 1; }
staging_version="v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$dir/tools"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# The release's go.mod, as the module proxy serves it.
(cd "$tmp" && go mod init tmp >/dev/null 2>&1 && go mod download -json "k8s.io/kubernetes@$version") >"$tmp/dl.json"
release_mod=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["GoMod"])' "$tmp/dl.json")
etcd=$(awk '$1 == "go.etcd.io/etcd/server/v3" {print $2; exit}' "$release_mod")
mapfile -t staging < <(awk '$2 == "=>" && $3 ~ /^\.\/staging\// {print $1}' "$release_mod")
((${#staging[@]})) || { echo "no staging modules in $version's go.mod" >&2; exit 1; }
if [[ ! -f $dir/go.mod ]]; then
  {
    echo "// Control-plane binaries for the e2e harness, built from the Kubernetes source"
    echo "// at $version. Regenerate with e2e/gen-gomod.sh $version $dir."
    echo "module arbiter.dev/e2e/k8s-${version%.*}"
    echo
    echo "go 1.26.0"
  } >"$dir/go.mod"
  cp "$here/tools/tools.go" "$dir/tools/tools.go"
fi
cd "$dir"
edits=(-require="k8s.io/kubernetes@$version" -require="go.etcd.io/etcd/server/v3@$etcd")
for m in "${staging[@]}"; do edits+=(-replace="$m=$m@$staging_version"); done
go mod edit "${edits[@]}"
go mod tidy
echo "wrote $dir/go.mod: Kubernetes $version, staging $staging_version, etcd $etcd (${#staging[@]} staging modules)"
