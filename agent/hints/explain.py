"""The logic of ``zonemeter explain``: validate a cluster dump and diagnose it into the explain document.

Input is API-shaped dicts (a ``kubectl get nodes,services,endpointslices,pods -A -o json``
dump, or a live list); :func:`diagnose_objects` checks what the command promises to check
and runs :func:`agent.hints.evaluate_cluster`; :func:`to_document` builds the JSON document
whose schema is in docs/hints.md. Argument handling and printing are in :mod:`agent.cli.explain`.
"""

from __future__ import annotations

from typing import Any

from agent.errors import InputError
from agent.hints.diagnosis import ServiceDiagnosis, evaluate_cluster
from agent.hints.versions import DEFAULT_VERSION, KubeVersion
from agent.k8s.parse import LABEL_SERVICE_NAME, slice_owner


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
                     hints_populated: list[str] | None = None) -> list[ServiceDiagnosis]:
    """Validate the explain inputs and run the model.

    Raises:
        InputError: malformed objects, unknown ``--service``/``--node``, a Service with a
            selector but no EndpointSlice, bad version or gates.
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
    for s in services:
        meta: dict[str, Any] = s["metadata"] if isinstance(s.get("metadata"), dict) else {}
        key = (meta.get("namespace", "default"), meta.get("name"))
        if _has_selector(s) and key not in labelled:
            raise InputError(
                "has a selector but no EndpointSlice labelled "
                f"{LABEL_SERVICE_NAME}={key[1]} (dump endpointslices too: kubectl get "
                "nodes,services,endpointslices,pods -A -o json)",
                source=source, obj=f"Service {key[0]}/{key[1]}", field="metadata.name")
    try:
        return evaluate_cluster(nodes, services, endpointslices, version=version,
                                      feature_gates=feature_gates, hints_populated=hints_populated,
                                      strict=True)
    except InputError as err:
        raise err.with_source(source) from None


def to_document(diags: list[ServiceDiagnosis], version: str, node: str | None = None) -> dict[str, Any]:
    """The explain JSON document: ``{"kubernetes_version", "services": [...]}``."""
    import gc

    only = [node] if node is not None else None
    was = gc.isenabled()
    gc.disable()  # plain acyclic dicts; avoid full scans while building many of them
    try:
        return {"kubernetes_version": version, "services": [d.to_json(only) for d in diags]}
    finally:
        if was:
            gc.enable()


def explain_document(nodes: list[dict[str, Any]], services: list[dict[str, Any]],
                     endpointslices: list[dict[str, Any]], *, source: str, service: str | None = None,
                     node: str | None = None, version: str = DEFAULT_VERSION,
                     feature_gates: dict[str, bool] | None = None,
                     hints_populated: list[str] | None = None) -> dict[str, Any]:
    """Build the explain JSON document (schema in docs/hints.md).

    Raises:
        InputError: see :func:`diagnose_objects`.
    """
    diags = diagnose_objects(nodes, services, endpointslices, source=source, service=service, node=node,
                     version=version, feature_gates=feature_gates, hints_populated=hints_populated)
    return to_document(diags, str(KubeVersion.parse(version, feature_gates)), node)
