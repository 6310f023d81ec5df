"""A pod's cgroup as the kubelet hands it to the runtime, as a folder below the cgroup roots.

The kubelet's cgroupfs driver passes a path (``/kubepods/besteffort/pod<uid>``); its systemd
driver passes a slice name (``kubepods-besteffort-pod<uid>.slice``), which systemd expands into
nested slices, one per dash-separated prefix (systemd.slice(5):
``kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid>.slice``).
"""

from __future__ import annotations

import posixpath

from apis.extension import KubeQOS
from koordlet.runtimehooks.errors import BadPodInput

REASON = "InvalidCgroupParent"
"""The Warning Event reason for a cgroup parent that is not a cgroup."""


def rel_dir(cgroup_parent: str) -> str:
    """The folder of ``cgroup_parent`` relative to each controller's root, without slashes at
    either end. Raises BadPodInput for an empty name or one that climbs out (``..``)."""
    text = cgroup_parent.strip()
    if not text or text == "/":
        raise BadPodInput(REASON, "cgroup_parent", "empty")
    if "/" not in text and text.endswith(".slice"):
        return _expand_slice(text)
    rel = posixpath.normpath("/" + text).lstrip("/")
    if ".." in text.split("/") or not rel:
        raise BadPodInput(REASON, "cgroup_parent", f"not a cgroup below the root: {text!r}")
    return rel


def _expand_slice(name: str) -> str:
    stem = name[: -len(".slice")]
    if stem in ("", "-"):
        return ""
    parts = stem.split("-")
    if any(not p for p in parts):
        raise BadPodInput(REASON, "cgroup_parent", f"not a systemd slice name: {name!r}")
    return "/".join("-".join(parts[: i + 1]) + ".slice" for i in range(len(parts)))


def kube_qos_of(cgroup_parent: str) -> KubeQOS:
    """The Kubernetes QoS class a pod's cgroup parent is under (upstream
    ``GetKubeQoSByCgroupParent``): BestEffort or Burstable by the QoS folder in its path, else
    Guaranteed (whose pods sit in the kubepods root)."""
    lowered = cgroup_parent.lower()
    if "besteffort" in lowered:
        return KubeQOS.BESTEFFORT
    if "burstable" in lowered:
        return KubeQOS.BURSTABLE
    return KubeQOS.GUARANTEED
