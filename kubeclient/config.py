"""Where the API server is and how to authenticate: a kubeconfig file or the in-cluster account.

``--kubeconfig`` (Koordinator's flag, also ``$KUBECONFIG``) wins; without it the pod's service
account (``/var/run/secrets/kubernetes.io/serviceaccount`` and ``KUBERNETES_SERVICE_HOST``) is
used. Both failing is a :class:`~kubeclient.errors.ConfigError` naming both causes.
"""

from __future__ import annotations

import logging
import os

from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config

from kubeclient.errors import ConfigError

logger = logging.getLogger(__name__)


async def load_configuration(kubeconfig: str | None = None) -> k8s_client.Configuration:
    """A kubernetes-asyncio ``Configuration`` for ``kubeconfig`` (a path; None or empty: the
    ``KUBECONFIG`` variable, else in-cluster). Raises :class:`ConfigError`."""
    path = kubeconfig or os.environ.get("KUBECONFIG", "")
    cfg = k8s_client.Configuration()
    if path:
        try:
            await k8s_config.load_kube_config(
                config_file=path, client_configuration=cfg, persist_config=False
            )
        except Exception as err:  # the loader raises ConfigException, OSError, YAML errors
            raise ConfigError(str(err), source=f"kubeconfig {path}") from err
        logger.info("Kubernetes API at %s (kubeconfig %s)", cfg.host, path)
        return cfg
    try:
        k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    except Exception as err:  # ConfigException when not in a pod
        raise ConfigError(f"not given, and not in a cluster: {err}", source="--kubeconfig") from err
    logger.info("Kubernetes API at %s (in-cluster service account)", cfg.host)
    return cfg
