"""Plain record types exchanged between stages.

Stages never pass BCC, pyroute2 or Kubernetes client objects to each other: only these
frozen, slotted dataclasses with :mod:`ipaddress` addresses and :mod:`enum` states.
"""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class FlowKind(enum.Enum):
    """How the kernel classified a packet on a local pod's host-side veth.

    * ``REQUEST``: into a local Service endpoint (``local`` = endpoint, ``remote`` = client).
    * ``RESPONSE``: out of a local Service endpoint (``local`` = endpoint, ``remote`` = client).
    * ``EGRESS``: non-Service traffic leaving a local pod (``local`` = pod, ``remote`` = peer).
    * ``INGRESS``: non-Service traffic entering a local pod (``local`` = pod, ``remote`` = peer).
    """

    REQUEST = "request"
    RESPONSE = "response"
    EGRESS = "egress"
    INGRESS = "ingress"


@dataclass(frozen=True, slots=True)
class FlowDelta:
    """Bytes and packets counted for one flow key since the previous drain.

    Attributes:
        kind: the classification (see :class:`FlowKind`).
        local: the address on this node: the endpoint for REQUEST/RESPONSE, the local pod
            for EGRESS/INGRESS. Unspecified (``0.0.0.0`` / ``::``) when ``overflow``.
        remote: the peer: the client for REQUEST/RESPONSE, the other side otherwise.
        port: REQUEST/RESPONSE: the endpoint (target) port; EGRESS/INGRESS: the remote
            port, or 0 when it lies in the node's ephemeral port range or the protocol
            has no ports. Host byte order.
        protocol: IP protocol number (6 TCP, 17 UDP, 132 SCTP, others with port 0).
        bytes: L3 bytes (IP header included) as sent on the wire, see docs/datapath.md.
        packets: packets as sent on the wire (GSO segments counted one by one).
        overflow: the flow table was full and these bytes went to the overflow entry of
            this kind and address family; addresses and port are then unspecified.
    """

    kind: FlowKind
    local: IPAddress
    remote: IPAddress
    port: int
    protocol: int
    bytes: int
    packets: int
    overflow: bool = False
