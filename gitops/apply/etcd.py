"""etcd membership changes through etcd's v3 JSON gateway, over mutual TLS (`gitops.etcdclient`)."""
from __future__ import annotations

import http.client
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gitops.errors import GitopsError
from gitops.etcdclient import client_context
from gitops.pki import CertKey

log = logging.getLogger(__name__)

TIMEOUT = 10.0
#: a defragmentation rewrites the whole database file: a large one takes minutes
DEFRAGMENT_TIMEOUT = 600.0
#: how long a membership change keeps retrying while etcd is busy (leader
#: election after a change, or its strict check that members have been
#: connected for a few seconds: "unhealthy cluster")
SETTLE = 45.0
#: etcd's answers (HTTP 500 through the gateway) that mean "not now": a member just added has
#: not started yet, a leader election is under way, or a request timed out during one
TRANSIENT = ("not enough started members", "unhealthy cluster", "leader changed", "request timed out",
             "no leader", "can only promote a learner member which is in sync with leader")


class EtcdError(GitopsError):
    """`refused`: every member asked refused the connection (nothing listens there: not running)."""

    def __init__(self, message: str, retryable: bool = False, refused: bool = False):
        super().__init__(message)
        self.retryable = retryable
        self.refused = refused


@dataclass(frozen=True)
class Member:
    id: str
    name: str
    peer_urls: tuple[str, ...]
    learner: bool = False
    client_urls: tuple[str, ...] = ()


class EtcdAdmin:
    """Member list/add/remove against the first client URL that answers."""

    def __init__(self, ca: CertKey, client_urls: list[str], trust: str = "",
                 fenced: Callable[[], str | None] = lambda: None):
        """`ca` issues the client certificate; `trust` (default: `ca`'s certificate) verifies the members
        (during a CA rotation: the bundle of old and new); `fenced` is asked before every pause of a wait
        (several controllers: why this one may no longer act, e.g. its shard Lease went stale)."""
        if not client_urls:
            raise EtcdError("no etcd member to talk to")
        self.client_urls = client_urls
        self._fenced = fenced
        self._ctx = client_context(ca, trust)

    def close(self) -> None:
        """Nothing to clean up (no file was written); kept for `with EtcdAdmin(...)`."""

    def __enter__(self) -> "EtcdAdmin":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _post(self, path: str, body: dict[str, Any], urls: list[str] | None = None,
              timeout: float = TIMEOUT, replay: bool = False) -> dict[str, Any]:
        """POST to the first of `urls` (default: every member this admin knows) that answers. A request
        that failed before it was sent (urllib's URLError: connecting, TLS, sending) goes to the next
        one; one sent and not answered (a timeout, a reset) may have been applied all the same, so it
        goes on only when `replay` (a read, or a write whose repetition changes nothing), else it is a
        retryable error for the caller to check what etcd holds now."""
        errors, refused = [], True
        for url in urls or self.client_urls:
            request = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"}, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=timeout, context=self._ctx) as response:
                    return json.loads(response.read() or b"{}")
            except urllib.error.HTTPError as err:
                detail = err.read().decode(errors="replace")
                raise EtcdError(f"etcd {path} at {url}: HTTP {err.code}: {detail}",
                                retryable=err.code in (503, 504) or any(t in detail for t in TRANSIENT)) from None
            except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as err:
                if not replay and not isinstance(err, urllib.error.URLError):
                    raise EtcdError(f"etcd {path} at {url}: sent, no answer ({err}): it may have been applied",
                                    retryable=True) from None
                reason = getattr(err, "reason", err)
                refused = refused and isinstance(reason, ConnectionRefusedError)
                errors.append(f"{url}: {reason}")
        raise EtcdError(f"etcd {path}: no member answered ({'; '.join(errors)})", retryable=True,
                        refused=refused and bool(errors))

    def _pause(self, seconds: float) -> None:
        """Sleep inside a wait, unless this controller may no longer act (a wait is no call in flight)."""
        why = self._fenced()
        if why:
            raise EtcdError(f"fenced while waiting on etcd: {why}")
        time.sleep(seconds)

    def _settled(self, change, timeout: float = SETTLE):
        """Run an idempotent membership change, retrying while etcd settles (each try reads the members
        again: a change answered with an error, or not at all, may have been applied)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return change()
            except EtcdError as err:
                if not err.retryable or time.monotonic() > deadline:
                    raise
                self._pause(1.0)

    def members(self) -> list[Member]:
        data = self._post("/v3/cluster/member/list", {}, replay=True)
        return sorted((Member(str(m["ID"]), m.get("name", ""), tuple(m.get("peerURLs", [])),
                              bool(m.get("isLearner", False)), tuple(m.get("clientURLs", [])))
                       for m in data.get("members", [])), key=lambda m: (m.name, m.id))

    def _holding(self, peer_url: str) -> Member | None:
        """The member holding `peer_url`, or None."""
        return next((m for m in self.members() if peer_url in m.peer_urls), None)

    def add(self, peer_url: str, learner: bool = False) -> None:
        """Add a member by peer URL (as a non-voting learner when asked); one already holding it is success."""
        def change() -> None:
            if self._holding(peer_url) is not None:
                return
            try:
                self._post("/v3/cluster/member/add", {"peerURLs": [peer_url], "isLearner": learner})
            except EtcdError:
                # an add answered with an error or not at all may be in etcd all the same (once applied, a
                # repeated one answers "member ID already exist" or "Peer URLs already exists")
                if self._holding(peer_url) is None:
                    raise
        self._settled(change)

    def promote(self, peer_url: str, timeout: float = SETTLE) -> None:
        """Make the learner at `peer_url` a voting member, retrying while it catches up; a voter is success."""
        def change() -> None:
            member = self._holding(peer_url)
            if member is None:
                raise EtcdError(f"no etcd member with peer URL {peer_url} to promote")
            if not member.learner:
                return
            try:
                self._post("/v3/cluster/member/promote", {"ID": member.id})
            except EtcdError:
                # applied though unanswered, a repeated one answers "can only promote a learner member"
                now = self._holding(peer_url)
                if now is None or now.learner:
                    raise
        self._settled(change, timeout)

    def wait_healthy(self, urls: list[str], timeout: float, what: str) -> None:
        """Until every member at `urls` answers /health true (it has a leader, no alarm, and serves a
        quorum read), or raise after `timeout` seconds naming the members that are not."""
        _wait_all(self, urls, timeout, what, "healthy", self.unhealthy)

    def wait_serving(self, urls: list[str], timeout: float, what: str) -> None:
        """Until every member at `urls` answers its status with a leader known: what a defragmentation needs
        of the others (unlike /health, true also under a NOSPACE alarm, which the upkeep is there to clear)."""
        _wait_all(self, urls, timeout, what, "serving", self._not_serving)

    def unhealthy(self, url: str) -> str:
        """Why the member at `url` is not healthy, or "" when it is."""
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=TIMEOUT, context=self._ctx) as response:
                data = json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as err:
            return f"HTTP {err.code}"
        except (urllib.error.URLError, OSError, ValueError) as err:
            return str(getattr(err, "reason", err))
        return "" if str(data.get("health")) == "true" else (data.get("reason") or "health false")

    def _not_serving(self, url: str) -> str:
        """Why the member at `url` does not answer its status with a leader known, or "" when it does."""
        try:
            status = self._post("/v3/maintenance/status", {}, [url], replay=True)
        except EtcdError as err:
            return str(err)
        return "no leader" if str(status.get("leader", "0")) in ("", "0") else ""

    def defragment(self, url: str) -> None:
        """Rewrite the database file of the member at `url` (it answers nothing meanwhile)."""
        self._post("/v3/maintenance/defragment", {}, [url], timeout=DEFRAGMENT_TIMEOUT)

    def disarm(self, alarm: str) -> int:
        """Clear every `alarm` (e.g. NOSPACE) the cluster holds; how many were cleared. (etcd answers success
        to clearing an alarm that is not raised, so one unanswered may be asked again of another member.)"""
        raised = self._post("/v3/maintenance/alarm", {"action": "GET"}, replay=True).get("alarms") or []
        cleared = 0
        for entry in raised:
            if entry.get("alarm") == alarm:
                self._post("/v3/maintenance/alarm", {"action": "DEACTIVATE", "memberID": entry.get("memberID"),
                                                      "alarm": alarm}, replay=True)
                cleared += 1
        return cleared

    def hand_off_leadership(self, client_url: str, timeout: float = SETTLE, prefer: tuple[str, ...] = ()) -> bool:
        """If the member at `client_url` leads, make another voting member the leader first (the first one
        holding a URL of `prefer`, else the first by name), so that stopping it costs the cluster no
        election. True when leadership moved. A member that refuses the connection does not run, so it
        leads nothing (a run killed while it stopped, resumed: its peers' health is the gate's to check)."""
        try:
            status = self._post("/v3/maintenance/status", {}, [client_url], replay=True)
        except EtcdError as err:
            if not err.refused:
                raise
            log.warning("etcd member at %s refuses connections (%s): not running, no leadership to hand off",
                        client_url, err)
            return False
        me, leader = str(status.get("header", {}).get("member_id", "")), str(status.get("leader", ""))
        if not me or me != leader:
            return False
        return _move_leadership(self, me, [client_url], timeout, prefer)

    def hand_off_from(self, name: str, timeout: float = SETTLE, prefer: tuple[str, ...] = (),
                      peer_url: str = "") -> bool:
        """If the member called `name` (the one holding `peer_url`, when given) leads (asked of this admin's
        members), move leadership away from it first (to the first voting member holding a URL of
        `prefer`): a leader removed outright leaves the others without one until they elect another. True
        when leadership moved."""
        leader = str(self._post("/v3/maintenance/status", {}, replay=True).get("leader", ""))
        member = next((m for m in self.members() if _is(m, name, peer_url)), None)
        if member is None or member.id != leader or not member.client_urls:
            return False
        return _move_leadership(self, member.id, list(member.client_urls), timeout, prefer)

    def remove(self, name: str, peer_url: str = "") -> bool:
        """Remove the member called `name` (the one holding `peer_url`, when given); False when it was absent
        before this call asked etcd to remove it."""
        asked = False

        def change() -> bool:
            nonlocal asked
            member = next((m for m in self.members() if _is(m, name, peer_url)), None)
            if member is None:
                return asked  # gone: by an earlier try of this call, whose answer was an error or none
            asked = True
            try:
                self._post("/v3/cluster/member/remove", {"ID": member.id})
            except EtcdError:
                # applied though unanswered, a repeated one answers "member not found"
                if any(m.id == member.id for m in self.members()):
                    raise
            return True
        return bool(self._settled(change))


def _wait_all(admin: EtcdAdmin, urls: list[str], timeout: float, what: str, state: str,
              why_not: Callable[[str], str]) -> None:
    """Until `why_not` says "" of every member at `urls`, or raise after `timeout` seconds naming the others."""
    deadline = time.monotonic() + timeout
    while True:
        sick = [f"{url} ({why})" for url in urls if (why := why_not(url))]
        if not sick:
            return
        if time.monotonic() > deadline:
            raise EtcdError(f"{what}: etcd not {state} after {timeout:.0f}s: {'; '.join(sick)}")
        admin._pause(1.0)


def _move_leadership(admin: EtcdAdmin, leader: str, leader_urls: list[str], timeout: float,
                     prefer: tuple[str, ...]) -> bool:
    """Leadership moved from `leader` (at `leader_urls`) to another voting member, `prefer`'s first."""
    others = [m for m in admin.members() if m.id != leader and not m.learner]
    if not others:
        return False
    ranked = sorted(others, key=lambda m: min((prefer.index(u) for u in m.client_urls if u in prefer),
                                              default=len(prefer)))
    try:
        admin._post("/v3/maintenance/transfer-leadership", {"targetID": ranked[0].id}, leader_urls)
    except EtcdError as err:
        if err.refused:
            # stopped (a killed run) while its peers still name it: they elect another without it
            log.warning("etcd leader at %s refuses connections (%s): not running, nothing to hand off",
                        leader_urls[0], err)
            return False
        # answered with an error or not at all, the transfer may have happened (or still happen): what the
        # member says now decides (waiting for it only when the error may pass: a timeout, an election)
        if not _moved(admin, leader, leader_urls, timeout if err.retryable else 0.0):
            raise
        return True
    if not _moved(admin, leader, leader_urls, timeout):
        raise EtcdError(f"etcd leadership did not move away from {leader_urls[0]} in {timeout:.0f}s")
    return True


def _moved(admin: EtcdAdmin, leader: str, leader_urls: list[str], timeout: float) -> bool:
    """Whether the member at `leader_urls` names a leader other than `leader` within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while str(admin._post("/v3/maintenance/status", {}, leader_urls, replay=True).get("leader", "")) == leader:
        if time.monotonic() > deadline:
            return False
        admin._pause(0.2)
    return True


def _is(member: Member, name: str, peer_url: str) -> bool:
    """Whether `member` is the one holding `peer_url` (when given: names repeat while a member moves
    learner-first) or else the one called `name`."""
    return peer_url in member.peer_urls if peer_url else member.name == name
