"""The one place that builds the official ``kubernetes`` ApiClient.

Three sources, first match wins: an explicit ``host`` (tests, ``kubectl proxy``), a
kubeconfig file, or the in-cluster service account (``KUBERNETES_SERVICE_HOST`` and the
mounted token). The agent only ever reads pods, nodes, services and endpointslices.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException

from agent.errors import InputError, RuntimeFailure

#: TCP keepalive of API connections: (idle seconds, probe interval seconds, probes). A
#: watch whose peer vanished without FIN or RST (API server VM gone, network partition,
#: a load balancer dropping the flow) then fails after 15 + 5 x 3 = 30 s, and the watch
#: loop's outage handling starts (unsynced, relist); without it the only bound was the
#: watch's read timeout (``timeout_seconds`` + margin: 330 s) during which the metadata
#: counted as synced. client-go relies on keepalive and HTTP/2 pings the same way.
KEEPALIVE = (15, 5, 3)


def keepalive_socket_options(idle: int, interval: int, count: int) -> list[tuple[int, int, int]]:
    """urllib3 ``socket_options``: its defaults (TCP_NODELAY) plus TCP keepalive and a
    TCP user timeout of ``idle + interval * count`` seconds (Linux; options the platform
    lacks are left out).

    Args:
        idle: seconds of silence before the first probe.
        interval: seconds between unanswered probes.
        count: unanswered probes after which the connection is dead.

    Raises:
        ValueError: a value below 1.
    """
    if min(idle, interval, count) < 1:
        raise ValueError("keepalive idle, interval and count must be >= 1")
    opts: list[tuple[int, int, int]] = list(urllib3.connection.HTTPConnection.default_socket_options)
    opts.append((socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1))
    for name, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", interval), ("TCP_KEEPCNT", count),
                        ("TCP_USER_TIMEOUT", (idle + interval * count) * 1000)):  # ms
        if hasattr(socket, name):
            opts.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    return opts


def kubeconfig_source(kubeconfig: str | Path | None = None) -> tuple[str, str] | None:
    """The kubeconfig to use, found as kubectl finds it (client-go ``clientcmd``
    ``NewDefaultClientConfigLoadingRules``): ``--kubeconfig``, else ``$KUBECONFIG`` (a
    ``:``-separated list, merged), else ``~/.kube/config`` when it exists; None means
    in-cluster configuration.

    Returns:
        ``(path or path list, how it was found for messages)``, e.g.
        ``("/root/.kube/config", "~/.kube/config")``, or None.
    """
    if kubeconfig is not None:
        return str(kubeconfig), str(kubeconfig)
    env = os.environ.get("KUBECONFIG", "")
    if any(env.split(os.pathsep)):
        return env, f"KUBECONFIG={env}"
    home = os.path.expanduser("~/.kube/config")
    if os.path.isfile(home):
        return home, "~/.kube/config"
    return None


def _first_current_context(paths: list[str]) -> str | None:
    """``current-context`` of the first of ``paths`` that sets one: kubectl's rule for a
    merged ``$KUBECONFIG`` (client-go ``clientcmd`` ``ClientConfigLoadingRules.Load``: the
    first file to set a value wins), where the Python client's merger keeps the last."""
    import yaml

    for p in paths:
        try:
            with open(p) as f:
                doc = yaml.safe_load(f)
        except (OSError, yaml.YAMLError):
            continue  # missing or unreadable here: the client's own load reports it
        if isinstance(doc, dict) and doc.get("current-context"):
            return str(doc["current-context"])
    return None


def build_api_client(kubeconfig: str | Path | None = None, *, host: str | None = None,
                     context: str | None = None, pool_maxsize: int = 8,
                     keepalive: tuple[int, int, int] = KEEPALIVE) -> client.ApiClient:
    """Return a configured :class:`kubernetes.client.ApiClient`.

    Args:
        kubeconfig: path of a kubeconfig file; None: ``$KUBECONFIG``, then
            ``~/.kube/config``, then in-cluster (:func:`kubeconfig_source`).
        host: API server URL (``http://127.0.0.1:8001``) used as is, without credentials;
            for tests and ``kubectl proxy``.
        context: kubeconfig context (default: the file's current context); ignored in-cluster.
        pool_maxsize: HTTP connections kept per host; the watcher holds one per watched
            resource, so at least 5.
        keepalive: (idle s, interval s, probes) of TCP keepalive, see :data:`KEEPALIVE`.

    Raises:
        InputError: the kubeconfig cannot be read or is invalid (names the file).
        RuntimeFailure: no kubeconfig given and not running inside a cluster.
    """
    cfg = client.Configuration()
    found = None if host is not None else kubeconfig_source(kubeconfig)
    if host is not None:
        cfg.host = host
    elif found is not None:
        path, where = found
        paths = [p for p in path.split(os.pathsep) if p]
        if not any(os.path.exists(p) for p in paths):
            raise InputError("cannot read: no such file", source=where)
        if context is None and len(paths) > 1:
            context = _first_current_context(paths)
        try:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                # a ":"-separated list: the client's KubeConfigMerger merges it as kubectl does
                config_file=os.pathsep.join(paths), context=context, client_configuration=cfg)
        except (ConfigException, ValueError, TypeError, OSError) as err:
            raise InputError(f"invalid kubeconfig: {' '.join(str(err).split())}", source=where) from None
    else:
        try:
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        except ConfigException as err:
            # the client's own text for the usual case ("Service host/port is not set.")
            # reads like a Kubernetes Service problem: name the variables instead, and
            # the flags that help
            why = (str(err) if os.environ.get("KUBERNETES_SERVICE_HOST")
                   else "KUBERNETES_SERVICE_HOST unset")
            raise RuntimeFailure(
                f"not running in a cluster ({' '.join(why.split())}) and no kubeconfig (no "
                "--kubeconfig, KUBECONFIG unset, no ~/.kube/config): give --kubeconfig FILE, "
                "or --snapshot FILE with a kubectl dump"
            ) from None
    cfg.connection_pool_maxsize = max(pool_maxsize, 5)
    # no urllib3-level retries: the watch loop retries with its own bounded backoff and
    # must see each failure to judge how long the API has been unreachable
    cfg.retries = False
    cfg.socket_options = keepalive_socket_options(*keepalive)
    return client.ApiClient(configuration=cfg)


def list_cluster(api: Any, *, pods: bool = False) -> dict[str, list[dict[str, Any]]]:
    """List Nodes, Services, EndpointSlices (and optionally Pods) as API-shaped dicts.

    List only, no watch: a one-shot view for ``zonemeter explain``.

    Raises:
        RuntimeFailure: the API server refused or could not be reached.
    """
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    core = client.CoreV1Api(api)
    disc = client.DiscoveryV1Api(api)
    out: dict[str, list[dict[str, Any]]] = {}
    calls: list[tuple[str, Any, str]] = [
        ("nodes", core.list_node, "Node"), ("services", core.list_service_for_all_namespaces, "Service"),
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
