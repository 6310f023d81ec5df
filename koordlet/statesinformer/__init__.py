"""The workload inventory: pods, containers and host applications on this node, from pluggable
sources (the kubepods hierarchy, a local NodeSLO file, later Kubernetes)."""
