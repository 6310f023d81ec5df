"""Builders shared by the runtime hook tests: pods as the kubelet hands them to the runtime."""

from __future__ import annotations

import json
from collections.abc import Mapping

from apis.extension import ANNOTATION_EXTENDED_RESOURCE_SPEC, LABEL_POD_QOS
from apis.manager_keys import BATCH_CPU, BATCH_MEMORY

BE_LABELS = {LABEL_POD_QOS: "BE"}


def spec_annotation(containers: Mapping[str, Mapping[str, Mapping[str, str]]]) -> dict[str, str]:
    """The ``node.koordinator.sh/extended-resource-spec`` annotation koord-manager writes."""
    return {ANNOTATION_EXTENDED_RESOURCE_SPEC: json.dumps({"containers": containers})}


def batch(
    cpu_request: str, cpu_limit: str | None, mem_limit: str | None
) -> dict[str, dict[str, str]]:
    """One container's batch resources (requests and limits) as the webhook writes them."""
    limits = {}
    if cpu_limit is not None:
        limits[BATCH_CPU] = cpu_limit
    if mem_limit is not None:
        limits[BATCH_MEMORY] = mem_limit
    return {"requests": {BATCH_CPU: cpu_request, BATCH_MEMORY: mem_limit or "0"}, "limits": limits}
