"""The one place that builds a Kubernetes API client (kubeconfig file or in-cluster)."""

from __future__ import annotations

from typing import Any

from agent.errors import InputError, RuntimeFailure


def build_api_client(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """Return a ``kubernetes.client.ApiClient``.

    Args:
        kubeconfig: path of a kubeconfig file; None means in-cluster service-account config.
        context: kubeconfig context (None: the file's current context).

    Raises:
        InputError: the kubeconfig file is missing or malformed.
        RuntimeFailure: no kubeconfig given and not running inside a cluster.
    """
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    if kubeconfig is None:
        try:
            config.load_incluster_config()
        except ConfigException as err:
            raise RuntimeFailure(f"not running in a cluster and no --kubeconfig given: {err}") from None
        return client.ApiClient()
    cfg = client.Configuration()
    try:
        config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
    except (ConfigException, OSError, TypeError, ValueError) as err:
        raise InputError(f"cannot load kubeconfig: {' '.join(str(err).split())}",
                         source=kubeconfig) from None
    return client.ApiClient(cfg)


def list_cluster(api: Any, *, pods: bool = False) -> dict[str, list[dict[str, Any]]]:
    """List Nodes, Services, EndpointSlices (and optionally Pods) as API-shaped dicts.

    List only, no watch: a one-shot view for ``zonemeter explain``.

    Raises:
        RuntimeFailure: the API server refused or could not be reached.
    """
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    core = client.CoreV1Api(api)
    disc = client.DiscoveryV1Api(api)
    out: dict[str, list[dict[str, Any]]] = {}
    calls: list[tuple[str, Any, str]] = [("nodes", core.list_node, "Node"), ("services", core.list_service_for_all_namespaces, "Service"),
             ("endpointslices", disc.list_endpoint_slice_for_all_namespaces, "EndpointSlice")]
    if pods:
        calls.append(("pods", core.list_pod_for_all_namespaces, "Pod"))
    for key, fn, kind in calls:
        try:
            items = fn().items
        except (ApiException, HTTPError, OSError) as err:
            raise RuntimeFailure(f"listing {kind} objects failed: {' '.join(str(err).split())}") from None
        objs = []
        for it in items:
            d = api.sanitize_for_serialization(it)
            d.setdefault("kind", kind)
            objs.append(d)
        out[key] = objs
    out.setdefault("pods", [])
    return out
