"""Kubernetes metadata: list+watch (or a snapshot file), slim cached records, IP resolution.

* :mod:`agent.k8s.client`: the one place that builds the official ApiClient.
* :mod:`agent.k8s.watch`: list+watch loops (relist on 410, bounded backoff, synced state).
* :mod:`agent.k8s.cache`: :class:`~agent.k8s.cache.ClusterMetadata`, resolution and endpoints.
* :mod:`agent.k8s.cidrs`: the ``--zone-cidrs`` file and longest-prefix tables.
* :mod:`agent.k8s.snapshot`: ``kubectl ... -o json|yaml`` dumps.
* :mod:`agent.k8s.source`: :func:`~agent.k8s.source.open_metadata`, snapshot or live.

See docs/metadata.md.
"""
