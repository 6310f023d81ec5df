"""The host as the koordlet sees it: where its file systems are and how its cgroups are laid out."""

from __future__ import annotations

from dataclasses import dataclass

from koordlet.errors import ConfigError
from koordlet.system.cgroups import CgroupDriver, CgroupLayout, CgroupVersion, detect_layout
from koordlet.system.paths import HostPaths


@dataclass(frozen=True, slots=True)
class Host:
    """The one object passed to collectors as ``CollectorContext.host`` (and to the states
    informer and the executor): the injected host roots plus the detected cgroup layout.

    Immutable; built once at start-up by :meth:`detect`, or directly in tests (``FakeHost.host``).
    """

    paths: HostPaths
    """Roots of procfs, sysfs and the cgroup mount."""
    layout: CgroupLayout
    """Cgroup version, driver and naming; ``layout.paths`` is ``paths``."""

    def __post_init__(self) -> None:
        if self.layout.paths != self.paths:
            raise ConfigError("must be built on the same HostPaths as Host.paths", field="layout")

    @classmethod
    def detect(
        cls,
        paths: HostPaths,
        *,
        version: CgroupVersion | None = None,
        driver: CgroupDriver | None = None,
        kube_path: str = "kubepods/",
    ) -> Host:
        """Look at the host once: detect what is not given (see ``koordlet.system.cgroups``).

        ``kube_path`` mirrors Koordinator's ``--cgroup-kube-path``.
        """
        layout = detect_layout(paths, version=version, driver=driver, kube_path=kube_path)
        return cls(paths=paths, layout=layout)
