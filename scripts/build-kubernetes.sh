#!/usr/bin/env bash
# Builds the real Kubernetes v1.20.2 binaries from Debian's `kubernetes` source
# package, once, into a cache outside the work tree:
#   ${GITOPS_KUBE_CACHE:-$HOME/.cache/gitops/kubernetes}/v1.20.2/
#     kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy
# A second run finds them there and costs nothing. A cold build takes about
# 5-7 minutes on 2 cores and needs ~3.5 GB of scratch space, removed afterwards.
#
# The system's apt sources are not changed: the deb-src entry lives in a
# private directory used only for `apt-get source`.
# Two changes to Debian's tree, both fixes that later releases carry:
# - The vendored github.com/modern-go/reflect2 v1.0.1 crashes under Go >= 1.18;
#   it is replaced by Debian's fixed copy (golang-github-modern-go-reflect2-dev).
# - kube-apiserver's etcd client loses its retry interceptor in v1.20: the storage
#   factory passes its Prometheus interceptors with grpc.WithUnaryInterceptor, which
#   replaces the one etcd's clientv3 installs, so a quorum read that meets an etcd
#   leader change fails with "etcdserver: leader changed" instead of being retried.
#   Kubernetes fixed it in v1.23 (kubernetes/kubernetes#105069) by chaining them;
#   the same two-word change is applied here (WithChain{Unary,Stream}Interceptor).
# The cache records which changes its binaries carry (BUILD): another set rebuilds.
set -euo pipefail

VERSION=v1.20.2
CACHE=${GITOPS_KUBE_CACHE:-$HOME/.cache/gitops/kubernetes}/$VERSION
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)
PATCHES="reflect2=debian etcd-client-retry=kubernetes#105069"

have_all() {
    local b
    for b in "${BINARIES[@]}"; do [ -x "$CACHE/$b" ] || return 1; done
    "$CACHE/kube-apiserver" --version 2>/dev/null | grep -q "$VERSION" || return 1
    [ "$(cat "$CACHE/BUILD" 2>/dev/null)" = "$PATCHES" ]
}
if have_all; then
    echo "kubernetes $VERSION: cached in $CACHE"
    exit 0
fi

step() { printf '[build-kubernetes %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

BUILD_PACKAGES=(golang-go rsync make golang-github-modern-go-reflect2-dev ca-certificates)
missing=()
for pkg in "${BUILD_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    step "installing build packages: ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/gitops-kube-build.XXXXXX")
trap 'chmod -R u+w "$SCRATCH" 2>/dev/null; rm -rf "$SCRATCH"' EXIT

step "fetching Debian's kubernetes source package (private apt sources in $SCRATCH/apt)"
APT="$SCRATCH/apt"
mkdir -p "$APT/sources" "$APT/lists/partial"
found=0
for src in /etc/apt/sources.list.d/*.sources; do
    [ -f "$src" ] || continue
    grep -q 'debian' "$src" || continue
    sed 's/^Types:.*/Types: deb-src/' "$src" > "$APT/sources/$(basename "$src")"
    found=1
done
if [ "$found" = 0 ] && [ -f /etc/apt/sources.list ]; then
    grep -E '^deb ' /etc/apt/sources.list | sed 's/^deb /deb-src /' > "$APT/sources.list"
fi
[ -f "$APT/sources.list" ] || : > "$APT/sources.list"
APT_OPTS=(-o "Dir::Etc::SourceParts=$APT/sources" -o "Dir::Etc::SourceList=$APT/sources.list"
          -o "Dir::State::Lists=$APT/lists" -o "Dir::Cache::archives=$APT/archives"
          -o APT::Sandbox::User=root)
apt-get "${APT_OPTS[@]}" -qq update
(cd "$SCRATCH" && apt-get "${APT_OPTS[@]}" -qq source --download-only kubernetes >/dev/null)
orig=$(ls "$SCRATCH"/kubernetes_*.orig.tar.gz | head -n1)
step "unpacking $(basename "$orig")"
tar -C "$SCRATCH" -xzf "$orig"
TREE=$(find "$SCRATCH" -maxdepth 1 -type d -name 'kubernetes-*' | head -n1)
[ -d "$TREE/vendor/github.com/modern-go/reflect2" ] || { echo "unexpected source layout in $TREE" >&2; exit 1; }

step "replacing vendored modern-go/reflect2 with Debian's fixed copy"
R2=/usr/share/gocode/src/github.com/modern-go/reflect2
rm -rf "$TREE/vendor/github.com/modern-go/reflect2"
mkdir -p "$TREE/vendor/github.com/modern-go/reflect2"
find "$R2" -maxdepth 1 -type f \( -name '*.go' -o -name '*.s' \) ! -name '*_test.go' \
    -exec cp {} "$TREE/vendor/github.com/modern-go/reflect2/" \;

step "chaining kube-apiserver's etcd client interceptors after etcd's retry (kubernetes#105069)"
FACTORY="$TREE/staging/src/k8s.io/apiserver/pkg/storage/storagebackend/factory/etcd3.go"
n=$(grep -c 'grpc.With\(Unary\|Stream\)Interceptor(grpcprom.\(Unary\|Stream\)ClientInterceptor)' "$FACTORY" || true)
[ "$n" = 2 ] || { echo "unexpected etcd client options in $FACTORY ($n matches)" >&2; exit 1; }
sed -i -e 's/grpc.WithUnaryInterceptor(grpcprom.UnaryClientInterceptor)/grpc.WithChainUnaryInterceptor(grpcprom.UnaryClientInterceptor)/' \
    -e 's/grpc.WithStreamInterceptor(grpcprom.StreamClientInterceptor)/grpc.WithChainStreamInterceptor(grpcprom.StreamClientInterceptor)/' \
    "$FACTORY"

step "go build ${BINARIES[*]} (about 5-7 minutes cold on 2 cores)"
mkdir -p "$TREE/.go/src/k8s.io"
ln -sfn ../../.. "$TREE/.go/src/k8s.io/kubernetes"
WHAT=""
for b in "${BINARIES[@]}"; do WHAT="$WHAT cmd/$b"; done
(
    cd "$TREE"
    env GOPATH="$TREE/.go" GOCACHE="$SCRATCH/gocache" CGO_ENABLED=0 \
        KUBE_GIT_VERSION=$VERSION KUBE_GIT_TREE_STATE=clean \
        make WHAT="${WHAT# }" 2>&1 | while IFS= read -r line; do step "  $line"; done
    exit "${PIPESTATUS[0]}"
)

step "keeping the binaries in $CACHE"
mkdir -p "$CACHE.tmp"
for b in "${BINARIES[@]}"; do
    install -m 0755 "$TREE/_output/local/bin/linux/amd64/$b" "$CACHE.tmp/$b"
done
echo "$PATCHES" > "$CACHE.tmp/BUILD"
rm -rf "$CACHE"
mv "$CACHE.tmp" "$CACHE"
have_all || { echo "built binaries do not report $VERSION" >&2; exit 1; }
step "done: $("$CACHE/kube-apiserver" --version)"
