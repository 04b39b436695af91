#!/usr/bin/env bash
# `make publish REGISTRY=HOST[/PATH]`: pushes what `make release` put in dist/ to an OCI
# registry: the image index as REGISTRY/arbiter:VERSION (with crane) and the chart as
# oci://REGISTRY/charts/arbiter, version VERSION (with helm). PLAIN_HTTP=1 for a registry
# without TLS (the e2e suite's, on 127.0.0.1). Writes dist/published.env: IMAGE_REF and
# CHART_REF, each by digest, for signing.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=${VERSION:?VERSION}
REGISTRY=${REGISTRY:?REGISTRY, e.g. ghcr.io/arbiter-dev}
DIST=${DIST:-dist}
[[ -f $DIST/image/index.json && -f $DIST/arbiter-$VERSION.tgz ]] \
  || { echo "[publish] error: no release of $VERSION in $DIST: run make release first" >&2; exit 1; }

crane=$(e2e/cluster.sh tool crane)
helm=$(e2e/cluster.sh build)/helm
insecure=() plain_http=()
if [[ -n ${PLAIN_HTTP:-} ]]; then insecure=(--insecure); plain_http=(--plain-http); fi

image=$("$crane" push "${insecure[@]}" "$DIST/image" "$REGISTRY/arbiter:$VERSION")
echo "[publish] image $image" >&2
out=$("$helm" push "$DIST/arbiter-$VERSION.tgz" "oci://$REGISTRY/charts" "${plain_http[@]}" 2>&1) \
  || { echo "$out" >&2; exit 1; }
chart_digest=$(awk '$1 == "Digest:" {print $2}' <<<"$out")
[[ -n $chart_digest ]] || { echo "$out" >&2; echo "[publish] error: helm push printed no digest" >&2; exit 1; }
echo "[publish] chart $REGISTRY/charts/arbiter:$VERSION@$chart_digest" >&2
printf 'IMAGE_REF=%s\nCHART_REF=%s\n' "$image" "$REGISTRY/charts/arbiter@$chart_digest" >"$DIST/published.env"
