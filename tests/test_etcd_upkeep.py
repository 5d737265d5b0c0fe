"""etcd upkeep (issue #29.5) against a real etcd over mutual TLS (no lab): a member filled past a
16 MiB quota raises NOSPACE; once the keys are deleted and compacted, observation reads the space and
the alarm, the plan defragments the member and clears the alarm, and apply's calls do exactly that:
the file shrinks, the alarm is gone, writes go through again. The plan's rules without etcd: one
member at a time with the leader last, nothing unless every member answered, a warning when the data
in use is still near the quota. (The lab test on the real control plane: test_recovery_lab.py.)"""
from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from children import stop_all
from test_backup import IP, start_etcd, work  # noqa: F401  (the `work` fixture)

from gitops.apply.etcd import EtcdAdmin
from gitops.compile.desired import DesiredCluster, EtcdMember
from gitops.etcdclient import client_context
from gitops.observe.etcd import _cluster
from gitops.observe.types import EtcdMemberSpace, ObservedEtcd
from gitops.pki import create_ca
from gitops.plan.actions import Kind
from gitops.plan.upkeep import space_condition, upkeep

pytestmark = pytest.mark.lab("etcd")  # test_backup's etcd address

QUOTA = 16 << 20


def _post(context, url: str, path: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def _key(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_nospace_is_observed_then_defragmented_and_cleared_on_a_real_etcd(work: Path) -> None:  # noqa: F811
    ca = create_ca("upkeep-test-etcd-ca")
    proc, url = start_etcd(work, ca, extra=(f"--quota-backend-bytes={QUOTA}",))
    try:
        context = client_context(ca)
        value = base64.b64encode(b"x" * (512 << 10)).decode()
        answered = 0
        for i in range(200):
            code, answer = _post(context, url, "/v3/kv/put", {"key": _key(f"fill/{i:03d}"), "value": value})
            if code != 200:
                break
            answered += 1
        # how many fit under the quota varies with bbolt's page allocation (18 to 24 of these here)
        assert answered >= 10 and "database space exceeded" in json.dumps(answer), (answered, answer)
        # the put that raised the alarm was refused, yet etcd may have kept it (the alarm is raised by the write
        # that crosses the quota): what is stored is what a read counts, not what the answers said
        code, counted = _post(context, url, "/v3/kv/range", {"key": _key("fill/"), "range_end": _key("fill0"),
                                                             "count_only": True})
        stored = int(counted.get("count", 0))
        assert code == 200 and stored in (answered, answered + 1), (answered, counted)
        seen = _cluster(ca, ca.cert_pem, (("m1", url),))
        assert seen.alarms == (("m1", "NOSPACE"),)
        want = DesiredCluster("c1", (EtcdMember("m1", "", url),), None, etcd_quota=QUOTA)
        ok, reason, message = space_condition(want, seen)
        assert (ok, reason) == (False, "EtcdAlarm") and message.startswith("NOSPACE on m1; database "), message
        # deletions still go through under NOSPACE; compaction frees the space in use
        code, deleted = _post(context, url, "/v3/kv/deleterange", {"key": _key("fill/"), "range_end": _key("fill0")})
        assert code == 200 and int(deleted["deleted"]) == stored, (stored, deleted)
        _post(context, url, "/v3/kv/compaction", {"revision": deleted["header"]["revision"], "physical": True})
        before = _cluster(ca, ca.cert_pem, (("m1", url),), QUOTA).members[0]
        assert before.db_size >= QUOTA * 0.9, before
        # the plan, then what apply's actions call, until nothing is left: the file defragmented first; the alarm
        # cleared in the same plan, or in the next one when etcd still counted the space in use high (it counts
        # it again only at its next write)
        rounds = []
        for _ in range(3):
            seen = _cluster(ca, ca.cert_pem, (("m1", url),), QUOTA)
            actions, warnings = upkeep("c1", want, seen, {"m1": "hv-1"}, 30)
            if not actions:
                break
            rounds.append([a.kind for a in actions])
            with EtcdAdmin(ca, [url]) as etcd:
                etcd.wait_serving([url], 30, "under NOSPACE")
                for action in actions:
                    if action.kind == Kind.DEFRAGMENT_ETCD:
                        etcd.defragment(url)
                    else:
                        assert etcd.disarm("NOSPACE") == 1
        assert rounds[0][0] == Kind.DEFRAGMENT_ETCD and rounds[-1][-1] == Kind.DISARM_ETCD_ALARM, rounds
        after = _cluster(ca, ca.cert_pem, (("m1", url),), QUOTA)
        assert after.alarms == () and after.members[0].db_size < before.db_size // 2, after
        assert _post(context, url, "/v3/kv/put", {"key": _key("after"), "value": _key("ok")})[0] == 200
        assert upkeep("c1", want, after, {"m1": "hv-1"}, 30) == ([], [])
    finally:
        stop_all([proc])


def test_members_are_defragmented_one_at_a_time_the_leader_last_and_only_when_all_answer() -> None:
    members = tuple(EtcdMember(f"m{i}", "", f"https://{IP}:{i}") for i in (1, 2, 3))
    want = DesiredCluster("c1", members, None)
    big, small = 200 << 20, 20 << 20
    seen = ObservedEtcd((EtcdMemberSpace("m1", members[0].client_url, big, small, leader=True),
                         EtcdMemberSpace("m2", members[1].client_url, big, small),
                         EtcdMemberSpace("m3", members[2].client_url, big, big - (1 << 20))))
    actions, _ = upkeep("c1", want, seen, {"m1": "a", "m2": "b", "m3": "c"}, 60)
    assert [a.node for a in actions] == ["m2", "m1"]  # m3's file is in use; the leader goes last
    assert actions[1].payload.peers == (members[1].client_url, members[2].client_url)
    assert "leadership first moves" in actions[1].details[-1]
    down = ObservedEtcd((*seen.members[:2], EtcdMemberSpace("m3", members[2].client_url, error="timed out")))
    assert upkeep("c1", want, down, {}, 60) == ([], [])
    ok, reason, _ = space_condition(want, ObservedEtcd((EtcdMemberSpace("m1", "", 1 << 20, 1 << 20),)))
    assert (ok, reason) == (True, "WithinQuota")
    # out of space with the data in use still near the quota: no alarm cleared (it would fire again), a warning
    quota = 64 << 20
    full = ObservedEtcd(tuple(EtcdMemberSpace(m.node, m.client_url, quota, quota - (1 << 20)) for m in members),
                        (("m1", "NOSPACE"),))
    actions, warnings = upkeep("c1", DesiredCluster("c1", members, None, etcd_quota=quota), full, {}, 60)
    assert actions == [] and len(warnings) == 1
    assert "etcd is out of space (NOSPACE alarm on m1): 63.0 MiB of its 64.0 MiB quota is in use" in warnings[0]
    assert "delete objects" in warnings[0] and "raise spec.etcd.quotaBackendBytes" in warnings[0]
