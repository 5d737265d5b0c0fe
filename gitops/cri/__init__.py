"""CRI runtime.v1 client: talk to a container runtime at a CRIEndpoint (knows no repo model)."""
from gitops.cri.client import CRIClient, connect, open_channel, read_all
from gitops.cri.endpoint import CRIEndpoint
from gitops.cri.errors import CRIError, Reason
from gitops.cri.types import (
    Container,
    ContainerSpec,
    ContainerState,
    Image,
    Mount,
    RuntimeCondition,
    RuntimeStatus,
    RuntimeVersion,
    Sandbox,
    SandboxSpec,
    SandboxState,
)

__all__ = [
    "CRIClient", "CRIEndpoint", "CRIError", "Container", "ContainerSpec", "ContainerState", "Image", "Mount",
    "Reason", "RuntimeCondition", "RuntimeStatus", "RuntimeVersion", "Sandbox", "SandboxSpec",
    "SandboxState", "connect", "open_channel", "read_all",
]
