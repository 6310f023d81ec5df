"""koord-runtime-proxy: a CRI proxy between the kubelet and the container runtime that asks the
koordlet's runtime hooks for adjustments before the runtime creates pods and containers
(docs/runtimehooks.md). Independent of the koordlet: it shares only ``apis`` with it.
"""

__version__ = "0.1.0"
