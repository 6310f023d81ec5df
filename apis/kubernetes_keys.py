"""Names Kubernetes itself defines that our components use: core resource names, well-known
labels, the service-account mount (``k8s.io/api/core/v1``, ``well_known_labels.go``)."""

from __future__ import annotations

RESOURCE_CPU = "cpu"
"""``corev1.ResourceCPU``: cores (quantities), milli-cores once read."""
RESOURCE_MEMORY = "memory"
"""``corev1.ResourceMemory``: bytes."""
RESOURCE_PODS = "pods"
"""``corev1.ResourcePods``: a count."""
LABEL_HOSTNAME = "kubernetes.io/hostname"
"""``corev1.LabelHostname``: the node's hostname label."""
SERVICE_ACCOUNT_TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount/token"
"""Where the kubelet mounts a pod's service-account token (``rest.InClusterConfig``)."""
