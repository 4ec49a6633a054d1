"""Kubernetes metadata: list+watch (or a snapshot file), parsed records, IP and Service resolution.

* :mod:`agent.k8s.client`: the one place that builds the official ApiClient.
* :mod:`agent.k8s.watch`: list+watch loops (relist on 410, bounded backoff, synced state).
* :mod:`agent.k8s.parse`: the parser of API objects into records.
* :mod:`agent.k8s.cache`: :class:`~agent.k8s.cache.ClusterMetadata`, the thread-safe cache.
* :mod:`agent.k8s.resolve`: :class:`~agent.k8s.resolve.MetadataAdapter`, resolution for attribution.
* :mod:`agent.k8s.cidrs`: the ``--zone-cidrs`` file and longest-prefix tables.
* :mod:`agent.k8s.snapshot`: ``kubectl ... -o json|yaml`` dumps.
* :mod:`agent.k8s.source`: :func:`~agent.k8s.source.open_metadata`, snapshot or live.

See docs/metadata.md.
"""

from __future__ import annotations

from agent.k8s.cache import RESOURCES, ClusterMetadata, DirtySet, MetadataSettings
from agent.k8s.parse import NodeEntry, ServiceEntry, SliceEntry
from agent.k8s.resolve import MetadataAdapter

__all__ = [
    "RESOURCES", "ClusterMetadata", "DirtySet", "MetadataAdapter", "MetadataSettings", "NodeEntry", "ServiceEntry",
    "SliceEntry",
]
