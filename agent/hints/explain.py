"""The logic of ``zonemeter explain``: validate a cluster dump and diagnose it into the explain document.

Input is API-shaped dicts (a ``kubectl get nodes,services,endpointslices,pods -A -o json``
dump, or a live list); :func:`diagnose_objects` checks what the command promises to check
and runs :func:`agent.hints.evaluate_cluster`; :func:`to_document` builds the JSON document
whose schema is in docs/hints.md. Argument handling and printing are in :mod:`agent.cli.explain`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent.errors import InputError
from agent.hints.diagnosis import ServiceDiagnosis, evaluate_cluster, proxy_versions
from agent.hints.versions import DEFAULT_VERSION, KubeVersion
from agent.k8s.parse import LABEL_SERVICE_NAME, parse_node_entry, slice_owner


@dataclass(frozen=True, slots=True)
class ExplainProblem:
    """An object ``zonemeter explain`` could not use, reported as a row of its own.

    Attributes:
        object: the object, ``"Service shop/api"``, ``"EndpointSlice shop/web-2"``,
            ``"Node n-x"`` (or where in the file, when it has no name).
        service: ``namespace/name`` of the Service left unexplained because of it, or None
            (a Node, which still counts with unknown CPU, or an object without a name).
        reason: ``no-endpointslices`` (a Service with a selector and no EndpointSlice in
            the dump) or ``malformed-object``.
        message: the one-line error naming the object and the field.
    """

    object: str
    service: str | None
    reason: str
    message: str

    def to_json(self) -> dict[str, Any]:
        """``{"object", "service", "reason", "message"}`` (an element of ``problems``)."""
        return {"object": self.object, "service": self.service, "reason": self.reason,
                "message": self.message}


def _problem(err: InputError, source: str, owners: dict[str, str]) -> ExplainProblem:
    """An :class:`ExplainProblem` for a malformed object; ``owners`` maps an EndpointSlice
    (``"EndpointSlice ns/name"``) to its Service's ``ns/name``."""
    obj = err.obj or "object"
    service: str | None = None
    if obj.startswith("Service ") and "/" in obj:
        service = obj.split(" ", 1)[1]
    elif obj in owners:
        service = owners[obj]
    return ExplainProblem(obj, service, "malformed-object", str(err.with_source(source)))


def _split_service(text: str) -> tuple[str, str]:
    ns, sep, name = text.partition("/")
    if not sep or not ns or not name:
        raise InputError(f"expected NAMESPACE/NAME, got {text!r}", field="--service")
    return ns, name


def _has_selector(obj: dict[str, Any]) -> bool:
    spec: dict[str, Any] = obj["spec"] if isinstance(obj.get("spec"), dict) else {}
    return bool(spec.get("selector")) and spec.get("type") != "ExternalName"


def diagnose_objects(nodes: list[dict[str, Any]], services: list[dict[str, Any]],
                     endpointslices: list[dict[str, Any]], *, source: str, service: str | None = None,
                     node: str | None = None, version: str = DEFAULT_VERSION,
                     feature_gates: dict[str, bool] | None = None,
                     hints_populated: list[str] | None = None,
                     kube_proxy_version: str | None = None,
                     problems: list[ExplainProblem] | None = None) -> list[ServiceDiagnosis]:
    """Validate the explain inputs and run the model.

    ``version`` is the control plane's; ``kube_proxy_version`` (None: each Node's own, see
    :func:`agent.hints.diagnosis.proxy_versions`) the nodes' kube-proxy's.

    Args:
        problems: when given, odd objects do not stop the run: a Service with a selector but
            no EndpointSlice, a malformed Service or EndpointSlice (its Service is not
            explained), a malformed Node (it counts with unknown CPU, as
            :func:`agent.hints.evaluate_cluster` documents) each append an
            :class:`ExplainProblem` and every other Service is explained. With ``service``,
            only problems of that Service and of objects of no Service are kept. Problems
            already in the list (the loader's, :func:`load_problem`) count too: when there
            are problems and no Service could be explained, the first problem is raised.

    Raises:
        InputError: unknown ``--service``/``--node``, bad version or gates; malformed objects
            or a Service with a selector but no EndpointSlice (without ``problems``, or when
            nothing could be explained).
    """
    if service is not None:
        ns, name = _split_service(service)
        services = [s for s in services if isinstance(s.get("metadata"), dict)
                    and s["metadata"].get("name") == name
                    and s["metadata"].get("namespace", "default") == ns]
        if not services:
            raise InputError("no such Service in the input", source=source, field="--service")
    if node is not None and not any(isinstance(n.get("metadata"), dict)
                                    and n["metadata"].get("name") == node for n in nodes):
        raise InputError(f"no Node {node!r} in the input", source=source, field="--node")
    labelled = {slice_owner(s) for s in endpointslices if isinstance(s, dict)}
    found: list[ExplainProblem] = []
    missing: set[tuple[Any, Any]] = set()
    for s in services:
        meta: dict[str, Any] = s["metadata"] if isinstance(s.get("metadata"), dict) else {}
        key = (meta.get("namespace", "default"), meta.get("name"))
        if _has_selector(s) and key not in labelled:
            err = InputError(
                "has a selector but no EndpointSlice labelled "
                f"{LABEL_SERVICE_NAME}={key[1]} (dump endpointslices too: kubectl get "
                "nodes,services,endpointslices,pods -A -o json)",
                source=source, obj=f"Service {key[0]}/{key[1]}", field="metadata.name")
            if problems is None:
                raise err
            found.append(ExplainProblem(f"Service {key[0]}/{key[1]}", f"{key[0]}/{key[1]}",
                                        "no-endpointslices", str(err)))
            missing.add(key)
    if missing:
        services = [s for s in services if (
            (s["metadata"] if isinstance(s.get("metadata"), dict) else {}).get("namespace", "default"),
            (s["metadata"] if isinstance(s.get("metadata"), dict) else {}).get("name")) not in missing]
    errors: list[InputError] = []
    try:
        diags = evaluate_cluster(nodes, services, endpointslices, version=version,
                                 feature_gates=feature_gates, hints_populated=hints_populated,
                                 strict=problems is None, errors=errors,
                                 kube_proxy_version=kube_proxy_version)
    except InputError as err:
        raise err.with_source(source) from None
    if problems is None:
        return diags
    if errors:
        from agent.k8s.snapshot import object_name

        owners = {object_name(s): "/".join(slice_owner(s)) for s in endpointslices
                  if isinstance(s, dict) and slice_owner(s)[1]}
        found.extend(_problem(err, source, owners) for err in errors)
    if service is not None:
        found = [p for p in found if p.service in (None, service)]
    problems.extend(found)
    if problems and not diags:
        raise InputError(problems[0].message)  # nothing explained: the first problem is the error
    return diags


def load_problem(err: InputError) -> ExplainProblem:
    """The :class:`ExplainProblem` of an object the snapshot loader skipped (no kind, no
    metadata or no name; :func:`agent.k8s.snapshot.load_text` with ``problems``)."""
    return ExplainProblem(err.obj or "object", None, "malformed-object", str(err))


def version_document(nodes: list[dict[str, Any]], version: str, *,
                     feature_gates: dict[str, bool] | None = None, kube_proxy_version: str | None = None,
                     source: str = "flag", warnings: list[str] | None = None) -> dict[str, Any]:
    """The version fields of the explain JSON document.

    Args:
        nodes: the input's Nodes (their ``status.nodeInfo``).
        version: the control plane's ``"1.X"``.
        feature_gates, kube_proxy_version: as :func:`diagnose_objects`.
        source: where ``version`` came from (:data:`agent.hints.versions.VERSION_SOURCES`).
        warnings: sentences said already (the control-plane version's); the nodes' clamped or
            unreadable versions are appended.

    Returns:
        ``{"kubernetes_version_source", "kube_proxy_version", "kube_proxy_versions",
        "version_warnings"}``: ``kube_proxy_version`` is the version of every node not in
        ``kube_proxy_versions`` (node -> ``"1.X"``, the nodes whose kube-proxy differs).

    Raises:
        InputError: bad version, gates or kube-proxy version.
    """
    kv = KubeVersion.parse(version, feature_gates)
    infos = [info for info, _ in (parse_node_entry(n) for n in nodes) if info is not None]
    pv = proxy_versions(infos, kv, kube_proxy_version)
    return {"kubernetes_version_source": source, "kube_proxy_version": str(pv.base),
            "kube_proxy_versions": {n: str(v) for n, v in sorted(pv.by_node.items())},
            "version_warnings": list(warnings or ()) + [note for _, note in pv.notes]}


def to_document(diags: list[ServiceDiagnosis], version: str, node: str | None = None,
                versions: dict[str, Any] | None = None,
                problems: list[ExplainProblem] | None = None) -> dict[str, Any]:
    """The explain JSON document: ``{"kubernetes_version", ...versions, "services": [...],
    "problems": [...]}`` (``versions``: :func:`version_document`; ``problems``:
    :class:`ExplainProblem` objects, ``[]`` when none)."""
    import gc

    only = [node] if node is not None else None
    was = gc.isenabled()
    gc.disable()  # plain acyclic dicts; avoid full scans while building many of them
    try:
        return {"kubernetes_version": version, **(versions or {}),
                "services": [d.to_json(only) for d in diags],
                "problems": [p.to_json() for p in problems or ()]}
    finally:
        if was:
            gc.enable()


def explain_document(nodes: list[dict[str, Any]], services: list[dict[str, Any]],
                     endpointslices: list[dict[str, Any]], *, source: str, service: str | None = None,
                     node: str | None = None, version: str = DEFAULT_VERSION,
                     feature_gates: dict[str, bool] | None = None,
                     hints_populated: list[str] | None = None, kube_proxy_version: str | None = None,
                     version_source: str = "flag") -> dict[str, Any]:
    """Build the explain JSON document (schema in docs/hints.md).

    Raises:
        InputError: see :func:`diagnose_objects`.
    """
    diags = diagnose_objects(nodes, services, endpointslices, source=source, service=service, node=node,
                             version=version, feature_gates=feature_gates, hints_populated=hints_populated,
                             kube_proxy_version=kube_proxy_version)
    return to_document(diags, str(KubeVersion.parse(version, feature_gates)), node,
                       version_document(nodes, version, feature_gates=feature_gates,
                                        kube_proxy_version=kube_proxy_version, source=version_source))
