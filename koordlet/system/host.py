"""The host as the koordlet sees it: where its file systems are and how its cgroups are laid out."""

from __future__ import annotations

import os

from apis.records import frozen
from koordlet.errors import ConfigError, UnsupportedError
from koordlet.system.cgroups import CgroupDriver, CgroupLayout, CgroupVersion, detect_layout
from koordlet.system.paths import HostPaths


@frozen
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

    @classmethod
    def detect_configured(
        cls,
        paths: HostPaths,
        *,
        version: CgroupVersion | None = None,
        driver: CgroupDriver | None = None,
        kube_path: str = "kubepods/",
    ) -> Host:
        """:meth:`detect` for a command that was given ``paths`` by its flags: a cgroup root
        that is missing or not a cgroup mount is a :class:`ConfigError` naming
        ``--cgroup-root-dir`` and the path (one line for the user, exit 2)."""
        root = paths.cgroup_root
        if not os.path.isdir(root):
            raise ConfigError(
                "no such directory (the host's cgroup mount, usually /sys/fs/cgroup)",
                source=CGROUP_ROOT_FLAG,
                field=root,
            )
        try:
            return cls.detect(paths, version=version, driver=driver, kube_path=kube_path)
        except UnsupportedError as err:
            if err.what != "cgroup":
                raise
            raise ConfigError(err.reason, source=CGROUP_ROOT_FLAG, field=root) from err


CGROUP_ROOT_FLAG = "--cgroup-root-dir"
"""The flag (and ``paths.cgroupRootDir``) that names the cgroup root."""
