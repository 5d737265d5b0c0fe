"""Apply's handler of the recorded state alone: a CA rotation's next phase."""
from __future__ import annotations

from gitops.apply.run import ApplyError, Run
from gitops.plan.actions import Action
from gitops.plan.payloads import RotationStep


def advance_ca_rotation(run: Run, action: Action, p: RotationStep) -> None:
    """Record the next phase of the cluster's CA rotation: the phase the plan ran is done."""
    record = run.state.clusters.get(p.cluster)
    rotation = record.rotation if record is not None else None
    if record is None or rotation is None or (rotation.generation, rotation.phase) != (p.generation, p.phase):
        now = f"{rotation.generation}/{rotation.phase}" if rotation is not None else "none"
        raise ApplyError(f"cluster {p.cluster}: the plan ends CA rotation phase {p.generation}/{p.phase}, but the "
                         f"recorded rotation is {now}; plan again")
    with run.recording() as state:
        state.clusters[p.cluster] = record.next_phase()
