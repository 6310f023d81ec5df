"""The one exception tree of the Kubernetes client layer.

::

    KubeError
    ├── ConfigError                 no usable kubeconfig or in-cluster service account
    │                               (also an apis.errors.FieldError: source, field, message)
    └── ApiError                    the API server answered with a failure (status, reason, body)
        ├── NotFound                404: the object (or its namespace) does not exist
        ├── Conflict                409: a stale resourceVersion on update, or already exists
        ├── Gone                    410: the resourceVersion is too old to watch from; relist
        ├── TooManyRequests         429: throttled (``retry_after`` seconds from Retry-After)
        └── Transient               5xx, a dropped connection or a timeout: retry with backoff

Everything the layer raises is one of these; the transport's own exceptions (``OSError``,
``TimeoutError``, :class:`~kubeclient.transport.TransportError`) are translated at the boundary
(``raise ... from err``) so callers never import them.
"""

from __future__ import annotations

from typing import Any

from apis.errors import FieldError


class KubeError(Exception):
    """Base of every error of the Kubernetes client layer."""


class ConfigError(KubeError, FieldError):
    """Neither a kubeconfig file nor an in-cluster service account could be loaded: ``source``
    names the kubeconfig (``kubeconfig /path``) or the flag (``--kubeconfig``), ``message`` the
    loader's reason."""


class ApiError(KubeError):
    """The API server refused a request."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        reason: str = "",
        body: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.status = status
        """HTTP status (0 when no answer came: connection refused, dropped, timed out)."""
        self.message = message
        self.reason = reason
        """The ``Status`` object's ``reason`` (``Conflict``, ``Expired``, ``NotFound``...)."""
        self.body = body or {}
        self.retry_after = retry_after
        """Seconds the server asked us to wait (``Retry-After``), when it said."""
        super().__init__(f"{status} {reason}: {message}".strip())


class NotFound(ApiError):
    """404."""


class Conflict(ApiError):
    """409: the object changed since it was read (or already exists on create)."""


class Gone(ApiError):
    """410: the requested resourceVersion is no longer in the server's watch window."""


class TooManyRequests(ApiError):
    """429: throttled by priority and fairness or by a disruption budget (evictions)."""


class Transient(ApiError):
    """A 5xx answer, a dropped connection or a timeout: worth retrying after a backoff."""


_BY_STATUS: dict[int, type[ApiError]] = {
    404: NotFound,
    409: Conflict,
    410: Gone,
    429: TooManyRequests,
}


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date: rare from the API server; callers fall back to backoff
    return max(seconds, 0.0)


def error_for(
    status: int, body: dict[str, Any] | None, retry_after_header: str | None = None
) -> ApiError:
    """The :class:`ApiError` subclass for an HTTP status and a ``Status`` body."""
    body = body or {}
    message = str(body.get("message", "")) or f"HTTP {status}"
    reason = str(body.get("reason", ""))
    retry_after = _retry_after(retry_after_header)
    if retry_after is None:
        details = body.get("details")
        if isinstance(details, dict) and isinstance(details.get("retryAfterSeconds"), int | float):
            retry_after = float(details["retryAfterSeconds"])
    cls = _BY_STATUS.get(status)
    if cls is None:
        cls = Transient if status >= 500 or status == 0 else ApiError
    return cls(status, message, reason=reason, body=body, retry_after=retry_after)
