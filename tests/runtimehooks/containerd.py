"""The runtime hook tests' containerd: :mod:`envtest.containerd` (also the real cluster's)."""

from envtest.containerd import BUSYBOX_IMAGE, PAUSE_IMAGE, Containerd, build_image_archive, why_not

__all__ = ["BUSYBOX_IMAGE", "PAUSE_IMAGE", "Containerd", "build_image_archive", "why_not"]
