"""An HTTP-level fake Kubernetes API server that the real client layer (kubeclient) talks to.

See :mod:`tests.kubefake.server` for what it is faithful on and its fault injection, and
:mod:`tests.kubefake.fixtures` for the pytest fixtures (``pytest_plugins``).
"""

from tests.kubefake.server import FakeApiServer, Fault, Kind, RecordedRequest

__all__ = ["FakeApiServer", "Fault", "Kind", "RecordedRequest"]
