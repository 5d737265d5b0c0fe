"""Conversions between the typed views in gitops.cri.types and CRI protobufs."""
from __future__ import annotations

from gitops.cri.pb import runtime_pb2 as pb
from gitops.cri.types import (
    Container,
    ContainerSpec,
    ContainerState,
    Image,
    RuntimeCondition,
    RuntimeStatus,
    Sandbox,
    SandboxSpec,
    SandboxState,
)

SANDBOX_STATE_TO_PB = {SandboxState.READY: pb.SANDBOX_READY, SandboxState.NOT_READY: pb.SANDBOX_NOTREADY}
SANDBOX_STATE_FROM_PB = {v: k for k, v in SANDBOX_STATE_TO_PB.items()}
CONTAINER_STATE_TO_PB = {
    ContainerState.CREATED: pb.CONTAINER_CREATED,
    ContainerState.RUNNING: pb.CONTAINER_RUNNING,
    ContainerState.EXITED: pb.CONTAINER_EXITED,
    ContainerState.UNKNOWN: pb.CONTAINER_UNKNOWN,
}
CONTAINER_STATE_FROM_PB = {v: k for k, v in CONTAINER_STATE_TO_PB.items()}


def runtime_status(status: pb.RuntimeStatus) -> RuntimeStatus:
    return RuntimeStatus(tuple(RuntimeCondition(c.type, c.status, c.reason, c.message)
                               for c in status.conditions))


def sandbox(s: pb.PodSandbox) -> Sandbox:
    return Sandbox(id=s.id, name=s.metadata.name, namespace=s.metadata.namespace,
                   uid=s.metadata.uid, attempt=s.metadata.attempt,
                   state=SANDBOX_STATE_FROM_PB.get(s.state, SandboxState.NOT_READY),
                   created_at=s.created_at, labels=dict(sorted(s.labels.items())),
                   annotations=dict(sorted(s.annotations.items())))


def sandbox_status(s: pb.PodSandboxStatus) -> Sandbox:
    return Sandbox(id=s.id, name=s.metadata.name, namespace=s.metadata.namespace,
                   uid=s.metadata.uid, attempt=s.metadata.attempt,
                   state=SANDBOX_STATE_FROM_PB.get(s.state, SandboxState.NOT_READY),
                   created_at=s.created_at, labels=dict(sorted(s.labels.items())),
                   annotations=dict(sorted(s.annotations.items())), ip=s.network.ip)


def container(c: pb.Container) -> Container:
    return Container(id=c.id, sandbox_id=c.pod_sandbox_id, name=c.metadata.name,
                     attempt=c.metadata.attempt, image=c.image.image, image_ref=c.image_ref,
                     state=CONTAINER_STATE_FROM_PB.get(c.state, ContainerState.UNKNOWN),
                     created_at=c.created_at, labels=dict(sorted(c.labels.items())),
                     annotations=dict(sorted(c.annotations.items())))


def container_status(c: pb.ContainerStatus, sandbox_id: str) -> Container:
    return Container(id=c.id, sandbox_id=sandbox_id, name=c.metadata.name,
                     attempt=c.metadata.attempt, image=c.image.image, image_ref=c.image_ref,
                     state=CONTAINER_STATE_FROM_PB.get(c.state, ContainerState.UNKNOWN),
                     created_at=c.created_at, labels=dict(sorted(c.labels.items())),
                     annotations=dict(sorted(c.annotations.items())), started_at=c.started_at,
                     finished_at=c.finished_at, exit_code=c.exit_code, reason=c.reason,
                     message=c.message, log_path=c.log_path)


def image(i: pb.Image) -> Image:
    return Image(id=i.id, repo_tags=tuple(sorted(i.repo_tags)),
                 repo_digests=tuple(sorted(i.repo_digests)), size=i.size)


def _namespaces(host_network: bool) -> pb.NamespaceOption:
    return pb.NamespaceOption(network=pb.NODE if host_network else pb.POD,
                              pid=pb.CONTAINER, ipc=pb.POD)


def sandbox_config(spec: SandboxSpec) -> pb.PodSandboxConfig:
    return pb.PodSandboxConfig(
        metadata=pb.PodSandboxMetadata(name=spec.name, namespace=spec.namespace,
                                       uid=spec.uid or f"{spec.namespace}/{spec.name}",
                                       attempt=spec.attempt),
        hostname=spec.hostname,
        log_directory=spec.log_directory,
        labels=dict(spec.labels),
        annotations=dict(spec.annotations),
        linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
            namespace_options=_namespaces(spec.host_network))),
    )


def sandbox_config_from_status(s: pb.PodSandboxStatus) -> pb.PodSandboxConfig:
    """The parts of a sandbox's config that CreateContainer needs, from its status."""
    host_network = s.linux.namespaces.options.network == pb.NODE
    return pb.PodSandboxConfig(
        metadata=s.metadata, labels=dict(s.labels), annotations=dict(s.annotations),
        linux=pb.LinuxPodSandboxConfig(security_context=pb.LinuxSandboxSecurityContext(
            namespace_options=_namespaces(host_network))),
    )


def container_config(spec: ContainerSpec, *, host_network: bool) -> pb.ContainerConfig:
    return pb.ContainerConfig(
        metadata=pb.ContainerMetadata(name=spec.name, attempt=spec.attempt),
        image=pb.ImageSpec(image=spec.image),
        command=list(spec.command),
        args=list(spec.args),
        working_dir=spec.working_dir,
        envs=[pb.KeyValue(key=k, value=v) for k, v in sorted(spec.env.items())],
        mounts=[pb.Mount(container_path=m.container_path, host_path=m.host_path,
                         readonly=m.readonly) for m in spec.mounts],
        labels=dict(spec.labels),
        annotations=dict(spec.annotations),
        log_path=spec.log_path,
        linux=pb.LinuxContainerConfig(security_context=pb.LinuxContainerSecurityContext(
            privileged=spec.privileged, namespace_options=_namespaces(host_network),
            run_as_user=pb.Int64Value(value=spec.user) if spec.user is not None else None,
            capabilities=pb.Capability(add_capabilities=list(spec.capabilities)) if spec.capabilities else None)),
    )
