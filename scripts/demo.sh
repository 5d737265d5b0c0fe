#!/usr/bin/env bash
# The main job on the embedded default: install gitops (and build the real
# Kubernetes 1.35-1.37 and etcd binaries from their Go modules once), start a local lab of 5 real containerd
# hypervisors (3 private, 2 public; each a machine of its own, a network namespace on the
# lab's bridge, onboarded with `gitops hypervisor init`), write
# the example repo wired to it, plan and apply it: two real control planes
# (3 etcd, 3 kube-apiserver, 3 controller-managers and schedulers each, behind two
# haproxy ingress nodes and a virtual IP keepalived moves between them), then kubectl through that address; then a worker joins team-a
# (a machine of its own on the same bridge; real
# kubelet and kube-proxy, gitops signing its certificates) and runs a Deployment
# of 2 pods behind a ClusterIP Service; an etcd backup of team-a with restic, listed; a check that nothing of the
# lab is on the host's network (no address outside 127.0.0.0/8 added, no KUBE-* chain). Last, the lab is handed
# to a controller (the repo pushed to a local bare repo, the state to its status branch, `gitops watch --ui`),
# and the demo ends with kubectl on team-a as alice, a person of tenant-1's OIDC provider (a pod gitops runs on a
# public machine, which team-a's API servers trust), and prints the web UI's URL.
# The lab stays up afterwards so you can look around; the last lines say how
# to inspect it and tear it down. A run starts by undoing what an earlier one left in
# $GITOPS_DEMO_DIR, finished, failed or still running, so it can always be run again.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh

G=.venv/bin/gitops
WORK=${GITOPS_DEMO_DIR:-/tmp/gitops-demo}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd -P)  # as the kernel names it: mount points and command lines are compared with it
LAB=$WORK/lab
REPO=$WORK/repo
STATE=$WORK/state
#: everything a run writes in $WORK but the controller's age identity (controller.key, kept if it reads)
ARTEFACTS=(repo state demo.plan team-a.kubeconfig web.yaml client.yaml worker backups origin.git controller
           controller.log controller.pid lab-hypervisors.yaml oidc-user.txt team-a-oidc.kubeconfig oidc-cache)

tree() {  # PID and its descendants, deepest first
    local child
    for child in $(ps -o pid= --ppid "$1" 2>/dev/null); do tree "$child"; done
    echo "$1"
}
alive() {  # any of the PIDs given still runs (a zombie does not)
    local pid
    for pid; do grep -qv '^[0-9]* (.*) Z ' "/proc/$pid/stat" 2>/dev/null && return 0; done
    return 1
}
halt() {  # SIGTERM the PIDs given, SIGKILL what is left after 30 s
    [ $# -gt 0 ] || return 0
    kill "$@" 2>/dev/null || true
    for _ in $(seq 1 30); do alive "$@" || return 0; sleep 1; done
    kill -9 "$@" 2>/dev/null || true
}
stop() {  # stop the process in pid file $1 and its descendants, if its command line still names $2
    local pid
    pid=$(cat "$1" 2>/dev/null) || return 0
    if [[ $pid =~ ^[0-9]+$ ]] && [ "$pid" != $$ ] && [ "$pid" != "$PPID" ] && tr '\0' ' ' 2>/dev/null < "/proc/$pid/cmdline" | grep -qF -- "$2"; then
        echo "== $3 (pid $pid) stops"
        halt $(tree "$pid")
    fi
    rm -f "$1"
}
orphans() {  # gitops commands still naming $WORK: an earlier run's, its script killed under them
    local cmd pid
    for cmd in /proc/[0-9]*/cmdline; do
        pid=${cmd#/proc/}; pid=${pid%/cmdline}
        [ "$pid" != $$ ] && [ "$pid" != "$PPID" ] || continue
        case $(tr '\0' ' ' 2>/dev/null < "$cmd") in *bin/gitops\ *"$WORK/"*) echo "$pid" ;; esac
    done
}
stop "$WORK/demo.pid" scripts/demo.sh "the previous demo, still running,"
stop "$WORK/controller.pid" "--workdir $WORK/controller" "the previous demo's controller"
LEFT=$(orphans)
if [ -n "$LEFT" ]; then
    echo "== the previous demo's gitops commands still running stop: pid" $LEFT
    halt $LEFT
fi
if [ -e "$LAB" ]; then
    echo "== tearing down the previous demo's lab (a worker still joined on it goes with it)"
    $G lab down --dir "$LAB"
fi
# a mount an earlier gitops's lab down left (kubelet's, under the worker's directory): lazily, nothing uses it
for point in $(awk -v d="$WORK/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r); do
    umount -l "$point"
done
for name in "${ARTEFACTS[@]}"; do rm -rf "${WORK:?}/$name"; done
echo $$ > "$WORK/demo.pid"
JOINING=
trap 'rm -f "$WORK/demo.pid"; [ -z "$JOINING" ] || kill "$JOINING" 2>/dev/null || true' EXIT
trap 'echo "the demo failed (line $LINENO); run it again: it starts by undoing what this run left" >&2' ERR

echo "== gitops lab up: 5 containerd hypervisors (3 private, 2 public), each a machine of its own, onboarded"
echo "   with gitops hypervisor init (on the machine) and its fleet side (mTLS fronts)"
$G lab up --dir "$LAB" --hypervisors 5 --public 2 --remote > "$WORK/lab-hypervisors.yaml"
$G lab status --dir "$LAB"
echo "== the image tenant-1's OIDC provider runs (this gitops), into the public machines"
$G lab images oidc --dir "$LAB"

echo "== the example repo, wired to the lab: $REPO"
# the hypervisors' mTLS client keys go to git age-encrypted to the controller's identity;
# plan and apply decrypt them in memory with it ($GITOPS_IDENTITY)
age-keygen -y "$WORK/controller.key" >/dev/null 2>&1 || { rm -f "$WORK/controller.key"; age-keygen -o "$WORK/controller.key" 2>/dev/null; }
export GITOPS_IDENTITY=$WORK/controller.key
# two ingress nodes per cluster, on the two public machines: each cluster is reached at a virtual IP of the
# lab's pool (gitops.yaml spec.ingress.virtualIPs), which keepalived moves between them
# one person, alice, in tenant-1's OIDC provider: the repo holds her password's bcrypt hash, the password
# stays in $WORK/oidc-user.txt (mode 0600); team-a's API servers trust that provider
PASSWORD=$(head -c 18 /dev/urandom | base64 | tr -d '/+=')
(umask 077 && echo "alice $PASSWORD" > "$WORK/oidc-user.txt")
HASH=$(printf '%s\n' "$PASSWORD" | $G oidc hash-password)
$G lab example-repo --dir "$LAB" "$REPO" --encrypt-to "$(age-keygen -y "$WORK/controller.key")" --ingress-nodes 2 \
    --oidc-user alice --oidc-password-hash "$HASH"
$G secrets list "$REPO"
$G validate "$REPO"

echo "== gitops plan, saved: what a reviewer approves"
$G plan "$REPO" --state-dir "$STATE" --out "$WORK/demo.plan"

echo "== gitops apply of the saved plan: exactly those actions, in that order"
$G apply "$WORK/demo.plan" --repo "$REPO" --state-dir "$STATE"

echo "== gitops plan again: nothing left to do"
$G plan "$REPO" --state-dir "$STATE" --detailed-exitcode

echo "== what runs where"
$G cri pods "$REPO"

echo "== kubectl through team-a's virtual IP, with the admin kubeconfig gitops prints"
KUBECTL=$(.venv/bin/python -c 'from gitops.lab import kubebin; print(kubebin.kubectl())')
(umask 077 && $G kubeconfig "$REPO" --state-dir "$STATE" --cluster team-a > "$WORK/team-a.kubeconfig")
for cluster in team-a team-b; do
    echo "$cluster's API: $($G kubeconfig "$REPO" --state-dir "$STATE" --cluster "$cluster" | awk '/server:/ {print $2}')" \
         "(a virtual IP over its two ingress nodes; held now by the machine that shows it below)"
done
for machine in lab-hv-1 lab-hv-2; do
    echo "  $machine eth0: $($G lab exec --dir "$LAB" "$machine" -- ip -o -4 addr show dev eth0 | awk '{print $4}' | tr '\n' ' ')"
done
k() { echo "\$ kubectl $*"; "$KUBECTL" --kubeconfig "$WORK/team-a.kubeconfig" "$@"; }
for _ in $(seq 1 60); do
    k get --raw /readyz >/dev/null 2>&1 && break
    sleep 1
done
k version
k get --raw /readyz; echo
k get ns
k -n kube-system get leases
k -n default create configmap gitops-demo --from-literal=hello=world
k -n default get configmap gitops-demo -o jsonpath='{.data.hello}{"\n"}'

echo "== a worker joins team-a: a machine of its own (its network namespace on the lab bridge), its own containerd"
echo "   (bridge CNI), the real kubelet and kube-proxy; gitops lab exec runs the join on that machine"
FLAGS=$($G lab worker --dir "$LAB")
JOIN=$($G join-token create "$REPO" --state-dir "$STATE" --cluster team-a --ttl 1h | tail -1)
echo "\$ gitops lab exec lab-worker-1 -- ${JOIN%%--token*}--token … $FLAGS" | tr '\n' ' '; echo
$G lab exec --dir "$LAB" lab-worker-1 -- $G ${JOIN#gitops } $FLAGS --dir "$WORK/worker" --timeout 300 &
JOINING=$!
signed() {  # wait for the kubelet's certificate request, show gitops's plan for it, apply it
    for _ in $(seq 1 120); do
        $G plan "$REPO" --state-dir "$STATE" | grep -q "$1" && break
        sleep 1
    done
    $G plan "$REPO" --state-dir "$STATE"
    $G apply "$REPO" --state-dir "$STATE" | tail -1
}
signed "kubelet client certificate"
wait $JOINING
JOINING=
signed "kubelet serving certificate"
k wait --for=condition=Ready node/lab-worker-1 --timeout=180s
k get nodes -o wide

echo "== a Deployment of 2 pods on the worker, their logs, and a ClusterIP Service answering another pod"
BUSYBOX=$(.venv/bin/python -c 'import json,sys; print(json.load(open(sys.argv[1]))["images"]["busybox"])' "$LAB/lab.json")
for manifest in web client; do  # the manifests tests/test_workers_lab.py runs
    sed "s|IMAGE|$BUSYBOX|" "gitops/lab/manifests/$manifest.yaml" > "$WORK/$manifest.yaml"
done
k apply -f "$WORK/web.yaml" -f "$WORK/client.yaml"
k rollout status deployment/web --timeout=180s
k wait --for=condition=Ready pod/client --timeout=180s
k get pods -o wide
for pod in $("$KUBECTL" --kubeconfig "$WORK/team-a.kubeconfig" get pods -l app=web -o name); do
    k logs "$pod"
done
sleep 5
k logs client --tail=4

echo "== an etcd backup of team-a: a restic repository, its password age-encrypted to the controller"
cat >> "$REPO/gitops.yaml" <<YAML
  backup:
    targets:
      - name: local
        repository: $WORK/backups
        password: $(head -c 24 /dev/urandom | base64)
YAML
$G secrets encrypt "$REPO/gitops.yaml" --field 'spec.backup.targets[0].password'
printf '  backup:\n    target: local\n    intervalMinutes: 60\n    keep: 3\n' >> "$REPO/clusters/team-a/cluster.yaml"
$G validate "$REPO"
$G backup create "$REPO" --cluster team-a --state-dir "$STATE"
$G backup list "$REPO" --cluster team-a

echo "== the worker's network is its own: its address and kube-proxy's chains live in its namespace"
$G lab exec --dir "$LAB" lab-worker-1 -- ip -br addr show dev eth0
echo "KUBE-* chains in the worker's iptables: $($G lab exec --dir "$LAB" lab-worker-1 -- iptables-save | grep -c '^:KUBE-')"
$G lab check-host --dir "$LAB"

echo "== handing the lab to a controller: the repo in git, the state pushed to its status branch, gitops watch --ui"
ORIGIN=$WORK/origin.git
git init -q --bare -b main "$ORIGIN"
# the controller signs its status commits with a key in its workdir; the repo pins it, so every reader
# of the status branch (gitops status, plan --against-status, the UI) trusts only what it signed
SIGNER=$($G status-key --workdir "$WORK/controller" --principal demo-controller)
printf '  status:\n    signers:\n      - %s\n' "$SIGNER" >> "$REPO/gitops.yaml"
$G validate "$REPO"
git -C "$REPO" init -q -b main
git -C "$REPO" add -A
git -C "$REPO" -c user.name="gitops demo" -c user.email=demo@example.invalid commit -qm "the demo's repo"
git -C "$REPO" push -q "$ORIGIN" HEAD:main
# to the repo the controller watches (a bare one: it has no gitops.yaml to read the pinned signer from)
$G state push --repo "$ORIGIN" --state-dir "$STATE" --identity "$WORK/controller.key" \
    --signing-key "$WORK/controller/status-signing-key" --status-signers "$WORK/controller/status-signing-key.pub"
PORT=$(.venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
nohup $G watch --repo "$ORIGIN" --workdir "$WORK/controller" --identity "$WORK/controller.key" --interval 30s \
    --metrics-address "127.0.0.1:$PORT" --ui > "$WORK/controller.log" 2>&1 &
echo $! > "$WORK/controller.pid"
APPLIED=
for _ in $(seq 1 180); do  # its first reconcile restores the pushed state, finds nothing to change, reports
    curl -fs "http://127.0.0.1:$PORT/metrics" | grep -q 'gitops_reconcile_total{result="applied"}' && APPLIED=1 && break
    sleep 1
done
curl -fs "http://127.0.0.1:$PORT/metrics" | grep '^gitops_reconcile_total' || true
if [ -z "$APPLIED" ]; then
    tail -5 "$WORK/controller.log" >&2
    echo "the controller applied nothing in 180 s: see $WORK/controller.log" >&2
    false
fi
git -C "$ORIGIN" log --oneline -3 gitops/status

echo "== kubectl on team-a as alice, who logs in through tenant-1's OIDC provider (a pod on a public machine)"
(umask 077 && $G kubeconfig "$REPO" --state-dir "$STATE" --cluster team-a --oidc alice > "$WORK/team-a-oidc.kubeconfig")
echo "her kubeconfig's issuer: $(awk '/- --issuer-url/ {getline; print $2}' "$WORK/team-a-oidc.kubeconfig")"
k -n default create role configmap-reader --verb=get,list --resource=configmaps
k -n default create rolebinding tenant-1-viewers --role=configmap-reader --group=oidc:tenant-1-viewers
export PATH=$PWD/.venv/bin:$PATH  # kubectl runs `gitops oidc-login` for the token (the kubeconfig's exec plugin)
a() {
    echo "\$ kubectl --kubeconfig team-a-oidc.kubeconfig $*"
    GITOPS_OIDC_PASSWORD=$PASSWORD XDG_CACHE_HOME=$WORK/oidc-cache \
        "$KUBECTL" --kubeconfig "$WORK/team-a-oidc.kubeconfig" "$@"
}
for _ in $(seq 1 60); do  # RBAC takes the binding in
    GITOPS_OIDC_PASSWORD=$PASSWORD XDG_CACHE_HOME=$WORK/oidc-cache "$KUBECTL" --kubeconfig "$WORK/team-a-oidc.kubeconfig" \
        -n default get configmap gitops-demo >/dev/null 2>&1 && break
    sleep 1
done
a -n default get configmap gitops-demo -o jsonpath='{.data.hello}{"\n"}'
a get nodes 2>&1 || true  # what her group is not bound to: refused

cat <<MSG

Done. A controller now runs the lab (its log: $WORK/controller.log). Its web UI:
  http://127.0.0.1:$PORT/
Stop it with: kill \$(cat $WORK/controller.pid)
Commit to $REPO and push to $ORIGIN (git -C $REPO push $ORIGIN HEAD:main): it applies on its next poll.

The lab is still running (plan and apply decrypt the repo's keys with
GITOPS_IDENTITY=$WORK/controller.key: export it first):
  $G lab status --dir $LAB
  $G cri ps $REPO
  $G backup list $REPO --cluster team-a
  $G status --repo $REPO --ref gitops/status  (after: git -C $REPO fetch $ORIGIN gitops/status:gitops/status)
  $KUBECTL --kubeconfig $WORK/team-a.kubeconfig get --raw /readyz
  GITOPS_OIDC_PASSWORD=… $KUBECTL --kubeconfig $WORK/team-a-oidc.kubeconfig -n default get configmaps  (as alice;
    her password: $WORK/oidc-user.txt; without the variable, gitops oidc-login asks for it)
Tear it all down with (the worker leaves with the lab; running the demo again does this first):
  kill \$(cat $WORK/controller.pid)
  $G lab down --dir $LAB
MSG
