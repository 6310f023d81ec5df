"""What a workload source is.

A source answers, synchronously and from one batch of reads, which pods (and, for some sources,
host applications) exist now. The inventory runs sources in a worker thread and merges them.
Sources: the kubepods hierarchy walker (kubelet-free), the local NodeSLO file (host
applications), and later Kubernetes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from koordlet.statesinformer.model import HostAppInfo, PodInfo


class PodSource(Protocol):
    """Lists the pods on this node."""

    name: str

    def list_pods(self) -> Mapping[str, PodInfo]:
        """Pods by UID. Raise only on a real failure; a pod vanishing mid-walk is skipped."""
        ...


class HostAppSource(Protocol):
    """Lists the host applications declared for this node."""

    name: str

    def list_host_apps(self) -> tuple[HostAppInfo, ...]:
        """Declared host applications, each marked present or absent."""
        ...
