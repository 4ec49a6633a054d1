"""One call that gives the agent its metadata: a snapshot file or a live list+watch.

``zonemeter agent`` maps its flags straight onto :func:`open_metadata`:
``--snapshot F`` | ``--kubeconfig F`` | (in-cluster), ``--zone-cidrs F``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.errors import InputError
from agent.k8s import snapshot as snapshot_mod
from agent.k8s.cache import ClusterMetadata, MetadataSettings
from agent.k8s.cidrs import IPNetwork, load_zone_cidrs
from agent.k8s.client import build_api_client
from agent.k8s.watch import MetadataWatcher, WatchSettings

log = logging.getLogger(__name__)

#: (st_ino, st_size, st_mtime_ns) of a snapshot file, or None when it cannot be read
FileStamp = tuple[int, int, int] | None


def file_stamp(path: str | Path) -> FileStamp:
    """``(inode, size in bytes, mtime in ns)`` of ``path``, None when it cannot be stat'ed.

    A rewrite by rename (``os.replace``) always changes the inode; an in-place rewrite
    changes the mtime (and usually the size).
    """
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


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
    snapshot_path: Path | None = None
    #: stamp of the snapshot file last loaded (or last found unreadable, so a bad file is
    #: reported once, not at every poll)
    stamp: FileStamp = None
    #: successful reloads after the first load
    reloads: int = 0
    #: reloads that failed (the previous metadata stays in use)
    reload_errors: int = 0
    _last_error: str | None = field(default=None, repr=False)
    #: the live cluster's :class:`kubernetes.client.ApiClient` (None for a snapshot), for
    #: reads beside the watch such as ``/version``
    api: Any = field(default=None, repr=False)

    def poll_snapshot(self, before_apply: Callable[[], object] | None = None) -> bool:
        """Reload the snapshot file when it changed (inode, size or mtime differ).

        The file is read and parsed first; only when that succeeds is ``before_apply``
        called (the agent drains the kernel tables there, so bytes counted before the
        change are attributed with the metadata of their time) and the cache updated as a
        diff (:meth:`ClusterMetadata.load_snapshot` with ``diff=True``: deleted pods go to
        the grace cache, only changed Services become dirty). A file that is missing or
        malformed is logged once per change and the previous metadata stays in use.

        Returns:
            True when the cache was updated. Always False for a live cluster.
        """
        if self.snapshot_path is None:
            return False
        stamp = file_stamp(self.snapshot_path)
        if stamp == self.stamp:
            return False
        self.stamp = stamp
        try:
            snap = snapshot_mod.load(self.snapshot_path)
        except InputError as err:
            self.reload_errors += 1
            if str(err) != self._last_error:
                self._last_error = str(err)
                log.error("snapshot reload failed, keeping the previous metadata: %s", err)
            return False
        self._last_error = None
        if before_apply is not None:
            before_apply()
        self.cache.load_snapshot(snap, diff=True)
        self.reloads += 1
        log.info("snapshot reloaded", extra={"fields": {
            "snapshot": str(self.snapshot_path), "reloads": self.reloads,
            **self.cache.counts()}})
        return True

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
                  start: bool = True, pod_node: str | None = None,
                  pod_cidrs: tuple[IPNetwork, ...] = ()) -> MetadataSource:
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
        pod_node: ``--pod-scope node``: keep only this node's Pods (the watch asks for
            ``spec.nodeName=NODE``; a snapshot's other pods are dropped) and resolve other
            nodes' pod addresses through EndpointSlices and podCIDRs
            (:attr:`agent.k8s.cache.MetadataSettings.pod_node`); None: every Pod.
        pod_cidrs: the cluster's pod ranges beyond Nodes' ``spec.podCIDRs``
            (``--pod-cidrs``; :attr:`agent.k8s.cache.MetadataSettings.extra_pod_cidrs`).

    Raises:
        InputError: an unreadable or malformed snapshot, kubeconfig or CIDR file.
        RuntimeFailure: no kubeconfig, no host and not running in a cluster.
    """
    cidrs = load_zone_cidrs(zone_cidrs) if zone_cidrs is not None else ()
    cache = ClusterMetadata(MetadataSettings(grace_seconds=grace_seconds, zone_cidrs=cidrs,
                                             extra_pod_cidrs=pod_cidrs, pod_node=pod_node))
    if snapshot is not None:
        stamp = file_stamp(snapshot)  # before reading: a rewrite meanwhile is seen later
        cache.load_snapshot(snapshot_mod.load(snapshot))
        return MetadataSource(cache, None, f"snapshot:{snapshot}", Path(snapshot), stamp)
    api = build_api_client(kubeconfig, host=host)
    origin = f"host:{host}" if host else f"kubeconfig:{kubeconfig}" if kubeconfig else "in-cluster"
    watcher = MetadataWatcher(api, cache, watch_settings, pod_node=pod_node)
    if start:
        watcher.start()
    return MetadataSource(cache, watcher, origin, api=api)
