"""Coscheduling: a gang's pods are scheduled all together or not at all.

Koordinator's semantics (``pkg/scheduler/plugins/coscheduling``), re-implemented for a pod-level
pre-filter over the snapshot:

- **The gang.** A PodGroup named by the pod's label ``pod-group.scheduling.sigs.k8s.io`` (in the
  pod's namespace; ``spec.minMember``, ``spec.scheduleTimeoutSeconds``), or the annotations
  ``gang.scheduling.koordinator.sh/name``, ``min-available``, ``waiting-time`` (a Go duration)
  and ``mode`` (``Strict``, the default, or ``NonStrict``). A label naming a PodGroup that does
  not exist: ``can't find gang, gangName: ns/name, podName: ns/pod``.
- **Enough children.** The gang's pods in the snapshot (bound and pending, the incoming pod
  included) must number at least minMember: ``gang child pod not collect enough, gangName:
  ns/name, podName: ns/pod``. Once minMember pods are bound the gang is satisfied and later
  members pass.
- **Timeout.** A pod annotated ``gang.scheduling.koordinator.sh/timeout: "true"``, or (Strict)
  a gang still short of minMember bound pods ``waiting-time`` (default 600 s) after its oldest
  member was created: ``gang has timeout, gangName: ..., podName: ...``.

The Permit stage that holds bound members until the whole gang is assumed belongs to the
standalone scheduler loop, which this package does not have yet.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from apis.duration import parse_duration
from apis.records import frozen
from apis.scheduling_keys import (
    ANNOTATION_GANG_MIN,
    ANNOTATION_GANG_MODE,
    ANNOTATION_GANG_NAME,
    ANNOTATION_GANG_TIMEOUT,
    ANNOTATION_GANG_WAIT,
    LABEL_POD_GROUP,
)
from scheduler_plugins.args import ArgsReader
from scheduler_plugins.framework import Cycle, Plugin
from scheduler_plugins.objectfields import optional_time
from scheduler_plugins.snapshot import PodInfo

NAME = "Coscheduling"
DEFAULT_WAIT_S = 600.0


@frozen
class Gang:
    """A gang as one pod sees it."""

    key: str
    """``namespace/name``."""
    min_member: int
    wait_s: float
    strict: bool


def gang_of(pod: PodInfo, cycle: Cycle, default_wait: float) -> Gang | str | None:
    """The pod's gang, a reason (unknown PodGroup), or ``None`` (not in a gang)."""
    group = pod.labels.get(LABEL_POD_GROUP)
    if group:
        key = f"{pod.namespace}/{group}"
        pg = cycle.snapshot.pod_groups.get(key)
        if pg is None:
            return f"can't find gang, gangName: {key}, podName: {pod.key}"
        spec = pg.get("spec") or {}
        timeout = spec.get("scheduleTimeoutSeconds")
        return Gang(
            key,
            int(spec.get("minMember") or 0),
            float(timeout) if isinstance(timeout, int | float) else default_wait,
            True,
        )
    name = pod.annotations.get(ANNOTATION_GANG_NAME)
    if not name:
        return None
    try:
        minimum = int(pod.annotations.get(ANNOTATION_GANG_MIN) or 0)
    except ValueError:
        minimum = 0
    try:
        wait = parse_duration(pod.annotations.get(ANNOTATION_GANG_WAIT) or "0") or default_wait
    except ValueError:
        wait = default_wait
    strict = pod.annotations.get(ANNOTATION_GANG_MODE, "Strict") != "NonStrict"
    return Gang(f"{pod.namespace}/{name}", minimum, wait, strict)


def _member_of(pod: PodInfo, key: str) -> bool:
    ns, _, name = key.partition("/")
    if pod.namespace != ns:
        return False
    return (
        pod.labels.get(LABEL_POD_GROUP) == name or pod.annotations.get(ANNOTATION_GANG_NAME) == name
    )


class Coscheduling(Plugin):
    """See the module docstring."""

    name = NAME

    def __init__(self, default_wait_s: float = DEFAULT_WAIT_S) -> None:
        self.default_wait_s = default_wait_s

    def pre_filter(self, cycle: Cycle, pod: PodInfo) -> str | None:
        gang = gang_of(pod, cycle, self.default_wait_s)
        if gang is None:
            return None
        if isinstance(gang, str):
            return gang
        members = [p for p in cycle.snapshot.all_pods() if _member_of(p, gang.key)]
        if all(p.uid != pod.uid for p in members):
            members.append(pod)
        bound = sum(1 for p in members if p.node_name)
        if bound >= gang.min_member:
            return None  # the gang was satisfied once: later members pass
        if pod.annotations.get(ANNOTATION_GANG_TIMEOUT) == "true":
            return f"gang has timeout, gangName: {gang.key}, podName: {pod.key}"
        if len(members) < gang.min_member:
            return f"gang child pod not collect enough, gangName: {gang.key}, podName: {pod.key}"
        if gang.strict:
            created = [
                t
                for p in members
                if (
                    t := optional_time(
                        (p.raw.get("metadata") or {}).get("creationTimestamp"), p.key, ""
                    )
                )
                is not None
            ]
            if created and cycle.now - min(created) > gang.wait_s:
                return f"gang has timeout, gangName: {gang.key}, podName: {pod.key}"
        return None


def build(args: Mapping[str, Any] | None, source: str) -> Coscheduling:
    """Factory for the plugin table: ``CoschedulingArgs.defaultTimeout`` (Go duration)."""
    r = ArgsReader(args, source, NAME)
    return Coscheduling(r.duration("defaultTimeout", DEFAULT_WAIT_S))
