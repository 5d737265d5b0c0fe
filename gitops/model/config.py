"""`gitops.yaml`: repo-wide settings, with sensible defaults when absent."""
from __future__ import annotations

from dataclasses import dataclass, field

CONFIG_FILE = "gitops.yaml"


@dataclass(frozen=True)
class PrunePolicy:
    enabled: bool = True
    max_deletes: int = 10


@dataclass(frozen=True)
class RepoConfig:
    paths: tuple[str, ...] = (".",)
    status_branch: str = "gitops/status"
    kubeconfig_recipients: tuple[str, ...] = ()
    prune: PrunePolicy = field(default_factory=PrunePolicy)
    renew_before_days: int = 30

    @classmethod
    def from_spec(cls, spec: dict) -> "RepoConfig":
        """Build from a schema-valid `spec` (missing fields take defaults)."""
        prune = spec.get("prune", {})
        defaults = cls()
        return cls(
            paths=tuple(spec.get("paths", defaults.paths)),
            status_branch=spec.get("statusBranch", defaults.status_branch),
            kubeconfig_recipients=tuple(spec.get("kubeconfigRecipients", ())),
            prune=PrunePolicy(
                enabled=prune.get("enabled", PrunePolicy.enabled),
                max_deletes=prune.get("maxDeletes", PrunePolicy.max_deletes),
            ),
            renew_before_days=spec.get("certificates", {}).get("renewBeforeDays", defaults.renew_before_days),
        )
