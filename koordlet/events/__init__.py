"""Pressure events: wake subscribers at once when the kernel reports pressure, between ticks.

PSI triggers (``/proc/pressure/*`` and cgroup ``*.pressure`` files) and, on cgroup v1, memcg
usage thresholds (``cgroup.event_control`` with an eventfd) are armed through the synchronous host
layer and watched from the event loop without polling.
"""
