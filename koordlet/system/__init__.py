"""Synchronous host access: paths, procfs and cgroup parsers, the knob table, capability probing.

Nothing here imports asyncio, aiohttp or Kubernetes (import-linter enforces it). Every path comes
from an injected :class:`~koordlet.system.paths.HostPaths`.
"""
