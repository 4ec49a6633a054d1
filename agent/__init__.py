"""zonemeter: per-Service cross-zone traffic attribution for Kubernetes, counted with eBPF.

Stages follow the data path (see docs/architecture.md):
``bpf/`` → :mod:`agent.datapath` → :mod:`agent.k8s` →
:mod:`agent.hints` → :mod:`agent.attribution` → :mod:`agent.exporter`; on top, one module per
verb in :mod:`agent.cli` (``agent``, ``explain``, ``what-if``, ``top``, ``report``) and the
``report`` verb's Prometheus reader in :mod:`agent.report`.
"""

__version__ = "0.1.0"
