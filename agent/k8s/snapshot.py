"""Read Kubernetes objects from a ``kubectl get ... -o json|yaml`` dump.

Accepted shapes: a ``List`` (``{"kind": "List", "items": [...]}``, also ``NodeList`` and
friends), a single object, a JSON array of objects, or a multi-document YAML stream of
any of those. Objects of kinds other than Node, Service, EndpointSlice and Pod are
ignored (counted in :attr:`Snapshot.ignored`), never fatal.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agent.errors import InputError

#: kinds the product reads; every other kind in a dump is ignored
KINDS = ("Node", "Service", "EndpointSlice", "Pod")


@dataclass
class Snapshot:
    """Raw Kubernetes objects by kind, in their API JSON shape (plain dicts).

    Attributes:
        nodes, services, endpointslices, pods: objects in file order.
        ignored: count of objects of other kinds that were skipped.
        source: the file they came from (for error messages).
    """

    nodes: list[dict[str, Any]] = field(default_factory=list)
    services: list[dict[str, Any]] = field(default_factory=list)
    endpointslices: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    ignored: int = 0
    source: str = "<memory>"

    def add(self, obj: dict[str, Any]) -> None:
        """Append one object to its kind's list (or count it as ignored)."""
        kind = obj.get("kind")
        target = {
            "Node": self.nodes,
            "Service": self.services,
            "EndpointSlice": self.endpointslices,
            "Pod": self.pods,
        }.get(kind if isinstance(kind, str) else "")
        if target is None:
            self.ignored += 1
        else:
            target.append(obj)


def object_name(obj: dict[str, Any]) -> str:
    """Return ``"Kind namespace/name"`` (or ``"Kind name"``) for error messages."""
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    name = meta.get("name") if isinstance(meta, dict) else None
    ns = meta.get("namespace") if isinstance(meta, dict) else None
    kind = obj.get("kind", "object")
    if ns:
        return f"{kind} {ns}/{name}"
    return f"{kind} {name}"


def _items(doc: Any, where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield (location, object) from a parsed document; raise InputError on bad shapes."""
    if doc is None:
        return
    if isinstance(doc, list):
        for i, item in enumerate(doc):
            yield from _items(item, f"{where} item {i}")
        return
    if not isinstance(doc, dict):
        raise InputError(f"expected an object or a list, got {type(doc).__name__}", obj=where)
    kind = doc.get("kind")
    if isinstance(kind, str) and kind.endswith("List") and "items" in doc:
        items = doc["items"]
        if items is None:
            return
        if not isinstance(items, list):
            raise InputError("must be a list", obj=where, field="items")
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise InputError("must be an object", obj=where, field=f"items[{i}]")
            # kubectl drops kind/apiVersion inside typed lists (NodeList) only in some versions
            if "kind" not in item and kind != "List":
                item = {**item, "kind": kind[: -len("List")]}
            yield f"{where} items[{i}]", item
        return
    yield where, doc


def _check(obj: dict[str, Any], where: str) -> None:
    kind = obj.get("kind")
    if not isinstance(kind, str) or not kind:
        raise InputError("missing or not a string", obj=where, field="kind")
    if kind not in KINDS:
        return
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise InputError("missing or not an object", obj=f"{kind} ({where})", field="metadata")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise InputError("missing or not a string", obj=f"{kind} ({where})", field="metadata.name")
    if kind != "Node" and not isinstance(meta.get("namespace", "default"), str):
        raise InputError("not a string", obj=object_name(obj), field="metadata.namespace")


class _NoAliasLoader(yaml.SafeLoader):  # type: ignore[misc]
    """SafeLoader that refuses YAML aliases (``*name``).

    kubectl never writes them, and nested aliases let a 20-line file stand for 10^9
    values ("billion laughs"): cheap to load as shared references, but the metadata cache
    serialises objects to share them, which would then take minutes and gigabytes.
    """

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, "YAML aliases (*name) are not accepted in a Kubernetes dump",
                event.start_mark)
        return super().compose_node(parent, index)


def _timestamp_as_text(loader: yaml.SafeLoader, node: yaml.Node) -> str:
    """A YAML timestamp (``2024-01-01``, also unquoted and implicit) stays the text it is,
    as in the JSON the API server works with (sigs.k8s.io/yaml converts YAML to JSON):
    PyYAML would make it a ``datetime`` (no JSON value), and raise a ValueError on a
    date-like scalar that is no date (``2024-02-30``)."""
    return str(loader.construct_scalar(node))


def _not_json(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    raise yaml.constructor.ConstructorError(
        None, None, f"{node.tag} values are not JSON (a Kubernetes dump has none)", node.start_mark)


_NoAliasLoader.add_constructor("tag:yaml.org,2002:timestamp", _timestamp_as_text)
for _tag in ("binary", "set", "omap", "pairs"):
    _NoAliasLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _not_json)


def parse_documents(text: str, source: str) -> Iterable[Any]:
    """Parse JSON or (multi-document) YAML text; raise InputError naming ``source``.

    A leading byte-order mark is ignored; nesting too deep for the parsers (a hostile or
    corrupt file: ``[[[[...``) is an InputError, not a RecursionError.
    """
    text = text.removeprefix("\ufeff")
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        try:
            return [json.loads(text)]
        except json.JSONDecodeError as err:
            raise InputError(f"invalid JSON at line {err.lineno} column {err.colno}: {err.msg}",
                             source=source) from None
        except RecursionError:
            raise InputError("invalid JSON: nested too deeply", source=source) from None
    try:
        return list(yaml.load_all(text, Loader=_NoAliasLoader))  # noqa: S506 - a SafeLoader
    except RecursionError:
        raise InputError("invalid YAML: nested too deeply", source=source) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or "syntax error"
        raise InputError(f"invalid YAML{where}: {problem}", source=source) from None
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as err:
        # an explicit tag whose text is not of its type (!!int x, !!float abc, !!bool maybe):
        # PyYAML's constructors raise plain Python errors for those
        text = " ".join(f"{type(err).__name__}: {err}".split())[:200]
        raise InputError(f"invalid YAML: a tagged value is not of its type ({text})",
                         source=source) from None


def load_text(text: str, source: str = "<memory>", problems: list[InputError] | None = None) -> Snapshot:
    """Build a :class:`Snapshot` from JSON or YAML text.

    Args:
        text, source: the content and where it came from (named in errors).
        problems: when given, an object without kind, metadata or metadata.name is skipped
            and its error appended here instead of raised (``zonemeter explain`` reports it
            as a row of its own and explains the rest).

    Raises:
        InputError: syntax errors, non-object items, objects without kind or metadata.name
            (unless ``problems`` collects those).
    """
    snap = Snapshot(source=source)
    try:
        for d, doc in enumerate(parse_documents(text, source)):
            for where, obj in _items(doc, f"document {d + 1}"):
                try:
                    _check(obj, where)
                except InputError as err:
                    if problems is None:
                        raise
                    problems.append(err.with_source(source))
                    continue
                snap.add(obj)
    except InputError as err:  # _items' shape errors too must name the file
        raise err.with_source(source) from None
    return snap


def load(path: str | Path, problems: list[InputError] | None = None) -> Snapshot:
    """Read a snapshot file (see :func:`load_text`; ``problems`` as there).

    Raises:
        InputError: the file cannot be read, or its content is malformed.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"cannot read: {getattr(err, 'strerror', None) or err}", source=str(p)) from None
    return load_text(text, str(p), problems)
