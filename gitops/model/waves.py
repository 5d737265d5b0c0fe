"""Which rollout wave each Cluster is in (`spec.rollout.waves` of gitops.yaml), and the checks a schema cannot make."""
from __future__ import annotations

from collections.abc import Mapping

from gitops.model.build import label_selector
from gitops.model.config import CONFIG_FILE, Rollout, Wave
from gitops.model.diagnostics import Diagnostic
from gitops.model.repo import LoadedRepo


def wave_of(labels: Mapping[str, str], rollout: Rollout) -> int | None:
    """The index of the first wave whose selector takes a Cluster with `labels` (a wave without one takes
    every cluster); None when none does, or there are no waves."""
    for index, wave in enumerate(rollout.waves):
        if wave.selector is None or label_selector(wave.selector).matches(dict(labels)):
            return index
    return None


def takes_all(wave: Wave) -> bool:
    """No selector, or one that says nothing (`{}`): every cluster no earlier wave took."""
    return not wave.selector or not (wave.selector.get("matchLabels") or wave.selector.get("matchExpressions"))


def rollout_waves(repo: LoadedRepo) -> list[Diagnostic]:
    """Waves named once, none after a wave without selector, not with shards; every Cluster in a wave."""
    doc, rollout = repo.config_document, repo.config.rollout
    if doc is None or not rollout.waves:
        return []
    out = []
    seen: set[str] = set()
    for index, wave in enumerate(rollout.waves):
        where = ("spec", "rollout", "waves", index)
        if wave.name in seen:
            out.append(doc.error((*where, "name"), f"wave {wave.name!r} is named twice"))
        seen.add(wave.name)
        if index and takes_all(rollout.waves[index - 1]):
            out.append(doc.error(where, f"wave {wave.name!r} comes after wave {rollout.waves[index - 1].name!r}, "
                                        "which has no selector (or an empty one) and takes every cluster left: "
                                        "it would stay empty"))
    if repo.config.coordination.mode == "shards":
        out.append(doc.error(("spec", "rollout", "waves"), "waves need one controller to roll the whole fleet: "
                                                           "not with spec.coordination.mode shards"))
    names = ", ".join(w.name for w in rollout.waves)
    for cluster in repo.valid:
        if cluster.kind == "Cluster" and wave_of(cluster.get(("metadata", "labels")) or {}, rollout) is None:
            out.append(cluster.error(("metadata", "labels"), f"Cluster {cluster.name} is in no wave of {CONFIG_FILE} "
                                                             f"spec.rollout.waves ({names}): end them with a wave "
                                                             "without selector, or label the cluster"))
    return out
