"""The koordlet's configuration: Koordinator's flags, an optional YAML file, frozen dataclasses.

Precedence: built-in defaults < the YAML file named by ``--config`` < flags. Feature gates merge
gate by gate across the three. Flags keep Koordinator's koordlet names where it has one
(``--addr``, ``--cgroup-root-dir``, ``--collect-res-used-interval-seconds``, ``--feature-gates``,
...), accept Go's single-dash spelling (``-addr=:9316``) and take durations as Go writes them
(``500ms``, ``1m30s``) or as plain seconds. The YAML file nests the same settings under
``paths``, ``cgroup``, ``collect``, ``server``, ``qos`` and ``audit`` (see
docs/configuration.md); an unknown key is an error, never ignored. Every error is a
:class:`~koordlet.errors.ConfigError` naming the flag or the file and the field.

:data:`SETTINGS` is the one table of settings: the parser, ``--help``, the YAML schema and
:func:`config_as_dict` (``/debug/config``) are all derived from it.

The package's modules, each importing only those above it:

- ``model``: the frozen dataclasses, :class:`KoordletConfig` and one per section;
- ``convert``: the value converters (YAML scalar or flag string in, checked value out);
- ``settings``: :data:`SETTINGS` and the command-line parser derived from it;
- ``loading``: :func:`load_config`, :func:`config_as_dict`, :func:`load_node_slo`.

Import from ``koordlet.config``; the names below are its public surface.
"""

from koordlet.config.convert import duration_seconds
from koordlet.config.loading import config_as_dict, load_config, load_node_slo
from koordlet.config.model import (
    DEFAULT_NODESLO_FILE,
    CgroupConfig,
    CgroupDriverSetting,
    CgroupVersionSetting,
    CollectConfig,
    KoordletConfig,
    KubeConfig,
    QoSConfig,
    RuntimeHooksConfig,
    ServerConfig,
)
from koordlet.config.settings import SETTINGS, VERSION_TEXT

__all__ = [
    "DEFAULT_NODESLO_FILE",
    "SETTINGS",
    "VERSION_TEXT",
    "CgroupConfig",
    "CgroupDriverSetting",
    "CgroupVersionSetting",
    "CollectConfig",
    "KoordletConfig",
    "KubeConfig",
    "QoSConfig",
    "RuntimeHooksConfig",
    "ServerConfig",
    "config_as_dict",
    "duration_seconds",
    "load_config",
    "load_node_slo",
]
