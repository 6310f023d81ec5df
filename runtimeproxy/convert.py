"""CRI requests to Koordinator's hook requests and back (upstream
``pkg/runtimeproxy/resexecutor/cri``).

The hook server answers with the whole new value of what it may change; a field its answer
specifies (non-zero, non-empty) replaces the request's, annotations and labels are merged (the
answer's win), and everything else of the CRI request, the fields this proxy does not define
included, goes to the runtime as it came.
"""

from __future__ import annotations

from apis.cri.v1 import api_pb2 as cri
from apis.runtime.v1alpha1 import api_pb2 as hookapi


def hook_resources(res: cri.LinuxContainerResources) -> hookapi.LinuxContainerResources:
    """CRI resources as the hook API carries them (the same fields and numbers)."""
    return hookapi.LinuxContainerResources.FromString(res.SerializeToString())


def merge_resources(dst: cri.LinuxContainerResources, src: hookapi.LinuxContainerResources) -> None:
    """Apply the fields ``src`` specifies over ``dst`` (quota: any non-zero value, -1 is
    unlimited)."""
    if src.cpu_period > 0:
        dst.cpu_period = src.cpu_period
    if src.cpu_quota != 0:
        dst.cpu_quota = src.cpu_quota
    if src.cpu_shares > 0:
        dst.cpu_shares = src.cpu_shares
    if src.memory_limit_in_bytes > 0:
        dst.memory_limit_in_bytes = src.memory_limit_in_bytes
    if src.oom_score_adj != 0 and -1000 <= src.oom_score_adj <= 1000:
        dst.oom_score_adj = src.oom_score_adj
    if src.cpuset_cpus:
        dst.cpuset_cpus = src.cpuset_cpus
    if src.cpuset_mems:
        dst.cpuset_mems = src.cpuset_mems
    for key, value in src.unified.items():
        dst.unified[key] = value
    if src.memory_swap_limit_in_bytes > 0:
        dst.memory_swap_limit_in_bytes = src.memory_swap_limit_in_bytes


def pod_hook_request(req: cri.RunPodSandboxRequest) -> hookapi.PodSandboxHookRequest:
    """The ``PodSandboxHookRequest`` of a RunPodSandbox."""
    cfg = req.config
    meta = cfg.metadata
    out = hookapi.PodSandboxHookRequest(
        pod_meta=hookapi.PodSandboxMetadata(
            name=meta.name, uid=meta.uid, namespace=meta.namespace, attempt=meta.attempt
        ),
        runtime_handler=req.runtime_handler,
        labels=dict(cfg.labels),
        annotations=dict(cfg.annotations),
        cgroup_parent=cfg.linux.cgroup_parent,
    )
    if cfg.linux.HasField("overhead"):
        out.overhead.CopyFrom(hook_resources(cfg.linux.overhead))
    if cfg.linux.HasField("resources"):
        out.resources.CopyFrom(hook_resources(cfg.linux.resources))
    return out


def apply_pod_response(req: cri.RunPodSandboxRequest, resp: hookapi.PodSandboxHookResponse) -> None:
    """Merge the hook server's labels, annotations and cgroup parent into the request (upstream
    ``PodResourceExecutor.UpdateRequest``)."""
    cfg = req.config
    for key, value in resp.labels.items():
        cfg.labels[key] = value
    for key, value in resp.annotations.items():
        cfg.annotations[key] = value
    if resp.cgroup_parent:
        cfg.linux.cgroup_parent = resp.cgroup_parent


def container_hook_request(req: cri.CreateContainerRequest) -> hookapi.ContainerResourceHookRequest:
    """The ``ContainerResourceHookRequest`` of a CreateContainer (the sandbox config rides
    along in the CRI request)."""
    sandbox = req.sandbox_config
    meta = sandbox.metadata
    out = hookapi.ContainerResourceHookRequest(
        pod_meta=hookapi.PodSandboxMetadata(
            name=meta.name, uid=meta.uid, namespace=meta.namespace, attempt=meta.attempt
        ),
        container_mata=hookapi.ContainerMetadata(
            name=req.config.metadata.name, attempt=req.config.metadata.attempt
        ),
        container_annotations=dict(req.config.annotations),
        pod_annotations=dict(sandbox.annotations),
        pod_labels=dict(sandbox.labels),
        pod_cgroup_parent=sandbox.linux.cgroup_parent,
    )
    out.container_resources.CopyFrom(hook_resources(req.config.linux.resources))
    if sandbox.linux.HasField("resources"):
        out.pod_resources.CopyFrom(hook_resources(sandbox.linux.resources))
    return out


def apply_container_response(
    config: cri.ContainerConfig, resp: hookapi.ContainerResourceHookResponse
) -> None:
    """Merge the hook server's container annotations and resources into a container config."""
    for key, value in resp.container_annotations.items():
        config.annotations[key] = value
    if resp.HasField("container_resources"):
        merge_resources(config.linux.resources, resp.container_resources)
