"""One call that gives the agent its metadata: a snapshot file or a live list+watch.

``zonemeter agent`` maps its flags straight onto :func:`open_metadata`:
``--snapshot F`` | ``--kubeconfig F`` | (in-cluster), ``--zone-cidrs F``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agent.k8s import snapshot as snapshot_mod
from agent.k8s.cache import ClusterMetadata, MetadataSettings
from agent.k8s.cidrs import load_zone_cidrs
from agent.k8s.client import build_api_client
from agent.k8s.watch import MetadataWatcher, WatchSettings


@dataclass
class MetadataSource:
    """The cache and, for a live cluster, the watcher filling it.

    Attributes:
        cache: what the agent reads (resolve, endpoints, raw objects, synced state).
        watcher: the running list+watch threads, or None for a snapshot.
        origin: ``"snapshot:PATH"``, ``"kubeconfig:PATH"``, ``"host:URL"`` or ``"in-cluster"``.
    """

    cache: ClusterMetadata
    watcher: MetadataWatcher | None
    origin: str

    def wait_synced(self, timeout: float) -> bool:
        """Block until every resource is synced (at once for a snapshot)."""
        if self.watcher is None:
            return all(self.cache.synced().values())
        return self.watcher.wait_synced(timeout)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the watch threads (no-op for a snapshot)."""
        if self.watcher is not None:
            self.watcher.stop(timeout)


def open_metadata(*, snapshot: str | Path | None = None, kubeconfig: str | Path | None = None,
                  host: str | None = None, zone_cidrs: str | Path | None = None,
                  grace_seconds: float = 60.0, watch_settings: WatchSettings | None = None,
                  start: bool = True) -> MetadataSource:
    """Build the metadata cache from a snapshot file or a live cluster.

    Args:
        snapshot: a ``kubectl get nodes,services,endpointslices,pods -A -o json|yaml`` dump;
            when given, no API server is contacted.
        kubeconfig: kubeconfig path; with neither this nor ``host``, in-cluster config.
        host: API server URL used without credentials (tests, ``kubectl proxy``).
        zone_cidrs: ``--zone-cidrs`` file (CSV or YAML), see :mod:`agent.k8s.cidrs`.
        grace_seconds: how long deleted pods stay resolvable.
        watch_settings: see :class:`agent.k8s.watch.WatchSettings`.
        start: start the watch threads (live cluster only).

    Raises:
        InputError: an unreadable or malformed snapshot, kubeconfig or CIDR file.
        RuntimeFailure: no kubeconfig, no host and not running in a cluster.
    """
    cidrs = load_zone_cidrs(zone_cidrs) if zone_cidrs is not None else ()
    cache = ClusterMetadata(MetadataSettings(grace_seconds=grace_seconds, zone_cidrs=cidrs))
    if snapshot is not None:
        cache.load_snapshot(snapshot_mod.load(snapshot))
        return MetadataSource(cache, None, f"snapshot:{snapshot}")
    api = build_api_client(kubeconfig, host=host)
    origin = f"host:{host}" if host else f"kubeconfig:{kubeconfig}" if kubeconfig else "in-cluster"
    watcher = MetadataWatcher(api, cache, watch_settings)
    if start:
        watcher.start()
    return MetadataSource(cache, watcher, origin)
