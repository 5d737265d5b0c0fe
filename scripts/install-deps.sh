#!/usr/bin/env bash
# Installs everything gitops and its tests need on a fresh Debian machine:
# the real components (containerd, runc, haproxy, keepalived, etcd, sshd, age, restic and rclone; buildah and
# mmdebstrap for the controller image; chromium for the UI's browser tests) from Debian packages, and the Python package with its test extras in ./.venv.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(containerd runc haproxy keepalived wget etcd-client openssh-server openssh-client openssl git age iproute2
    containernetworking-plugins iptables conntrack procps busybox-static  # worker nodes (kubelet CNI, kube-proxy, lab workload image)
    buildah mmdebstrap util-linux  # the controller image (scripts/build-image.sh: a Debian base, buildah, unshare)
    restic rclone  # etcd backups: restic repositories, and `rclone serve restic` as a REST target in tests
    curl chromium chromium-driver)  # the demo asks its controller; the web UI's browser tests (Selenium drives Debian's Chromium, no download)

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    echo "installing Debian packages: ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Debian starts the packaged daemons; gitops runs its own instances and needs none of them.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    systemctl disable --now containerd haproxy keepalived ssh >/dev/null 2>&1 || true
fi

# The lab runs every process of every machine as root, and root's inotify instances are shared by all of
# them (6 per kube-apiserver, 2-3 per controller-manager, 1 per containerd 1.6, 2 per 2.x): the whole suite
# peaked at 126 of the kernel's default 128 (docs/development/lab.md). Raise it as kind asks of its hosts;
# never lower it.
INOTIFY_INSTANCES=1024
have=$(cat /proc/sys/fs/inotify/max_user_instances 2>/dev/null || echo 0)
if [ "$have" -lt "$INOTIFY_INSTANCES" ]; then
    if $SUDO sysctl -q -w fs.inotify.max_user_instances="$INOTIFY_INSTANCES" 2>/dev/null; then
        echo "raised fs.inotify.max_user_instances from $have to $INOTIFY_INSTANCES (the lab's processes all run as root)"
    else
        echo "warning: fs.inotify.max_user_instances is $have and cannot be raised here; the whole suite uses up to 126 (more on containerd 2.x)" >&2
    fi
fi

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[test]'
# pip byte-compiles what it installs, but not an editable checkout: compile gitops once here, or
# every `gitops` process the tests start compiles its modules again where the environment
# sets PYTHONDONTWRITEBYTECODE (a source changed since is still recompiled: Python checks its mtime)
.venv/bin/python -m compileall -q gitops >/dev/null

# The real Kubernetes (every supported release) and etcd binaries, built once with `go build` from their
# Go modules into ~/.cache/gitops/kubernetes (about 22 minutes the first time on 2 cores, then free).
bash scripts/build-kubernetes.sh
