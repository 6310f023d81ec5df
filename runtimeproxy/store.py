"""What the proxy remembers between calls: a StartContainer, UpdateContainerResources or
StopContainer carries only an ID, so the pod and container a CreateContainer or RunPodSandbox
described are kept by ID (upstream ``pkg/runtimeproxy/store``). At start the store is filled
from the runtime's own lists (upstream ``failOver``), without the cgroup parents and resources
the lists do not carry.
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

    pods: dict[str, hookapi.PodSandboxHookRequest] = field(default_factory=dict)
    """The hook request each pod sandbox was run with."""
    containers: dict[str, tuple[str, hookapi.ContainerResourceHookRequest]] = field(
        default_factory=dict
    )
    """Sandbox ID and the hook request of each container."""

    def add_pod(self, sandbox_id: str, req: hookapi.PodSandboxHookRequest) -> None:
        self.pods[sandbox_id] = req

    def remove_pod(self, sandbox_id: str) -> None:
        """Forget the pod and its containers."""
        self.pods.pop(sandbox_id, None)
        for cid in [c for c, (s, _) in self.containers.items() if s == sandbox_id]:
            del self.containers[cid]

    def add_container(
        self, container_id: str, sandbox_id: str, req: hookapi.ContainerResourceHookRequest
    ) -> None:
        req.container_mata.id = container_id
        self.containers[container_id] = (sandbox_id, req)

    def container(self, container_id: str) -> hookapi.ContainerResourceHookRequest | None:
        entry = self.containers.get(container_id)
        return None if entry is None else entry[1]

    def recover(
        self, pods: cri.ListPodSandboxResponse, containers: cri.ListContainersResponse
    ) -> None:
        """Fill the store from the runtime's lists."""
        for pod in pods.items:
            meta = pod.metadata
            self.pods.setdefault(
                pod.id,
                hookapi.PodSandboxHookRequest(
                    pod_meta=hookapi.PodSandboxMetadata(
                        name=meta.name, uid=meta.uid, namespace=meta.namespace, attempt=meta.attempt
                    ),
                    runtime_handler=pod.runtime_handler,
                    labels=dict(pod.labels),
                    annotations=dict(pod.annotations),
                ),
            )
        for c in containers.containers:
            pod_req = self.pods.get(c.pod_sandbox_id)
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
            self.containers[c.id] = (c.pod_sandbox_id, req)
        logger.info(
            "recovered %d pods and %d containers from the runtime",
            len(self.pods),
            len(self.containers),
        )
