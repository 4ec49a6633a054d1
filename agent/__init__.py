"""zonemeter: per-Service cross-zone traffic attribution for Kubernetes, counted with eBPF.

Stages follow the data path (see docs/architecture.md):
``bpf/`` → :mod:`agent.datapath` → :mod:`agent.k8s` →
:mod:`agent.hints` → :mod:`agent.attribution` → :mod:`agent.exporter` → :mod:`agent.cli`.
"""

__version__ = "0.1.0"
