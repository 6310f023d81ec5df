"""YAML parsed without keeping PyYAML: a short-lived child Python does the parsing.

A process that imports PyYAML keeps it for good (its C scanner holds on to every class of the
package: dropping the modules from ``sys.modules`` gives nothing back), about 0.9 MiB resident,
and the daemons read their YAML files (a kubeconfig, the kubelet's config file) once, at start
(docs/benchmarks.md, issue 26). :func:`load_yaml` runs ``python -I -c`` with PyYAML's safe loader
and takes the document back as JSON. The child answers only documents whose every key is a
string and every value JSON's (what a kubeconfig or a kubelet config is); for anything else, or
when no child can run (a frozen interpreter, a failed spawn, a timeout), the text is parsed in
this process, with the same result and the same errors.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from typing import Any

logger = logging.getLogger(__name__)

CHILD_TIMEOUT = 30.0
"""Seconds the child may take before the text is parsed here instead."""

_CHILD = """\\
import json, sys
import yaml
def plain(v):
    if isinstance(v, dict):
        return all(isinstance(k, str) and plain(x) for k, x in v.items())
    if isinstance(v, list):
        return all(plain(x) for x in v)
    return v is None or isinstance(v, (str, int, float, bool))
try:
    doc = yaml.safe_load(sys.stdin.buffer.read().decode("utf-8"))
except yaml.YAMLError as err:
    json.dump({"error": str(err)}, sys.stdout)
else:
    if not plain(doc):
        sys.exit(3)
    json.dump({"doc": doc}, sys.stdout)
"""


class YamlError(ValueError):
    """The text is not YAML; the message is PyYAML's."""


def load_yaml(text: str) -> Any:
    """PyYAML's ``safe_load`` of ``text``, in a child when one answers. Raises
    :class:`YamlError` with PyYAML's message."""
    answer = _in_child(text)
    if answer is not None:
        if "error" in answer:
            raise YamlError(answer["error"])
        return answer["doc"]
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise YamlError(str(err)) from err


def _in_child(text: str) -> dict[str, Any] | None:
    """``{"doc": ...}`` or ``{"error": "..."}`` from a child Python; None when none answered."""
    if getattr(sys, "frozen", False) or not sys.executable:
        return None
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-c", _CHILD],
            input=text.encode("utf-8"),
            capture_output=True,
            timeout=CHILD_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as err:
        logger.debug("no child to parse YAML (%s); parsed here", err)
        return None
    if done.returncode == 0:
        try:
            answer = json.loads(done.stdout)
        except ValueError:
            answer = None
        if isinstance(answer, dict) and ("doc" in answer or "error" in answer):
            return answer
    logger.debug(
        "the YAML child exited %d (%s); parsed here",
        done.returncode,
        done.stderr.decode("utf-8", "replace").strip()[-200:],
    )
    return None
