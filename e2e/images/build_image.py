#!/usr/bin/env python3
"""Assemble a single-layer OCI image, without a Docker engine: a docker-archive tar, or one
platform of a multi-platform image index in an OCI image layout.

The harness has no registry and no Docker: images are built here from local files and
imported into the real node's containerd (`ctr -n k8s.io images import`). Two ways:

  build_image.py --dockerfile Dockerfile --copy /arbiter=PATH --tag arbiter:0.1.0 --out FILE
      the final stage of the Dockerfile, as `docker build` would make it: its base must be
      `scratch` (after ARG defaults and --build-arg), its COPY sources are taken from the
      --copy mappings (the build stage's outputs), and its LABEL, USER, ENTRYPOINT and CMD
      become the image's config. Any other instruction is refused, so the Dockerfile and this
      builder cannot drift apart silently.

  build_image.py --add /bin/busybox=PATH --link /bin/sh=busybox --entrypoint '["/bin/sh"]' ...
      an image from files, for the harness's own images (the sandbox, test workloads).

  build_image.py ... --arch arm64 --oci-layout DIR --tag arbiter:0.1.0
      instead of a tar, adds the image for linux/ARCH to the image index tagged TAG in the OCI
      image layout DIR (made if missing; the platform's earlier image is replaced). Run once
      per platform; `crane push DIR REF` (or `--index`) pushes the whole index.

The layer is reproducible: sorted entries, owner 0:0, mtime 0 (gzip's header too).
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import re
import shlex
import sys
import tarfile


def fail(message):
    print(f"build_image: {message}", file=sys.stderr)
    sys.exit(2)


def instructions(text):
    """The Dockerfile's instructions as (KEYWORD, rest), continuation lines joined."""
    joined, current = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        joined.append(current)
        current = ""
    out = []
    for line in joined:
        keyword, _, rest = line.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    return out


def substitute(value, args):
    def one(match):
        name = match.group(1) or match.group(2)
        if name not in args:
            fail(f"${name} is not a declared ARG")
        return args[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, value)


def exec_form(rest, keyword):
    try:
        value = json.loads(rest)
    except json.JSONDecodeError:
        fail(f"{keyword} {rest}: only the exec (JSON) form is supported")
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        fail(f"{keyword} {rest}: expected a JSON array of strings")
    return value


def final_stage(path, build_args, copies):
    """(config, files) of the Dockerfile's last stage; earlier stages only produce --copy."""
    global_args, stages = {}, []
    for keyword, rest in instructions(open(path).read()):
        if keyword == "FROM":
            stages.append((substitute(rest.split()[0], global_args), []))
        elif not stages:
            if keyword != "ARG":
                fail(f"{keyword} before the first FROM")
            name, _, default = rest.partition("=")
            global_args[name] = build_args.get(name, default)
        else:
            stages[-1][1].append((keyword, rest))
    if not stages:
        fail(f"{path} has no FROM")
    base, steps = stages[-1]
    if base != "scratch":
        fail(f"the final stage's base is {base!r}; this builder makes only `scratch` images")
    args, config, added = dict(global_args), {"Labels": {}}, []
    for keyword, rest in steps:
        if keyword == "ARG":
            name, _, default = rest.partition("=")
            args[name] = build_args.get(name, default)
        elif keyword == "LABEL":
            for pair in shlex.split(rest):
                key, _, value = pair.partition("=")
                config["Labels"][key] = substitute(value, args)
        elif keyword == "COPY":
            parts = rest.split()
            flags = [p for p in parts if p.startswith("--")]
            paths = [p for p in parts if not p.startswith("--")]
            if len(paths) != 2 or not flags or not all(f.startswith("--from=") for f in flags):
                fail(f"COPY {rest}: only `COPY --from=STAGE SRC DEST` is supported")
            if paths[0] not in copies:
                fail(f"COPY {paths[0]} {paths[1]}: pass --copy {paths[0]}=LOCAL_PATH")
            added.append((paths[1], copies[paths[0]]))
        elif keyword == "USER":
            config["User"] = rest
        elif keyword == "ENTRYPOINT":
            config["Entrypoint"] = exec_form(rest, keyword)
        elif keyword == "CMD":
            config["Cmd"] = exec_form(rest, keyword)
        else:
            fail(f"{keyword} in the final stage is not supported by this builder")
    return config, added


def layer(files, links):
    """A tar of FILES [(dest, local path)] and LINKS [(dest, target)], with parent dirs."""
    entries = {}
    for dest, _ in files + links:
        parts = dest.strip("/").split("/")
        for i in range(1, len(parts)):
            entries["/".join(parts[:i])] = ("dir", None)
    for dest, local in files:
        entries[dest.strip("/")] = ("file", local)
    for dest, target in links:
        entries[dest.strip("/")] = ("link", target)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(entries):
            kind, source = entries[name]
            info = tarfile.TarInfo(name)
            info.mtime = 0
            info.uid = info.gid = 0
            if kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif kind == "link":
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, source, 0o777
                tar.addfile(info)
            else:
                data = open(source, "rb").read()
                info.size = len(data)
                info.mode = 0o755 if os.access(source, os.X_OK) else 0o644
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def mapping(values, flag):
    out = []
    for value in values or []:
        dest, sep, source = value.partition("=")
        if not sep or not dest.startswith("/"):
            fail(f"{flag} {value}: expected /PATH=VALUE")
        out.append((dest, source))
    return out


INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
REF_NAME = "org.opencontainers.image.ref.name"


def blob(layout, data):
    """Writes DATA into LAYOUT's blobs; returns its digest."""
    digest = hashlib.sha256(data).hexdigest()
    path = os.path.join(layout, "blobs", "sha256", digest)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if not os.path.exists(path):
        with open(path + ".tmp", "wb") as f:
            f.write(data)
        os.replace(path + ".tmp", path)
    return "sha256:" + digest


def descriptor(media_type, digest, data, **extra):
    return {"mediaType": media_type, "digest": digest, "size": len(data), **extra}


def canonical(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def add_to_layout(layout, tag, arch, image_config, layer_tar, labels):
    """Adds the image (IMAGE_CONFIG, LAYER_TAR) for linux/ARCH to the index tagged TAG."""
    os.makedirs(layout, exist_ok=True)
    with open(os.path.join(layout, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    layer_gz = gzip.compress(layer_tar, mtime=0)
    config_digest = blob(layout, image_config)
    layer_digest = blob(layout, layer_gz)
    manifest = canonical(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": descriptor("application/vnd.oci.image.config.v1+json", config_digest, image_config),
            "layers": [descriptor("application/vnd.oci.image.layer.v1.tar+gzip", layer_digest, layer_gz)],
        }
    )
    manifest_digest = blob(layout, manifest)
    top_path = os.path.join(layout, "index.json")
    top = json.load(open(top_path)) if os.path.exists(top_path) else {"schemaVersion": 2, "mediaType": INDEX, "manifests": []}
    ours = [d for d in top["manifests"] if d.get("annotations", {}).get(REF_NAME) == tag]
    platforms = []
    if ours:
        old = json.load(open(os.path.join(layout, "blobs", "sha256", ours[0]["digest"].split(":")[1])))
        platforms = [m for m in old["manifests"] if m["platform"]["architecture"] != arch]
    platforms.append(descriptor(MANIFEST, manifest_digest, manifest, platform={"architecture": arch, "os": "linux"}))
    platforms.sort(key=lambda m: m["platform"]["architecture"])
    index = canonical(
        {
            "schemaVersion": 2,
            "mediaType": INDEX,
            "manifests": platforms,
            "annotations": {k: v for k, v in labels.items() if k.startswith("org.opencontainers.image.")},
        }
    )
    index_digest = blob(layout, index)
    top["manifests"] = [d for d in top["manifests"] if d not in ours]
    top["manifests"].append(descriptor(INDEX, index_digest, index, annotations={REF_NAME: tag}))
    with open(top_path + ".tmp", "w") as f:
        json.dump(top, f, indent=2, sort_keys=True)
    os.replace(top_path + ".tmp", top_path)
    collect_garbage(layout, top)
    return index_digest


def collect_garbage(layout, top):
    """Removes the blobs nothing in the layout's index.json refers to any more."""
    blobs = os.path.join(layout, "blobs", "sha256")
    kept, todo = set(), [d["digest"] for d in top["manifests"]]
    while todo:
        digest = todo.pop().split(":")[1]
        if digest in kept:
            continue
        kept.add(digest)
        try:
            doc = json.load(open(os.path.join(blobs, digest)))
        except (UnicodeDecodeError, json.JSONDecodeError):
            continue
        if isinstance(doc, dict):
            todo += [m["digest"] for m in doc.get("manifests", [])]
            todo += [l["digest"] for l in doc.get("layers", [])]
            if "config" in doc and "digest" in doc["config"]:
                todo.append(doc["config"]["digest"])
    for name in os.listdir(blobs):
        if name not in kept:
            os.remove(os.path.join(blobs, name))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tag", required=True, help="NAME:TAG (imported as docker.io/NAME:TAG)")
    parser.add_argument("--out", help="the docker-archive tar to write")
    parser.add_argument("--oci-layout", help="instead: the OCI image layout to add this platform's image to")
    parser.add_argument("--arch", default="amd64" if os.uname().machine == "x86_64" else "arm64",
                        choices=["amd64", "arm64"], help="the image's architecture (default: this machine's)")
    parser.add_argument("--dockerfile", help="build the final stage of this Dockerfile")
    parser.add_argument("--build-arg", action="append", default=[], help="NAME=VALUE, as docker build's")
    parser.add_argument("--copy", action="append", help="SRC=LOCAL: a build stage's output for COPY --from")
    parser.add_argument("--add", action="append", help="/DEST=LOCAL: a file in the image")
    parser.add_argument("--link", action="append", help="/DEST=TARGET: a symlink in the image")
    parser.add_argument("--entrypoint", help="JSON array")
    parser.add_argument("--cmd", help="JSON array")
    parser.add_argument("--user", help="UID[:GID]")
    opts = parser.parse_args()
    if bool(opts.out) == bool(opts.oci_layout):
        fail("give one of --out and --oci-layout")

    files = mapping(opts.add, "--add")
    links = mapping(opts.link, "--link")
    if opts.dockerfile:
        build_args = dict(a.partition("=")[::2] for a in opts.build_arg)
        copies = dict(mapping(opts.copy, "--copy"))
        config, copied = final_stage(opts.dockerfile, build_args, copies)
        files = copied + files
    else:
        config = {"Labels": {}}
    if opts.entrypoint:
        config["Entrypoint"] = exec_form(opts.entrypoint, "--entrypoint")
    if opts.cmd:
        config["Cmd"] = exec_form(opts.cmd, "--cmd")
    if opts.user:
        config["User"] = opts.user
    for _, local in files:
        if not os.path.isfile(local):
            fail(f"{local}: no such file")
    config["Env"] = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]

    layer_tar = layer(files, links)
    diff_id = "sha256:" + hashlib.sha256(layer_tar).hexdigest()
    image_config = json.dumps(
        {
            "architecture": opts.arch,
            "os": "linux",
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created_by": "e2e/images/build_image.py"}],
        },
        sort_keys=True,
    ).encode()
    if opts.oci_layout:
        digest = add_to_layout(opts.oci_layout, opts.tag, opts.arch, image_config, layer_tar, config["Labels"])
        print(f"{opts.oci_layout}: {opts.tag} linux/{opts.arch}, index {digest}")
        return
    config_name = hashlib.sha256(image_config).hexdigest() + ".json"
    layer_name = diff_id[len("sha256:"):] + "/layer.tar"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [opts.tag], "Layers": [layer_name]}]).encode()

    os.makedirs(os.path.dirname(os.path.abspath(opts.out)), exist_ok=True)
    tmp = opts.out + ".tmp"
    with tarfile.open(tmp, mode="w") as tar:
        for name, data in ((config_name, image_config), (layer_name, layer_tar), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, opts.out)


if __name__ == "__main__":
    main()
