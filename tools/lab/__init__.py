"""The lab: a multi-zone Kubernetes data path in network namespaces (see docs/lab.md).

    from tools.lab import Lab, Topology
    topo = Topology.from_yaml("topology.yaml")
    with Lab(topo) as lab:
        lab.run_flow("client-a1", lab.cluster_ip("shop/web"), 80, count=10)
        print(lab.ground_truth())
"""

from tools.lab.examples import DEFAULT_TOPOLOGY
from tools.lab.lab import DEFAULT_STATE_DIR, FlowHandle, FlowResult, FlowSpec, Lab, list_prefixes
from tools.lab.topology import Topology

__all__ = ["DEFAULT_STATE_DIR", "DEFAULT_TOPOLOGY", "FlowHandle", "FlowResult", "FlowSpec", "Lab",
           "Topology", "list_prefixes"]
