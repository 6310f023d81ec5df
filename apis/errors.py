"""The one field-error base: every validator's error says where (source), which field, and what.

::

    FieldError                       source, field path, message; str() "source: field: message"
    ├── apis.slo.SchemaError         (also a ValueError) NodeSLO, ConfigMap, NodeMetric, CRD checks
    ├── apis.timestamp.TimestampError   (also a ValueError) text that is no metav1.Time/MicroTime
    ├── koordlet.errors.ConfigError  bad flags, config file or NodeSLO file
    ├── manager.errors.InputError    (also a ValueError) a Node, NodeMetric or pod that does not fit
    ├── manager.webhook.profiles.ProfileError   (also a ValueError) a ClusterColocationProfile
    ├── scheduler_plugins.errors.InputError   a snapshot, pod or plugin args document
    ├── descheduler.errors.ConfigError, InputError   its configuration, a cluster object
    └── kubeclient.errors.ConfigError   no usable kubeconfig (source: the file or the flag)

Each package keeps its own exception tree (its errors subclass their package's base too), so a
caller can catch "any error of the manager" or "any bad field, whichever package found it".
The base is not a ``ValueError`` on purpose: a package's error that was not one must not start
being caught by an ``except ValueError`` written for something else.

The notation parsers (:mod:`apis.quantity`, :mod:`apis.cpulist`, :mod:`apis.duration`,
:mod:`apis.gobool`) raise a plain ``ValueError`` naming the bad text; the validator that knows the
field wraps it in its :class:`FieldError` (``raise InputError(...) from err``). The timestamp
parsers take the source and field from their caller and raise a ``TimestampError`` naming them;
a caller with an error type of its own translates it the same way.
"""

from __future__ import annotations


class FieldError(Exception):
    """A document value that does not fit its schema.

    ``source`` names the document (a file, ``node n1``, a flag); ``field`` is the dotted path
    inside it (``status.nodeMetric.nodeUsage.resources.cpu``, ``spec.items[2].name``); either may
    be empty. ``str()`` joins the non-empty parts: ``source: field: message``.
    """

    def __init__(self, message: str, *, source: str = "", field: str = "") -> None:
        self.message = message
        """What is wrong, with the offending value."""
        self.source = source
        """The document: a file path, an object (``nodemetric n1``), a flag; may be empty."""
        self.field = field
        """The field path inside the document; empty for the document as a whole."""
        super().__init__(": ".join(p for p in (source, field, message) if p))
