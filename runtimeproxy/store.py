"""What the proxy remembers between calls: a StartContainer, UpdateContainerResources or
StopContainer carries only an ID, so the pod and container a CreateContainer or RunPodSandbox
described are kept by ID (upstream ``pkg/runtimeproxy/store``). At start the store is filled
from the runtime's own lists (upstream ``failOver``), without the cgroup parents and resources
the lists do not carry.

Each request is kept serialized and parsed again when a later call needs it (a few µs): a parsed
message holds about 3.5 KiB, its bytes a few hundred, and the proxy keeps one for every
container of its node (issue 26: the proxy at most 30 MiB at 200 pods).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from apis.cri.v1 import api_pb2 as cri
from apis.runtime.v1alpha1 import api_pb2 as hookapi

logger = logging.getLogger(__name__)


@dataclass
class Store:
    """Pods by sandbox ID, containers by container ID."""

    pods: dict[str, bytes] = field(default_factory=dict)
    """The hook request each pod sandbox was run with (serialized)."""
    containers: dict[str, tuple[str, bytes]] = field(default_factory=dict)
    """Sandbox ID and the hook request (serialized) of each container."""

    def add_pod(self, sandbox_id: str, req: hookapi.PodSandboxHookRequest) -> None:
        self.pods[sandbox_id] = req.SerializeToString()

    def pod(self, sandbox_id: str) -> hookapi.PodSandboxHookRequest | None:
        data = self.pods.get(sandbox_id)
        return None if data is None else hookapi.PodSandboxHookRequest.FromString(data)

    def remove_pod(self, sandbox_id: str) -> None:
        """Forget the pod and its containers."""
        self.pods.pop(sandbox_id, None)
        for cid in [c for c, (s, _) in self.containers.items() if s == sandbox_id]:
            del self.containers[cid]

    def add_container(
        self, container_id: str, sandbox_id: str, req: hookapi.ContainerResourceHookRequest
    ) -> None:
        req.container_mata.id = container_id
        self.containers[container_id] = (sandbox_id, req.SerializeToString())

    def update_container(
        self, container_id: str, req: hookapi.ContainerResourceHookRequest
    ) -> None:
        """Replace what is kept of a known container (its resources changed)."""
        entry = self.containers.get(container_id)
        if entry is not None:
            self.containers[container_id] = (entry[0], req.SerializeToString())

    def container(self, container_id: str) -> hookapi.ContainerResourceHookRequest | None:
        entry = self.containers.get(container_id)
        return None if entry is None else hookapi.ContainerResourceHookRequest.FromString(entry[1])

    def recover(
        self, pods: cri.ListPodSandboxResponse, containers: cri.ListContainersResponse
    ) -> None:
        """Fill the store from the runtime's lists."""
        recovered: dict[str, hookapi.PodSandboxHookRequest] = {}
        for pod in pods.items:
            if pod.id in self.pods:
                continue
            meta = pod.metadata
            recovered[pod.id] = hookapi.PodSandboxHookRequest(
                pod_meta=hookapi.PodSandboxMetadata(
                    name=meta.name, uid=meta.uid, namespace=meta.namespace, attempt=meta.attempt
                ),
                runtime_handler=pod.runtime_handler,
                labels=dict(pod.labels),
                annotations=dict(pod.annotations),
            )
            self.pods[pod.id] = recovered[pod.id].SerializeToString()
        for c in containers.containers:
            pod_req = recovered.get(c.pod_sandbox_id) or self.pod(c.pod_sandbox_id)
            if pod_req is None or c.id in self.containers:
                continue
            req = hookapi.ContainerResourceHookRequest(
                pod_meta=pod_req.pod_meta,
                container_mata=hookapi.ContainerMetadata(
                    name=c.metadata.name, attempt=c.metadata.attempt, id=c.id
                ),
                container_annotations=dict(c.annotations),
                pod_annotations=dict(pod_req.annotations),
                pod_labels=dict(pod_req.labels),
            )
            self.containers[c.id] = (c.pod_sandbox_id, req.SerializeToString())
        logger.info(
            "recovered %d pods and %d containers from the runtime",
            len(self.pods),
            len(self.containers),
        )
