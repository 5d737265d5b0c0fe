#!/usr/bin/env bash
# Builds the Kubernetes and etcd binaries gitops runs, with `go build` from their Go modules (the Go
# module proxy; nothing else is downloaded), once, into a cache outside the work tree:
#   ${GITOPS_KUBE_CACHE:-$HOME/.cache/gitops/kubernetes}/
#     v1.35.4/ v1.36.3/ v1.37.2/   kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy
#     etcd-v3.6.16/ etcd-v3.7.3/   etcd etcdctl etcdutl
#     containerd-v2.4.2/           containerd ctr containerd-shim-runc-v2
#     .modules/<name>/             the wrapper modules (go.mod, go.sum) the builds ran in
# Each directory records the recipe it was built with (BUILD: versions, Go, flags); a second run finds the
# same recipe there and costs nothing, another recipe rebuilds that directory only.
#
# The wrapper module: k8s.io/kubernetes requires every staging module at v0.0.0 and replaces them with
# ./staging/..., and a dependency's replace directives are ignored, so a module of our own requires
# k8s.io/kubernetes vX.Y.Z and replaces each staging module (the `replace` block of that version's own
# go.mod) with k8s.io/<name> v0.Y.Z; its `go` and `godebug` lines are upstream's. Versions are stamped
# as hack/lib/version.sh does (`kube-apiserver --version` and `/version` say vX.Y.Z); the module has no
# commit, so gitCommit is empty and gitTreeState "archive", buildDate the module's publication time.
# Static: CGO_ENABLED=0, checked in the build settings the go command records in each binary.
#
# GITOPS_KUBE_VERSIONS / GITOPS_ETCD_VERSIONS (space-separated) and GITOPS_CONTAINERD_VERSION choose other
# versions; the defaults are gitops/model/versions.py's: the newest patch of each supported minor the proxy
# serves, the etcd upstream kubeadm pairs with each, and containerd 2.x (github.com/containerd/containerd/v2,
# whose go.mod has no replace directive: a wrapper module requiring it builds as upstream's does; cgo off
# leaves out the btrfs snapshotter, which needs it, as upstream's static release does not).
# Timings on 2 cores (docs/development/tests.md): see there.
set -euo pipefail
cd "$(dirname "$0")/.."

# the versions gitops supports, declared once in gitops/model/versions.py (RELEASES)
RELEASES=$(python3 gitops/model/versions.py)
KUBE_VERSIONS=(${GITOPS_KUBE_VERSIONS:-$(sed -n 's/^kubernetes //p' <<<"$RELEASES")})
ETCD_VERSIONS=(${GITOPS_ETCD_VERSIONS:-$(sed -n 's/^etcd //p' <<<"$RELEASES")})
CONTAINERD_VERSION=${GITOPS_CONTAINERD_VERSION:-$(sed -n 's/^containerd //p' <<<"$RELEASES")}
ROOT=${GITOPS_KUBE_CACHE:-$HOME/.cache/gitops/kubernetes}
KUBE_BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)
ETCD_BINARIES=(etcd etcdctl etcdutl)
CONTAINERD_BINARIES=(containerd ctr containerd-shim-runc-v2)
# bump when the way a binary is built changes: every cached build with another recipe is rebuilt
RECIPE=2
command -v go >/dev/null || { echo "build-kubernetes: the go command is not installed (Go 1.26 or later)" >&2; exit 1; }
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=${GOTOOLCHAIN:-local}
GO_VERSION=$(go env GOVERSION)
START=$(date +%s)

step() { printf '[build-kubernetes %s +%ss] %s\n' "$(date +%H:%M:%S)" "$(($(date +%s) - START))" "$*"; }

recipe_of() {  # name version -> the BUILD line of a build
    echo "$1 $2 recipe=$RECIPE go=$GO_VERSION cgo=0 static trimpath"
}

cached() {  # dir recipe binaries... -> 0 when every binary is there, built with this recipe
    local dir=$1 want=$2 b
    shift 2
    [ "$(cat "$dir/BUILD" 2>/dev/null)" = "$want" ] || return 1
    for b in "$@"; do [ -x "$dir/$b" ] || return 1; done
}

is_static() {  # built without cgo (the go command records its build settings in the binary): statically linked
    local settings
    settings=$(go version -m "$1") || return 1
    grep -q $'^\tbuild\tCGO_ENABLED=0$' <<<"$settings"
}

json_field() {  # file field -> the string value of a field in JSON the go command wrote
    grep -o "\"$2\": *\"[^\"]*\"" "$1" | head -n1 | sed 's/^[^:]*: *"\(.*\)"$/\1/'
}

go_build() {  # workdir outdir ldflags packages... : one `go build` (packages compile in parallel, links too),
    # its progress a line per 250 packages it compiled (`-v` names each), the time at the end
    local work=$1 out=$2 ldflags=$3 t0 rc
    shift 3
    t0=$(date +%s)
    step "  go build $* (-v: a line per 250 packages compiled)"
    set +e
    (cd "$work" && go build -v -trimpath -ldflags "$ldflags" -o "$out/" "$@" 2>&1) \
        | awk -v start="$START" '
            /^(#|go: |[^ ]*\.go:|\t)/ { print; next }  # errors and their context, as the go command wrote them
            { n++; if (n % 250 == 0) { printf "[build-kubernetes %s +%ss]   %d packages compiled\n",
                                          strftime("%H:%M:%S"), systime() - start, n; fflush() } }
            END { printf "[build-kubernetes %s +%ss]   %d packages compiled\n", strftime("%H:%M:%S"),
                         systime() - start, n }'
    rc=${PIPESTATUS[0]}
    set -e
    [ "$rc" = 0 ] || { echo "build-kubernetes: go build failed in $work (exit $rc)" >&2; exit 1; }
    step "  built in $(($(date +%s) - t0)) s"
}

keep() {  # tmpdir dir recipe binaries... -> checks each binary, then moves tmpdir to dir
    local tmp=$1 dir=$2 want=$3 b
    shift 3
    for b in "$@"; do
        [ -x "$tmp/$b" ] || { echo "build-kubernetes: $b was not built" >&2; exit 1; }
        is_static "$tmp/$b" || { echo "build-kubernetes: $b is not statically linked" >&2; exit 1; }
    done
    echo "$want" > "$tmp/BUILD"
    rm -rf "$dir"
    mv "$tmp" "$dir"
}

build_kubernetes() {  # vX.Y.Z
    local v=$1 dir="$ROOT/$1" want work mod minor major stamp p ldflags pkgs=() b
    want=$(recipe_of kubernetes "$v")
    if cached "$dir" "$want" "${KUBE_BINARIES[@]}"; then
        step "kubernetes $v: cached in $dir"
        return
    fi
    step "kubernetes $v: building ${KUBE_BINARIES[*]} from k8s.io/kubernetes@$v"
    work="$ROOT/.modules/kubernetes-$v"
    mkdir -p "$work"
    go mod download -json "k8s.io/kubernetes@$v" > "$work/download.json"
    mod=$(json_field "$work/download.json" GoMod)
    [ -f "$mod" ] || { echo "build-kubernetes: the proxy gave no go.mod for k8s.io/kubernetes@$v" >&2; exit 1; }
    major=${v#v}; major=${major%%.*}
    minor=${v#v*.}; minor=${minor%%.*}
    {
        echo "// The wrapper module scripts/build-kubernetes.sh builds Kubernetes $v in (generated)."
        echo "module gitops.build/kubernetes"
        echo
        grep -m1 '^go ' "$mod"
        grep -m1 '^godebug ' "$mod" || true
        echo
        echo "require k8s.io/kubernetes $v"
        echo
        echo "replace ("
        sed -n '/^replace (/,/^)/p' "$mod" | awk -v ver="v0.$minor.${v##*.}" '$2 == "=>" {print "\t" $1 " => " $1 " " ver}'
        echo ")"
    } > "$work/go.mod"
    grep -q '=>' "$work/go.mod" || { echo "build-kubernetes: no staging modules in $mod's replace block" >&2; exit 1; }
    step "  resolving modules (go.sum)"
    for b in "${KUBE_BINARIES[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
    (cd "$work" && go list -deps "${pkgs[@]}" >/dev/null)
    # the module's publication time, from the proxy's .info
    stamp=$(json_field "$(json_field "$work/download.json" Info)" Time)
    ldflags="-s -w"
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X $p.gitVersion=$v -X $p.gitMajor=$major -X $p.gitMinor=$minor -X $p.gitCommit="
        ldflags+=" -X $p.gitTreeState=archive -X $p.buildDate=$stamp"
    done
    rm -rf "$dir.tmp"
    mkdir -p "$dir.tmp"
    go_build "$work" "$dir.tmp" "$ldflags" "${pkgs[@]}"
    [ "$("$dir.tmp/kube-apiserver" --version)" = "Kubernetes $v" ] \
        || { echo "build-kubernetes: kube-apiserver does not say Kubernetes $v" >&2; exit 1; }
    keep "$dir.tmp" "$dir" "$want" "${KUBE_BINARIES[@]}"
    step "kubernetes $v: done ($("$dir/kubectl" version --client 2>/dev/null | head -n1))"
}

build_etcd() {  # v3.X.Y
    local v=$1 dir="$ROOT/etcd-$1" want work ldflags
    want=$(recipe_of etcd "$v")
    if cached "$dir" "$want" "${ETCD_BINARIES[@]}"; then
        step "etcd $v: cached in $dir"
        return
    fi
    step "etcd $v: building ${ETCD_BINARIES[*]} from go.etcd.io/etcd/{server,etcdctl,etcdutl}/v3@$v"
    work="$ROOT/.modules/etcd-$v"
    mkdir -p "$work"
    go mod download -json "go.etcd.io/etcd/server/v3@$v" > "$work/download.json"
    {
        echo "// The wrapper module scripts/build-kubernetes.sh builds etcd $v in (generated)."
        echo "module gitops.build/etcd"
        echo
        grep -m1 '^go ' "$(json_field "$work/download.json" GoMod)"
        echo
        echo "require ("
        echo "	go.etcd.io/etcd/server/v3 $v"
        echo "	go.etcd.io/etcd/etcdctl/v3 $v"
        echo "	go.etcd.io/etcd/etcdutl/v3 $v"
        echo ")"
    } > "$work/go.mod"
    step "  resolving modules (go.sum)"
    (cd "$work" && go list -deps go.etcd.io/etcd/server/v3 go.etcd.io/etcd/etcdctl/v3 go.etcd.io/etcd/etcdutl/v3 >/dev/null)
    ldflags="-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=module-$v"
    rm -rf "$dir.tmp"
    mkdir -p "$dir.tmp"
    go_build "$work" "$dir.tmp" "$ldflags" go.etcd.io/etcd/server/v3 go.etcd.io/etcd/etcdctl/v3 \
        go.etcd.io/etcd/etcdutl/v3
    # the server's main package is its module's root (server/main.go): go names the binary "server"
    mv "$dir.tmp/server" "$dir.tmp/etcd"
    [ "$("$dir.tmp/etcd" --version | head -n1)" = "etcd Version: ${v#v}" ] \
        || { echo "build-kubernetes: etcd does not say ${v#v}" >&2; exit 1; }
    keep "$dir.tmp" "$dir" "$want" "${ETCD_BINARIES[@]}"
    step "etcd $v: done ($("$dir/etcd" --version | head -n1))"
}

build_containerd() {  # v2.X.Y
    local v=$1 dir="$ROOT/containerd-$1" want work pkg=github.com/containerd/containerd/v2 ldflags
    want=$(recipe_of containerd "$v")
    if cached "$dir" "$want" "${CONTAINERD_BINARIES[@]}"; then
        step "containerd $v: cached in $dir"
        return
    fi
    step "containerd $v: building ${CONTAINERD_BINARIES[*]} from $pkg@$v"
    work="$ROOT/.modules/containerd-$v"
    mkdir -p "$work"
    go mod download -json "$pkg@$v" > "$work/download.json"
    {
        echo "// The wrapper module scripts/build-kubernetes.sh builds containerd $v in (generated)."
        echo "module gitops.build/containerd"
        echo
        grep -m1 '^go ' "$(json_field "$work/download.json" GoMod)"
        echo
        echo "require $pkg $v"
    } > "$work/go.mod"
    step "  resolving modules (go.sum)"
    (cd "$work" && go list -deps "$pkg/cmd/containerd" "$pkg/cmd/ctr" "$pkg/cmd/containerd-shim-runc-v2" >/dev/null)
    # as its Makefile stamps it (`containerd --version`: "containerd github.com/containerd/containerd/v2 v2.4.2 ...")
    ldflags="-s -w -X $pkg/version.Version=$v -X $pkg/version.Revision=module-$v -X $pkg/version.Package=$pkg"
    rm -rf "$dir.tmp"
    mkdir -p "$dir.tmp"
    go_build "$work" "$dir.tmp" "$ldflags" "$pkg/cmd/containerd" "$pkg/cmd/ctr" "$pkg/cmd/containerd-shim-runc-v2"
    [ "$("$dir.tmp/containerd" --version | awk '{print $3}')" = "$v" ] \
        || { echo "build-kubernetes: containerd does not say $v" >&2; exit 1; }
    keep "$dir.tmp" "$dir" "$want" "${CONTAINERD_BINARIES[@]}"
    step "containerd $v: done ($("$dir/containerd" --version))"
}

mkdir -p "$ROOT"
for v in "${ETCD_VERSIONS[@]}"; do build_etcd "$v"; done
for v in "${KUBE_VERSIONS[@]}"; do build_kubernetes "$v"; done
build_containerd "$CONTAINERD_VERSION"
step "all built (${KUBE_VERSIONS[*]}; etcd ${ETCD_VERSIONS[*]}; containerd $CONTAINERD_VERSION) in $ROOT"
