#!/usr/bin/env bash
# The main job on the embedded default: install gitops, start a local lab of 3
# real containerd hypervisors (one public; one reached over mutual TLS through
# haproxy), write the example repo wired to it, then plan and apply it.
# The lab stays up afterwards so you can look around; the last lines say how
# to inspect it and tear it down.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh

G=.venv/bin/gitops
WORK=${GITOPS_DEMO_DIR:-/tmp/gitops-demo}
LAB=$WORK/lab
REPO=$WORK/repo
STATE=$WORK/state

if [ -f "$LAB/lab.json" ]; then
    echo "== tearing down the previous demo lab"
    $G lab down --dir "$LAB"
fi
rm -rf "$REPO" "$STATE"
mkdir -p "$WORK"

echo "== gitops lab up: 3 containerd hypervisors (1 public), mTLS fronts"
$G lab up --dir "$LAB" --hypervisors 3 --public 1 --remote > "$WORK/lab-hypervisors.yaml"
$G lab status --dir "$LAB"

echo "== the example repo, wired to the lab: $REPO"
$G lab example-repo --dir "$LAB" "$REPO"
$G validate "$REPO"

echo "== gitops plan"
$G plan "$REPO" --state-dir "$STATE"

echo "== gitops apply"
$G apply "$REPO" --state-dir "$STATE"

echo "== gitops plan again: nothing left to do"
$G plan "$REPO" --state-dir "$STATE" --detailed-exitcode

echo "== what runs where"
$G cri pods "$REPO"

echo "== the team-a API through its ingress, with the admin kubeconfig"
$G kubeconfig "$REPO" --state-dir "$STATE" --cluster team-a > "$WORK/team-a.kubeconfig"
.venv/bin/python - "$WORK/team-a.kubeconfig" <<'PY'
import base64, http.client, os, ssl, sys, tempfile, time, yaml
kc = yaml.safe_load(open(sys.argv[1]))
server = kc["clusters"][0]["cluster"]["server"]
with tempfile.TemporaryDirectory() as d:  # the admin key only lives here for the call
    def put(name, data):
        path = os.path.join(d, name)
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
        return path
    ctx = ssl.create_default_context(cafile=put("ca", kc["clusters"][0]["cluster"]["certificate-authority-data"]))
    ctx.load_cert_chain(put("crt", kc["users"][0]["user"]["client-certificate-data"]),
                        put("key", kc["users"][0]["user"]["client-key-data"]))
host, port = server.removeprefix("https://").rsplit(":", 1)
for attempt in range(20):
    try:
        conn = http.client.HTTPSConnection(host, int(port), context=ctx, timeout=5)
        conn.request("GET", "/version")
        r = conn.getresponse()
        print(f"GET {server}/version -> {r.status} {r.read().decode()}")
        break
    except OSError:
        time.sleep(0.5)
else:
    sys.exit("the API did not answer through the ingress")
PY

cat <<MSG

Done. The lab is still running:
  $G lab status --dir $LAB
  $G cri ps $REPO
  $G plan $REPO --state-dir $STATE
Edit $REPO (e.g. delete a Node), then plan and apply again.
Tear it all down with:
  $G lab down --dir $LAB
MSG
