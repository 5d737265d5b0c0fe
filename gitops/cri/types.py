"""Typed, protobuf-free views of CRI objects, and the specs used to create them."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class SandboxState(str, Enum):
    READY = "ready"
    NOT_READY = "notready"


class ContainerState(str, Enum):
    CREATED = "created"
    RUNNING = "running"
    EXITED = "exited"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class RuntimeVersion:
    runtime_name: str
    runtime_version: str
    runtime_api_version: str


@dataclass(frozen=True, slots=True)
class RuntimeCondition:
    type: str
    status: bool
    reason: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True)
class RuntimeStatus:
    conditions: tuple[RuntimeCondition, ...]

    @property
    def ready(self) -> bool:
        """RuntimeReady is true (NetworkReady is irrelevant for host-network pods)."""
        return any(c.type == "RuntimeReady" and c.status for c in self.conditions)


@dataclass(frozen=True, slots=True)
class Sandbox:
    """A pod sandbox as listed (or inspected: then `ip` is set)."""

    id: str
    name: str
    namespace: str
    uid: str
    attempt: int
    state: SandboxState
    created_at: int  # nanoseconds since the epoch
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    ip: str = ""


@dataclass(frozen=True, slots=True)
class Container:
    """A container as listed (or inspected: then the status fields are set)."""

    id: str
    sandbox_id: str
    name: str
    attempt: int
    image: str       # the image as requested
    image_ref: str   # the resolved image (digest or id)
    state: ContainerState
    created_at: int  # nanoseconds since the epoch
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    started_at: int = 0
    finished_at: int = 0
    exit_code: int = 0
    reason: str = ""
    message: str = ""
    log_path: str = ""


@dataclass(frozen=True, slots=True)
class Image:
    id: str
    repo_tags: tuple[str, ...]
    repo_digests: tuple[str, ...]
    size: int


@dataclass(frozen=True, slots=True)
class Mount:
    """A bind mount from the hypervisor into a container."""

    container_path: str
    host_path: str
    readonly: bool = False


@dataclass(frozen=True, slots=True)
class SandboxSpec:
    """What to run a pod sandbox with. gitops pods share the hypervisor's network."""

    name: str
    namespace: str = "gitops"
    uid: str = ""  # defaults to namespace/name
    attempt: int = 0
    hostname: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    log_directory: str = ""
    host_network: bool = True


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """What to create a container with."""

    name: str
    image: str
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    working_dir: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    attempt: int = 0
    log_path: str = ""  # relative to the sandbox's log_directory
    privileged: bool = False
    #: capabilities added to the runtime's default set (e.g. NET_ADMIN for keepalived)
    capabilities: tuple[str, ...] = ()
    #: the uid it runs as (None: the image's user)
    user: int | None = None
