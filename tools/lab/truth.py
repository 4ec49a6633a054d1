"""The lab's ground truth: read, archive and reset the nftables counters of server pods.

The nft tables themselves are rendered and parsed by :mod:`tools.lab.groundtruth`. Bytes
are L3 bytes on the wire, counted in the server's namespace after DNAT (docs/lab.md).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

from tools.lab import groundtruth
from tools.lab.netns import LabNamespaces
from tools.lab.proc import nsexec
from tools.lab.topology import OutsidePeer, Pod

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
#: the ground-truth table index of an outside peer (its own namespace holds no other table)
PEER_TABLE_INDEX = 0


class LabGroundTruth(LabNamespaces):
    """Ground-truth counters of the lab (part of :class:`tools.lab.Lab`)."""

    _addr_owner: dict[IPAddress, str]
    #: ground truth of counters folded away by remove_pod
    _archived: dict[tuple[str, str, str], tuple[int, int]]
    #: nft counter values at the last removal (gains since then are not archived yet)
    _baseline: dict[tuple[IPAddress, str, str], tuple[int, int]]

    def _install_ground_truth(self, pod: Pod) -> None:
        text = groundtruth.render(pod.index, [(pp.protocol, pp.port) for pp in pod.ports])
        nsexec(self.pod_netns(pod.name), ["nft", "-f", "-"], input=text)

    def _install_peer_ground_truth(self, peer: OutsidePeer) -> None:
        text = groundtruth.render(PEER_TABLE_INDEX, [(pp.protocol, pp.port) for pp in peer.ports])
        nsexec(self.peer_netns(peer.name), ["nft", "-f", "-"], input=text)

    def _install_peer_client_truth(self, peer: OutsidePeer) -> None:
        text = groundtruth.render_client([(pp.protocol, pp.port) for pp in peer.ports])
        nsexec(self.peer_netns(peer.name), ["nft", "-f", "-"], input=text)

    def outside_client_truth(self) -> dict[tuple[str, IPAddress, int, str], int]:
        """Return what each outside peer sent and received as a client, from its own
        namespace: ``{(outside/<name>, remote address, remote port, "request"|"response"):
        L3 bytes}`` (request: sent by the peer; its own server ports left out). The hop a
        load balancer's call to a node port takes to the node, which the endpoint's
        counters never see when the node masquerades (docs/lab.md, "Ground truth").

        Raises:
            RuntimeFailure: nft failed.
        """
        out: dict[tuple[str, IPAddress, int, str], int] = {}
        for peer in self.topology.outside:
            proc = nsexec(self.peer_netns(peer.name),
                          ["nft", "-j", "list", "table", "inet", groundtruth.CLIENT_TABLE])
            for (addr, port, direction), (b, _) in groundtruth.parse_client(proc.stdout).items():
                out[(peer.key, addr, port, direction)] = b
        return out

    def _address_index(self) -> dict[IPAddress, str]:
        owner: dict[IPAddress, str] = {}
        topo = self.topology
        for n in topo.nodes:
            host_pods = [p.name for p in topo.pods_on(n.name) if p.host_network]
            name = host_pods[0] if len(host_pods) == 1 else f"node/{n.name}"
            for a in (n.ip, n.ip6, n.overlay_ip, n.overlay_ip6):
                if a is not None:
                    owner[a] = name
        for p in topo.pods:
            if not p.host_network:
                owner[p.ip] = p.name
                if p.ip6 is not None:
                    owner[p.ip6] = p.name
        for o in topo.outside:
            for a in (o.ip, o.ip6):
                if a is not None:
                    owner[a] = o.key
        return owner

    def client_name(self, address: IPAddress) -> str:
        """Return the pod owning ``address``; for node addresses the node's only
        host-network pod, else ``node/<name>``; an outside peer's ``outside/<name>``; for any
        other address ``ip/<address>``."""
        return self._addr_owner.get(address, f"ip/{address}")

    def ground_truth_counters(self) -> dict[tuple[str, str, str], tuple[int, int]]:
        """Return ``{(client pod, server pod, "request"|"response"): (L3 bytes, packets)}``
        from the nftables counters in every server pod's namespace (IPv4 and IPv6 summed).

        Raises:
            RuntimeFailure: nft failed.
        """
        out: dict[tuple[str, str, str], tuple[int, int]] = dict(self._archived)
        for key, (b, p) in self._since_baseline(self._raw_counters()).items():
            ob, op = out.get(key, (0, 0))
            out[key] = (ob + b, op + p)
        return out

    def _raw_counters(self) -> dict[tuple[IPAddress, str, str], tuple[int, int]]:
        """``{(peer address, server pod, direction): (bytes, packets)}`` as nft has them."""
        out: dict[tuple[IPAddress, str, str], tuple[int, int]] = {}
        for pod in self.topology.pods:
            if not pod.ports:
                continue
            proc = nsexec(self.pod_netns(pod.name),
                           ["nft", "-j", "list", "table", "inet", groundtruth.table_name(pod.index)])
            for (addr, direction), bp in groundtruth.parse(proc.stdout).items():
                out[(addr, pod.name, direction)] = bp
        for peer in self.topology.outside:
            if not peer.ports:
                continue
            proc = nsexec(self.peer_netns(peer.name),
                          ["nft", "-j", "list", "table", "inet", groundtruth.table_name(PEER_TABLE_INDEX)])
            for (addr, direction), bp in groundtruth.parse(proc.stdout).items():
                out[(addr, peer.key, direction)] = bp
        return out

    def _since_baseline(self, raw: Mapping[tuple[IPAddress, str, str], tuple[int, int]]
                        ) -> dict[tuple[str, str, str], tuple[int, int]]:
        """Counter gains since the last removal, keyed by the addresses' current owners."""
        out: dict[tuple[str, str, str], tuple[int, int]] = {}
        for (addr, server, direction), (b, p) in raw.items():
            bb, bp = self._baseline.get((addr, server, direction), (0, 0))
            if b - bb <= 0 and p - bp <= 0:
                continue
            key = (self.client_name(addr), server, direction)
            ob, op = out.get(key, (0, 0))
            out[key] = (ob + b - bb, op + p - bp)
        return out

    def ground_truth(self) -> dict[tuple[str, str, str], int]:
        """Return ``{(client pod, server pod, "request"|"response"): L3 bytes}``.

        L3 bytes: IP header included, every packet (TCP handshake, ACK, FIN; UDP header),
        counted in the server's namespace where addresses are the real ones (after DNAT).
        Pairs with no traffic are absent.

        Raises:
            RuntimeFailure: nft failed.
        """
        return {k: b for k, (b, _) in self.ground_truth_counters().items()}

    def reset_ground_truth(self) -> None:
        """Zero every ground-truth counter (and forget removed pods' archived counts).

        Raises:
            RuntimeFailure: nft failed.
        """
        self._archived.clear()
        self._baseline.clear()
        self._reset_counters()

    def _reset_counters(self) -> None:
        for pod in self.topology.pods:
            if pod.ports:
                nsexec(self.pod_netns(pod.name), ["nft", "-f", "-"],
                        input=groundtruth.render_reset(pod.index))
        for peer in self.topology.outside:
            if peer.ports:
                nsexec(self.peer_netns(peer.name), ["nft", "-f", "-"],
                       input=groundtruth.render_reset(PEER_TABLE_INDEX))
            nsexec(self.peer_netns(peer.name), ["nft", "-f", "-"],
                   input=groundtruth.render_client_reset())
