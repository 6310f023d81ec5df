"""Validate objects against the ``openAPIV3Schema`` of Koordinator's CRDs, without a jsonschema
dependency.

:func:`load_crds` reads the CustomResourceDefinitions of a directory (by default the CRDs we
install, ``packaging/kubernetes/crds``, which the installed package carries as ``apis/crds``);
:meth:`CRDSet.validate` picks the version of the object's ``apiVersion`` and ``kind`` and returns
every :class:`Violation` with its JSON path
(``spec.resourceUsedThresholdWithBE.cpuSuppressThresholdPercent``, ``spec.items[2].name``);
:meth:`CRDSet.validate_or_raise` raises one :class:`apis.slo.SchemaError` listing them all.

What is checked, as the API server does for structural schemas: ``type`` (object, array, string,
integer, number, boolean), ``properties``, ``required``, ``additionalProperties`` (a boolean or a
schema), ``items``, ``enum``, ``nullable``, ``format`` (date-time, int-or-string, int32, int64),
``x-kubernetes-int-or-string``, ``x-kubernetes-preserve-unknown-fields``, ``anyOf``/``oneOf``/
``allOf``/``not``, ``pattern``, ``minimum``/``maximum`` (and exclusive), ``minLength``/
``maxLength``, ``minItems``/``maxItems``, ``minProperties``/``maxProperties``. ``date-time`` is
kube-openapi's check (:func:`apis.timestamp.is_openapi_date_time`), looser than ``metav1.Time``.

Two choices to know: a ``null`` where the schema is not ``nullable`` counts as absent (the API
server prunes it), and a field the schema does not declare is an error by default (``strict``, as
``kubectl`` with server-side strict field validation reports it; the API server would otherwise
prune it silently). ``metadata`` is checked only for the types of ``name`` and ``namespace``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apis.records import frozen
from apis.slo import SchemaError, read_document
from apis.timestamp import is_openapi_date_time

DEFAULT_CRD_DIR = Path(__file__).resolve().parent / "crds"
"""The CRDs this repository installs: ``packaging/kubernetes/crds`` (``apis/crds`` links there in
the source tree; the wheel, and so the packages and the image, carry copies as package data)."""

_INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
_SIMPLE_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


@frozen
class Violation:
    """One violation: where (a JSON path, empty for the whole object) and what."""

    path: str
    """Dotted path with ``[i]`` for list items and ``["key"]`` for unusual map keys."""
    message: str
    """What is wrong, with the offending value."""

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


@frozen
class CRDVersion:
    """One version of one CRD."""

    group: str
    """``spec.group`` (``slo.koordinator.sh``)."""
    kind: str
    """``spec.names.kind`` (``NodeSLO``)."""
    version: str
    """The version name (``v1alpha1``)."""
    served: bool
    """Whether the API server serves this version."""
    storage: bool
    """Whether this is the version objects are stored in."""
    schema: Mapping[str, Any]
    """Its ``schema.openAPIV3Schema``."""
    source: str
    """The file it came from."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


class CRDSet:
    """The CRD versions of a directory, looked up by ``(apiVersion, kind)``."""

    def __init__(self, versions: Sequence[CRDVersion]) -> None:
        self._by_key = {(v.api_version, v.kind): v for v in versions}
        self._storage = {(v.group, v.kind): v for v in versions if v.storage}

    def __iter__(self) -> Iterator[CRDVersion]:
        return iter(self._by_key.values())

    def __len__(self) -> int:
        return len(self._by_key)

    def version_for(self, kind: str, api_version: str | None = None) -> CRDVersion:
        """The served version named by ``api_version`` (``group/version``); with only a group
        (or ``None`` and a kind unique across groups), the storage version. Raises
        :class:`SchemaError` when there is none."""
        if api_version and "/" in api_version:
            found = self._by_key.get((api_version, kind))
            if found is None:
                raise SchemaError(f"no CRD for kind {kind!r} in apiVersion {api_version!r}")
            if not found.served:
                raise SchemaError(f"{api_version} {kind} is not served")
            return found
        candidates = [
            v
            for (group, k), v in self._storage.items()
            if k == kind and api_version in (None, group)
        ]
        if len(candidates) != 1:
            raise SchemaError(f"no single CRD for kind {kind!r} (apiVersion {api_version!r})")
        return candidates[0]

    def validate(self, obj: object, *, strict: bool = True) -> list[Violation]:
        """Every violation of ``obj`` (a whole object with ``apiVersion`` and ``kind``) against
        its CRD version's schema; empty when it is valid."""
        if not isinstance(obj, Mapping):
            return [Violation("", f"must be an object, got {_short(obj)}")]
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        if not isinstance(api_version, str) or not isinstance(kind, str):
            return [Violation("", "apiVersion and kind must be strings")]
        try:
            version = self.version_for(kind, api_version)
        except SchemaError as err:
            return [Violation("apiVersion", str(err))]
        return validate_value(version.schema, obj, strict=strict, is_root=True)

    def validate_or_raise(self, obj: object, *, source: str = "", strict: bool = True) -> None:
        """:meth:`validate`, raising one :class:`SchemaError` that lists every violation."""
        errors = self.validate(obj, strict=strict)
        if len(errors) == 1:
            raise SchemaError(errors[0].message, source=source, field=errors[0].path)
        if errors:
            listed = "; ".join(str(e) for e in errors)
            raise SchemaError(f"{len(errors)} schema violations: {listed}", source=source)


def load_crds(directory: str | Path | None = None) -> CRDSet:
    """The CRDs (``*.yaml``, one CustomResourceDefinition a file) under ``directory`` (default
    :data:`DEFAULT_CRD_DIR`, read once and cached). Raises :class:`SchemaError` naming the file
    for one that is not a CRD."""
    return _load(str(Path(directory) if directory is not None else DEFAULT_CRD_DIR))


@functools.cache
def _load(directory: str) -> CRDSet:
    versions: list[CRDVersion] = []
    files = sorted(Path(directory).glob("*.yaml"))
    if not files:
        raise SchemaError("no CRD files (*.yaml)", source=directory)
    for path in files:
        doc = read_document(str(path))
        try:
            spec = doc["spec"]
            if doc["kind"] != "CustomResourceDefinition":
                raise SchemaError("not a CustomResourceDefinition", source=str(path))
            versions.extend(
                CRDVersion(
                    group=spec["group"],
                    kind=spec["names"]["kind"],
                    version=v["name"],
                    served=bool(v.get("served", False)),
                    storage=bool(v.get("storage", False)),
                    schema=v["schema"]["openAPIV3Schema"],
                    source=str(path),
                )
                for v in spec["versions"]
            )
        except (KeyError, TypeError) as err:
            raise SchemaError(f"not a CRD: missing {err}", source=str(path)) from err
    return CRDSet(versions)


def validate(obj: object, *, crds: CRDSet | None = None, strict: bool = True) -> list[Violation]:
    """:meth:`CRDSet.validate` with the repository's CRDs unless ``crds`` is given."""
    return (crds or load_crds()).validate(obj, strict=strict)


def validate_or_raise(
    obj: object, *, crds: CRDSet | None = None, source: str = "", strict: bool = True
) -> None:
    """:meth:`CRDSet.validate_or_raise` with the repository's CRDs unless ``crds`` is given."""
    (crds or load_crds()).validate_or_raise(obj, source=source, strict=strict)


# The schema walk -------------------------------------------------------------------------------
def validate_value(
    schema: Mapping[str, Any],
    value: object,
    *,
    path: str = "",
    strict: bool = True,
    is_root: bool = False,
) -> list[Violation]:
    """Every violation of ``value`` against one OpenAPI v3 (structural) schema."""
    errors: list[Violation] = []
    _Walker(strict, errors).check(schema, value, path, is_root)
    return errors


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _join(path: str, key: str) -> str:
    if not _SIMPLE_KEY.match(key):
        return f'{path}["{key}"]'
    return f"{path}.{key}" if path else key


def _type_of(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, list | tuple):
        return "array"
    return type(value).__name__


def _is_type(value: object, want: str) -> bool:
    got = _type_of(value)
    return got == want or (want == "number" and got == "integer")


@dataclass(slots=True)
class _Walker:
    strict: bool
    errors: list[Violation]

    def fail(self, path: str, message: str) -> None:
        self.errors.append(Violation(path, message))

    def check(self, schema: Mapping[str, Any], value: object, path: str, is_root: bool) -> None:
        if value is None:
            if not schema.get("nullable", False):
                self.fail(path, "must not be null")
            return
        if schema.get("x-kubernetes-int-or-string") or schema.get("format") == "int-or-string":
            if _type_of(value) not in ("integer", "string"):
                self.fail(path, f"must be an integer or a string, got {_short(value)}")
                return
        elif "type" in schema and not _is_type(value, schema["type"]):
            self.fail(path, f"must be of type {schema['type']}, got {_short(value)}")
            return
        if "enum" in schema and value not in schema["enum"]:
            allowed = ", ".join(repr(v) for v in schema["enum"])
            self.fail(path, f"must be one of {allowed}, got {_short(value)}")
        if isinstance(value, str):
            self.check_string(schema, value, path)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            self.check_number(schema, value, path)
        elif isinstance(value, list | tuple):
            self.check_array(schema, value, path)
        elif isinstance(value, Mapping):
            self.check_object(schema, value, path, is_root)
        self.check_combinators(schema, value, path)

    def check_string(self, schema: Mapping[str, Any], value: str, path: str) -> None:
        if "minLength" in schema and len(value) < schema["minLength"]:
            self.fail(path, f"must be at least {schema['minLength']} characters, got {value!r}")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            self.fail(path, f"must be at most {schema['maxLength']} characters")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            self.fail(path, f"must match {schema['pattern']}, got {_short(value)}")
        if schema.get("format") == "date-time" and not is_openapi_date_time(value):
            self.fail(path, f"must be an RFC 3339 date-time, got {_short(value)}")

    def check_number(self, schema: Mapping[str, Any], value: float, path: str) -> None:
        lo, hi = schema.get("minimum"), schema.get("maximum")
        if lo is not None and (value < lo or (schema.get("exclusiveMinimum") and value == lo)):
            op = ">" if schema.get("exclusiveMinimum") else ">="
            self.fail(path, f"must be {op} {lo}, got {value}")
        if hi is not None and (value > hi or (schema.get("exclusiveMaximum") and value == hi)):
            op = "<" if schema.get("exclusiveMaximum") else "<="
            self.fail(path, f"must be {op} {hi}, got {value}")
        bounds = _INT_RANGES.get(schema.get("format", ""))
        if bounds and isinstance(value, int) and not bounds[0] <= value <= bounds[1]:
            self.fail(path, f"must fit {schema['format']}, got {value}")

    def check_array(self, schema: Mapping[str, Any], value: Sequence[Any], path: str) -> None:
        if "minItems" in schema and len(value) < schema["minItems"]:
            self.fail(path, f"must have at least {schema['minItems']} items, got {len(value)}")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            self.fail(path, f"must have at most {schema['maxItems']} items, got {len(value)}")
        items = schema.get("items")
        if isinstance(items, Mapping):
            for i, item in enumerate(value):
                self.check(items, item, f"{path}[{i}]", False)

    def check_object(
        self, schema: Mapping[str, Any], value: Mapping[str, Any], path: str, is_root: bool
    ) -> None:
        present = {k for k, v in value.items() if v is not None}
        props: Mapping[str, Any] = schema.get("properties", {})
        nullable = {k for k, s in props.items() if s.get("nullable")}
        for key in schema.get("required", ()):
            if key not in present and not (key in nullable and key in value):
                self.fail(_join(path, key), "is required")
        n = len(present)
        if "minProperties" in schema and n < schema["minProperties"]:
            self.fail(path, f"must have at least {schema['minProperties']} properties")
        if "maxProperties" in schema and n > schema["maxProperties"]:
            self.fail(path, f"must have at most {schema['maxProperties']} properties")
        extra = schema.get("additionalProperties")
        preserve = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
        for key, item in value.items():
            where = _join(path, str(key))
            if is_root and key in ("apiVersion", "kind") and key not in props:
                continue
            if is_root and key == "metadata":
                self.check_metadata(item, where)
                continue
            if key in props:
                if item is not None or props[key].get("nullable"):
                    self.check(props[key], item, where, False)
            elif isinstance(extra, Mapping):
                if item is not None:
                    self.check(extra, item, where, False)
            elif extra is True or preserve:
                continue
            elif extra is False or (self.strict and (props or "type" in schema)):
                self.fail(where, "unknown field")

    def check_metadata(self, value: object, path: str) -> None:
        if not isinstance(value, Mapping):
            self.fail(path, f"must be an object, got {_short(value)}")
            return
        for key in ("name", "namespace", "generateName"):
            if key in value and not isinstance(value[key], str):
                self.fail(_join(path, key), f"must be a string, got {_short(value[key])}")

    def check_combinators(self, schema: Mapping[str, Any], value: object, path: str) -> None:
        for sub in schema.get("allOf", ()):
            self.check(sub, value, path, False)
        if "anyOf" in schema and not any(self.passes(s, value) for s in schema["anyOf"]):
            self.fail(path, f"must match at least one of anyOf, got {_short(value)}")
        if "oneOf" in schema:
            matches = sum(self.passes(s, value) for s in schema["oneOf"])
            if matches != 1:
                self.fail(path, f"must match exactly one of oneOf (matched {matches})")
        if "not" in schema and self.passes(schema["not"], value):
            self.fail(path, "must not match the 'not' schema")

    def passes(self, schema: Mapping[str, Any], value: object) -> bool:
        probe = _Walker(self.strict, [])
        probe.check(schema, value, "", False)
        return not probe.errors
