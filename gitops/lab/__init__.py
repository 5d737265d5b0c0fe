"""A local lab: real containerd "hypervisors" (and mTLS fronts) for development and tests."""
from gitops.lab.errors import LabError
from gitops.lab import lab
from gitops.lab.lab import (
    DownReport,
    LabHypervisor,
    LabInfo,
    LabStatus,
    alias_image,
    default_dir,
    down,
    heal,
    hypervisor_document,
    hypervisors_yaml,
    import_image,
    info,
    kill_containerd,
    lose_hypervisor,
    partition,
    power_off,
    power_on,
    start_containerd,
    status,
    up,
)

__all__ = [
    "DownReport", "LabError", "LabHypervisor", "LabInfo", "LabStatus", "alias_image", "default_dir", "down", "heal",
    "hypervisor_document", "hypervisors_yaml", "import_image", "info", "kill_containerd", "lose_hypervisor",
    "partition", "power_off", "power_on", "start_containerd", "status", "up",
]
