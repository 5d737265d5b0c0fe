#!/usr/bin/env bash
# Builds the controller image and the files-agent image from ./Dockerfile with buildah (root,
# no daemon) and writes them as docker archives, for `ctr images import` or `docker load`:
#
#   scripts/build-image.sh OUT_DIR [BASE]
#
#   OUT_DIR/gitops.tar        ghcr.io/gitops-infra/gitops:<version>        (target gitops)
#   OUT_DIR/gitops-agent.tar  ghcr.io/gitops-infra/gitops-agent:<version>  (target agent)
#   OUT_DIR/build.json        seconds per step, image sizes, the image configs
#
# BASE: `local` (the default) makes a Debian bookworm minbase with mmdebstrap from the apt
# mirror and builds on it (no container registry needed); any other value is an image
# reference passed as the Dockerfile's BASE (e.g. docker.io/library/debian:bookworm-slim).
# Every mount lives in a private mount namespace and goes away when the script ends.
#
# GITOPS_IMAGE_CACHE (default ~/.cache/gitops/image-build; empty: no cache) keeps buildah's storage
# between builds, as CI keeps docker's layer cache: the base and every layer whose Dockerfile step
# and inputs are unchanged are reused (buildah --layers), so a commit rebuilds the package layers
# only. The base is made again, and the apt layers with it, each ISO week or when the way it is made
# changes; images left untagged are pruned after each build. Without a cache, buildah's storage
# lives in a temporary directory that goes away with the script.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "" ]; then
    echo "usage: $0 OUT_DIR [local|IMAGE]" >&2
    exit 2
fi
OUT=$(realpath -m "$1")
BASE=${2:-local}

if [ -z "${_GITOPS_BUILD_TMP:-}" ]; then
    [ "$(id -u)" -eq 0 ] || { echo "build-image.sh needs root (buildah, mmdebstrap)" >&2; exit 1; }
    for tool in buildah unshare; do
        command -v "$tool" >/dev/null || { echo "$tool not found (run scripts/install-deps.sh)" >&2; exit 1; }
    done
    mkdir -p "$OUT"
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/gitops-build.XXXXXX")
    cache=${GITOPS_IMAGE_CACHE-$HOME/.cache/gitops/image-build}
    status=0
    if [ -n "$cache" ]; then
        mkdir -p "$cache"
        exec 9>"$cache/lock"
        flock 9  # one build at a time on the cache
    fi
    # Every mount buildah makes (its storage, the build containers' roots) lives and dies in this namespace.
    _GITOPS_BUILD_TMP=$tmp _GITOPS_BUILD_CACHE=$cache unshare --mount --propagation private "$0" "$OUT" "$BASE" \
        || status=$?
    rm -rf "$tmp"
    exit "$status"
fi

tmp=$_GITOPS_BUILD_TMP
cache=${_GITOPS_BUILD_CACHE:-}
storage=${cache:+$cache/storage}
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
CONTROLLER=ghcr.io/gitops-infra/gitops:$VERSION
AGENT=ghcr.io/gitops-infra/gitops-agent:$VERSION
B=(buildah --root "${storage:-$tmp/root}" --runroot "$tmp/run" --storage-driver overlay)
now() { date +%s.%N; }
since() { awk -v a="$(now)" -v b="$1" 'BEGIN { printf "%.1f", a - b }'; }
say() { echo "build-image: $*"; }
t0=$(now)

build_args=(--format docker --isolation chroot --network host --layers)
base_seconds=0
base_cached=false
if [ "$BASE" = local ]; then
    command -v mmdebstrap >/dev/null || { echo "mmdebstrap not found (run scripts/install-deps.sh)" >&2; exit 1; }
    apt_clean='DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
Acquire::GzipIndexes "true";
Acquire::Languages "none";'
    # what makes the base, and the week: a new key makes it again (Debian's security updates reach the images)
    base_key=$( { printf '%s\n' "$apt_clean" "$(date -u +%G-W%V)"; sed -n '/^ *mmdebstrap --quiet/,/gitops-base:bookworm >/p' "$0"; } \
        | sha256sum | cut -c1-16)
    if [ -n "$storage" ] && [ "$(cat "$cache/base.key" 2>/dev/null)" = "$base_key" ] \
        && "${B[@]}" inspect --type image localhost/gitops-base:bookworm >/dev/null 2>&1; then
        base_cached=true
        say "the base, from the cache ($cache, key $base_key)"
    else
        say "making a Debian bookworm minbase with mmdebstrap (as debian:bookworm-slim is made: merged /usr"
        say "without the usrmerge package, no man pages, docs or locales, apt keeping no caches)"
        mmdebstrap --quiet --variant=minbase --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
            --customize-hook="printf '%s\n' '$apt_clean' > \"\$1/etc/apt/apt.conf.d/docker-clean\"" \
            --customize-hook='rm -rf "$1"/var/cache/apt/*.bin "$1"/var/lib/apt/lists/*' \
            --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
            --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/info/*' \
            --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias' \
            bookworm "$tmp/base.tar"
        ctr=$("${B[@]}" from scratch)
        "${B[@]}" add --quiet "$ctr" "$tmp/base.tar" / >/dev/null
        "${B[@]}" config --cmd bash --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$ctr"
        "${B[@]}" commit --quiet --rm "$ctr" localhost/gitops-base:bookworm >/dev/null
        rm -f "$tmp/base.tar"
        [ -z "$storage" ] || echo "$base_key" > "$cache/base.key"
    fi
    BASE=localhost/gitops-base:bookworm
    build_args+=(--pull-never)
    base_seconds=$(since "$t0")
    say "base ready in ${base_seconds%.*} s"
fi
build_args+=(--build-arg "BASE=$BASE")
# pip inside the build verifies TLS with the host's CA bundle when the host names one (a proxy's CA)
cert=${PIP_CERT:-${SSL_CERT_FILE:-}}
if [ -n "$cert" ] && [ -f "$cert" ]; then
    build_args+=(--secret "id=ca-bundle,src=$cert")
fi

t1=$(now)
say "building $AGENT (target agent) on $BASE"
"${B[@]}" build "${build_args[@]}" --target agent -t "$AGENT" . | sed -u 's/^/  /'
t2=$(now)
say "building $CONTROLLER (target gitops) on $BASE"
if [ -n "$storage" ]; then  # the build stage tagged, so its apt layer stays in the cache (untagged ones are pruned)
    "${B[@]}" build "${build_args[@]}" --target build -t localhost/gitops-build-stage:cache . | sed -u 's/^/  /'
fi
"${B[@]}" build "${build_args[@]}" --target gitops -t "$CONTROLLER" . | sed -u 's/^/  /'
t3=$(now)

rm -f "$OUT/gitops.tar" "$OUT/gitops-agent.tar"
"${B[@]}" push --quiet "$CONTROLLER" "docker-archive:$OUT/gitops.tar:$CONTROLLER"
"${B[@]}" push --quiet "$AGENT" "docker-archive:$OUT/gitops-agent.tar:$AGENT"

if [ -n "$storage" ]; then
    # what this build left untagged (the images it replaced, the build stage's top layers) goes; a cache
    # grown past 4 GiB all goes, and the next build starts from nothing
    "${B[@]}" rm --all >/dev/null
    "${B[@]}" rmi --prune >/dev/null 2>&1 || true
    if [ "$(du -sm "$storage" | cut -f1)" -gt 4096 ]; then
        say "the cache outgrew 4 GiB: emptied"
        "${B[@]}" rmi --all --force >/dev/null 2>&1 || true
        rm -rf "$storage" "$cache/base.key" "$cache/gzip-sizes.json"
    fi
fi

total=$(since "$t0")
python3 - "$OUT/build.json" "$base_seconds" "$t1" "$t2" "$t3" "$total" "$BASE" "$CONTROLLER" "$AGENT" \
    "$base_cached" "${cache:+$cache/gzip-sizes.json}" <<'EOF'
import json, os, sys, tarfile, zlib
from concurrent.futures import ThreadPoolExecutor
out, base_s, t1, t2, t3, total, base, controller, agent, base_cached, gz_cache = sys.argv[1:]
try:  # a layer's gzipped size, by its name in the archive (its digest): measured once
    with open(gz_cache) as f:
        known = {k: tuple(v) for k, v in json.load(f).items()}
except (OSError, ValueError):
    known = {}


def layer(tar, name):
    """(bytes as stored, bytes gzipped at gzip's default level) of one layer of a docker archive."""
    if name in known:
        return known[name]
    size = gz = 0
    with tarfile.open(tar) as archive:
        f, z = archive.extractfile(name), zlib.compressobj(6, zlib.DEFLATED, 31)
        while chunk := f.read(1 << 20):
            size += len(chunk)
            gz += len(z.compress(chunk))
        gz += len(z.flush())
    return size, gz


def entry(ref, tar, pool):
    """Layer bytes as stored (uncompressed) and gzipped (what a registry would serve), and the config."""
    with tarfile.open(tar) as archive:
        manifest = json.load(archive.extractfile("manifest.json"))[0]
        config = json.load(archive.extractfile(manifest["Config"]))["config"]
    sizes = [f.result() for f in [pool.submit(layer, tar, name) for name in manifest["Layers"]]]
    measured.update(zip(manifest["Layers"], sizes))
    size, gz = sum(s for s, _ in sizes), sum(g for _, g in sizes)
    print(f"build-image: {ref}: {size / 2**20:.0f} MiB ({gz / 2**20:.0f} MiB gzipped), "
          f"{len(manifest['Layers'])} layers, user {config.get('User') or 'root'}")
    return {"ref": ref, "archive": os.path.basename(tar), "size": size, "gzipSize": gz,
            "layers": len(manifest["Layers"]), "config": config}


d = os.path.dirname(out)
measured = {}
seconds = {"base": round(float(base_s), 1), "agent": round(float(t2) - float(t1), 1),
           "controller": round(float(t3) - float(t2), 1), "total": float(total)}
with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:  # zlib lets go of the GIL: layers at once
    result = {"base": base, "seconds": seconds, "controller": entry(controller, os.path.join(d, "gitops.tar"), pool),
              "agent": entry(agent, os.path.join(d, "gitops-agent.tar"), pool),
              "cache": {"used": bool(gz_cache), "base": base_cached == "true"}}
with open(out, "w") as f:
    json.dump(result, f, indent=2)
if gz_cache:  # only the layers of the images now built: the file stays as small as they are
    with open(gz_cache + ".new", "w") as f:
        json.dump(measured, f, sort_keys=True)
    os.replace(gz_cache + ".new", gz_cache)
print(f"build-image: seconds: {seconds}")
EOF
say "done: $OUT/gitops.tar, $OUT/gitops-agent.tar"
