/* SPDX-License-Identifier: Apache-2.0 */
/*
 * classify.h - decide the kind and key of a parsed packet against the local endpoint
 * map, then count it (docs/datapath.md, "Classification").
 *
 * Hook independent: zm_classify_and_count() takes the IP header offset and the
 * direction, so the clsact/TCX programs (tc.c) and the cgroup_skb programs (cgroup.c)
 * share it. BCC
 * rewrites map method calls (map.lookup()) only in the main source file, never in
 * included headers; each program file therefore defines these accessors before
 * including this header (tc.c and cgroup.c do), besides the two account.h needs:
 *   static __always_inline __u32 *zm_endpoint_lookup(struct zm_endpoint_key *k);
 *       the zm_endpoints value (1) of k, or NULL when k is no local endpoint
 *   static __always_inline int zm_endpoint_port(__be16 port);
 *       1 when some local endpoint uses port, else 0
 *   static __always_inline int zm_service_port(__be16 port);
 *       1 when some Service in the cluster uses port (ZM_PORT_SERVICE), else 0
 *   static __always_inline void *zm_active_flows(void);
 *       the flow table the programs write to, or NULL when none is set
 *   static __always_inline int zm_server_port(__be16 port);
 *       1 when some local pod answered a TCP SYN from port (zm_server_ports), else 0
 *   static __always_inline void zm_server_port_learn(__be16 port);
 *       marks port in zm_server_ports
 *   static __always_inline __u32 zm_origin_lookup(struct zm_flow_key *k);
 *       the zm_origins value of k, or 0 when the programs never saw its 5-tuple
 *   static __always_inline void zm_origin_learn(struct zm_flow_key *k, __u32 origin);
 *       records origin for k unless some CPU recorded one first
 * and, when ZM_SOCKET_VIEW is defined (cgroup.c),
 *   static __always_inline void zm_socket_view(struct __sk_buff *skb, struct zm_pkt *p,
 *                                              int into_local);
 *       replaces the parsed addresses and ports by those of the packet's socket
 * and, when ZM_SOCK_COUNTERS is defined (cgroup.c, DatapathConfig.socket_counters),
 *   static __always_inline int zm_sk_claim(struct __sk_buff *skb, int into_local,
 *                                          struct zm_flow_key *key, __u64 bytes,
 *                                          __u64 packets);
 *       1 when the packet's socket took key and counted the packet in its own storage
 *       (its next packets skip the parse and every hash), 0 to count it here
 */
#ifndef ZONEMETER_CLASSIFY_H
#define ZONEMETER_CLASSIFY_H

#include "zonemeter.h"
#include "parse.h"
#include "account.h"

/* Returns port unchanged, or 0 when it lies in the ephemeral range (port is __be16, the
 * range host order). */
static __always_inline __be16 zm_remote_port(__be16 port)
{
	__u16 h = bpf_ntohs(port);
	if (h >= ZM_EPHEMERAL_MIN && h <= ZM_EPHEMERAL_MAX)
		return 0;
	return port;
}

/* Returns the remote port to keep in a non-Service key (EGRESS/INGRESS): port, or 0 when
 * it lies in the ephemeral range and no Service in the cluster uses it. A Service port
 * inside the range (gRPC's 50051, a UDP endpoint's) is kept, so the agent can tell a
 * direct dial of such an endpoint, or a ClusterIP on such a port, as the client's copy of
 * Service traffic (docs/datapath.md, "Late endpoints"). port: __be16. */
static __always_inline __be16 zm_peer_port(__be16 port)
{
	__be16 kept = zm_remote_port(port);
	if (!kept && port && zm_service_port(port))
		return port;
	return kept;
}

/* Returns 1 when (addr, port, proto) is in zm_endpoints, else 0 (the hash lookup only:
 * the caller checked the port array first). addr: 16 bytes, network order, IPv4 mapped;
 * port: __be16. */
static __always_inline int zm_endpoint_lookup_at(const __u8 *addr, __be16 port, __u8 proto)
{
	struct zm_endpoint_key ek;
	__builtin_memset(&ek, 0, sizeof(ek));
	__builtin_memcpy(ek.addr, addr, 16);
	ek.port = port;
	ek.proto = proto;
	return zm_endpoint_lookup(&ek) != NULL;
}

/* TCP flags of a handshake's first two segments (RFC 9293 3.1). */
#define ZM_TCP_SYN 0x02
#define ZM_TCP_ACK 0x10

/*
 * Returns the local pod's port to keep in a non-Service key (EGRESS/INGRESS), or 0: the
 * port a late endpoint (one the agent had not written to zm_endpoints yet: a new pod, an
 * agent restart, an API outage) serves on, so the agent can still recognise the bytes as
 * Service traffic once its metadata lists the endpoint, whatever the client's port and
 * the endpoint's. Kept when
 *   - the packet is a TCP SYN entering the pod (it dials the local port), or
 *   - some local pod answered a SYN from that port (a SYN-ACK left it: zm_server_ports,
 *     learned here, never cleared), or
 *   - some Service in the cluster uses that port (ZM_PORT_SERVICE, written by the agent
 *     from every Service and EndpointSlice it knows: how UDP and SCTP endpoints, which
 *     have no handshake, are known whatever the client's port and the endpoint's), or
 *   - the remote port was ephemeral (remote_port 0) and the local one is not.
 * A client's ephemeral port is kept only when it happens to equal a learned server port
 * or a Service port: at most one key more per such port, never one per connection
 * (docs/datapath.md, "Late endpoints").
 * p: the parsed packet (has_ports set); into_local as zm_classify_and_count; remote_port
 * the key's port; local_port the local pod's port (__be16).
 */
static __always_inline __be16 zm_local_port(const struct zm_pkt *p, int into_local,
					    __be16 remote_port, __be16 local_port)
{
	if (!local_port)
		return 0;
	if (p->proto == IPPROTO_TCP) {
		__u8 hs = p->tcp_flags & (ZM_TCP_SYN | ZM_TCP_ACK);
		if (into_local && hs == ZM_TCP_SYN)
			return local_port;
		if (!into_local && hs == (ZM_TCP_SYN | ZM_TCP_ACK))
			zm_server_port_learn(local_port);
	}
	if (zm_server_port(local_port) || zm_service_port(local_port))
		return local_port;
	if (!remote_port && (into_local ? p->sport : p->dport))
		return zm_remote_port(local_port);
	return 0;
}

/* Returns 1 when port (__be16) lies in the ephemeral range and is no Service port
 * (ZM_PORT_SERVICE), else 0. A UDP or SCTP exchange between two such ports keeps both in
 * its key, whoever spoke first: a server on an ephemeral-range port no agent had marked
 * yet may be the side that sends first (RTP pushed to a negotiated port), so neither side
 * can be dropped as the client's (docs/datapath.md, "Late endpoints"). A learned server
 * port (zm_server_ports) does not count: it is this node's mark, which the other side's
 * node cannot see, and both sides must judge the exchange alike. */
static __always_inline int zm_unmarked_ephemeral(__be16 port)
{
	return port && !zm_remote_port(port) && !zm_service_port(port);
}

/* Returns 1 when port (__be16) lies outside the ephemeral range and at or above 1024,
 * else 0: a port a UDP client may have been given (a pod's own ip_local_port_range, a
 * negotiated media port), unlike a system port below 1024 (DNS 53, NTP 123, syslog 514),
 * which the kernel does not pick for a client by default: a server's. Judged by the
 * number and this node's ephemeral range, so every node with the same range judges it
 * alike, whatever Services its agent has heard of (docs/datapath.md, "Bound that
 * remains"). */
static __always_inline int zm_fixed_port(__be16 port)
{
	return bpf_ntohs(port) >= 1024 && zm_remote_port(port);
}

/* Returns 1 when a UDP or SCTP exchange between remote_port and local_port (__be16)
 * keeps both ports in its keys, whoever spoke first, because one is an unmarked
 * ephemeral-range port (zm_unmarked_ephemeral) and the other a fixed one (zm_fixed_port),
 * else 0. remote_unmarked: whether remote_port is an unmarked ephemeral one, which the
 * caller knows from zm_peer_port (its key port 0), so its Service bit is not read twice. Such an exchange is a client of a server on the fixed port, or a server on the
 * ephemeral-range port that speaks first (RTP pushed to a negotiated port) to its
 * client's fixed port, for a Service one of the two nodes has not marked yet (watch
 * latency): the packets alone cannot tell them apart, and a side that dropped the
 * ephemeral port as a client's would count the client's answers as its workload traffic
 * although the server's node counts them as its Service's request, or count them nowhere
 * when that node lags too. The fixed side is judged by its number, not by the Service
 * ports, so two nodes whose agents know different Services judge it alike. Cost: one key
 * per client port for clients of a UDP server on a fixed port (a Service's clients on
 * their side, a server without a Service on both); system ports are left out (DNS on 53:
 * every query from a fresh port), so a client whose port lies below 1024 is the bound
 * that remains (docs/datapath.md, "Late endpoints", "Bound that remains"). */
static __always_inline int zm_unmarked_to_fixed(int remote_unmarked, __be16 remote_port,
						__be16 local_port)
{
	if (remote_unmarked)
		return zm_fixed_port(local_port);
	return zm_fixed_port(remote_port) && zm_unmarked_ephemeral(local_port);
}

/* Fills *ok with the zm_origins key of the packet's 5-tuple: key's addresses, proto,
 * family and ifindex, kind 0, port = remote_port, local_port = local_port (__be16, as on
 * the wire). */
static __always_inline void zm_origin_key(struct zm_flow_key *ok, const struct zm_flow_key *key,
					  __be16 remote_port, __be16 local_port)
{
	__builtin_memcpy(ok, key, sizeof(*ok));
	ok->kind = 0;
	ok->port = remote_port;
	ok->local_port = local_port;
}

/*
 * Returns the side that sent the first packet the programs saw of the packet's 5-tuple,
 * ZM_ORIGIN_LOCAL or ZM_ORIGIN_REMOTE (zonemeter.h), recording this packet's side when
 * it is the first (zm_origins, maps.h). For protocols with ports but no handshake the
 * programs read (UDP, SCTP): the side that spoke first is the client, so the other
 * side's port is the server's, whatever the two ports are and whether or not the agent
 * has written any Service or endpoint there yet (docs/datapath.md, "Late endpoints").
 * key: the flow key being built (addresses, proto, family, ifindex set); into_local as
 * zm_classify_and_count; remote_port and local_port the packet's ports as on the wire
 * (__be16).
 */
static __always_inline __u32 zm_origin(const struct zm_flow_key *key, int into_local,
				       __be16 remote_port, __be16 local_port)
{
	struct zm_flow_key ok __attribute__((aligned(8)));
	zm_origin_key(&ok, key, remote_port, local_port);
	__u32 origin = zm_origin_lookup(&ok);
	if (origin)
		return origin;
	origin = into_local ? ZM_ORIGIN_REMOTE : ZM_ORIGIN_LOCAL;
	zm_origin_learn(&ok, origin);
	return origin;
}

/*
 * Returns 1 when the local pod dialled the TCP connection of the packet, else 0: its SYN
 * left the pod (recorded as ZM_ORIGIN_LOCAL in zm_origins), or this packet is that SYN.
 * Asked only for a remote port in the ephemeral range that is no Service port while
 * the local port is no learned server port: a server on an ephemeral-range port, dialled by the
 * pod, whose port the key then keeps, so attribution can tell the client's copy of a
 * Service it had not heard of yet (docs/datapath.md, "Late endpoints"). Arguments as
 * zm_origin; p the parsed packet.
 */
static __always_inline int zm_tcp_dialled(const struct zm_flow_key *key, const struct zm_pkt *p,
					  int into_local, __be16 remote_port, __be16 local_port)
{
	struct zm_flow_key ok __attribute__((aligned(8)));
	zm_origin_key(&ok, key, remote_port, local_port);
	if (!into_local && (p->tcp_flags & (ZM_TCP_SYN | ZM_TCP_ACK)) == ZM_TCP_SYN) {
		zm_origin_learn(&ok, ZM_ORIGIN_LOCAL);
		return 1;
	}
	return zm_origin_lookup(&ok) == ZM_ORIGIN_LOCAL;
}

/* Returns the bytes the packet took on the wire from its IP header on: skb->len - l3_off,
 * plus for a GSO packet the L3+L4 headers (hdr_len) of its gso_segs - 1 further segments;
 * *packets is set to the number of packets on the wire (gso_segs, at least 1). */
static __always_inline __u64 zm_wire_bytes(struct __sk_buff *skb, __u32 l3_off, __u32 hdr_len,
					   __u64 *packets)
{
	__u64 bytes = skb->len - l3_off;
	__u32 segs = skb->gso_segs;
	*packets = 1;
	if (segs > 1) {
		*packets = segs;
		bytes += (__u64)(segs - 1) * hdr_len;
	}
	return bytes;
}

/*
 * Classifies the packet in skb and counts it. l3_off: offset of the IP header in the
 * packet data (ETH_HLEN for clsact on Ethernet devices, 0 for cgroup_skb). into_local:
 * 1 when the packet enters the local pod (veth egress, cgroup ingress), 0 when it leaves
 * it (veth ingress, cgroup egress). family: from skb->protocol. ifindex: the key's
 * ifindex (the host veth, skb->ifindex, for tc; for cgroup_skb, which sees sockets, not
 * veths, the pod's cgroup: cgroup.c zm_cg_hook_id, docs/datapath.md, "The cgroup_skb
 * hook").
 * Returns nothing; never touches the packet.
 */
static __always_inline void zm_classify_and_count(struct __sk_buff *skb, __u32 l3_off,
						  int into_local, enum zm_family family,
						  __u32 ifindex)
{
	/* The parser writes the addresses straight into the key: the destination is the
	 * local side when the packet enters the local pod, the source when it leaves it. */
	struct zm_flow_key key __attribute__((aligned(8))); /* read as six u64 words */
	__builtin_memset(&key, 0, sizeof(key));
	struct zm_pkt p;
	__builtin_memset(&p, 0, sizeof(p));
	p.saddr = into_local ? key.remote : key.local;
	p.daddr = into_local ? key.local : key.remote;
	if (zm_parse(skb, l3_off, family, &p) < 0)
		return;
#ifdef ZM_SOCKET_VIEW
	/* cgroup.c: the socket's own addresses, from before any NAT of the host */
	zm_socket_view(skb, &p, into_local);
#endif

	__u64 packets;
	__u64 bytes = zm_wire_bytes(skb, l3_off, p.hdr_len, &packets);

	void *flows = zm_active_flows();
	if (!flows) {
		zm_account_lost(bytes, packets);
		return;
	}

	/* The Service side of the packet: the destination port when it enters the local pod,
	 * the source port when it leaves it. Only a port some endpoint uses (the inlined port
	 * array) can make the packet Service traffic. A packet leaving from an endpoint port
	 * *to the same port* is not a response: it is a peer talking to a peer (memberlist
	 * gossip UDP 9094 -> 9094, NTP 123 -> 123), which the receiving endpoint counts as its
	 * request; counted here as egress too, it would be counted twice. */
	__be16 svc_port = into_local ? p.dport : p.sport;
	struct zm_cache_probe pr;
	key.proto = p.proto;
	key.family = p.family;
	key.ifindex = ifindex;
	if (p.has_ports && zm_endpoint_port(svc_port) && (into_local || p.sport != p.dport)) {
		key.kind = into_local ? ZM_KIND_REQUEST : ZM_KIND_RESPONSE;
		key.port = svc_port;
		/* This Service key in this CPU's cache slot or in the active table means the
		 * endpoint test passed for this flow since the last drain: count without
		 * repeating it. An endpoint removed meanwhile is thus classified as such until
		 * the next drain starts a fresh table and cache. */
		zm_cache_probe(zm_active_cache(), &key, &pr);
		if (pr.hit) {
			zm_cache_add(pr.hit, bytes, packets);
			return;
		}
		struct zm_flow_value *v = bpf_map_lookup_elem(flows, &key);
		if (v || zm_endpoint_lookup_at(key.local, svc_port, p.proto)) {
#ifdef ZM_SOCK_COUNTERS
			if (zm_sk_claim(skb, into_local, &key, bytes, packets))
				return;
#endif
			zm_count_miss(flows, &pr, &key, v, bytes, packets);
			return;
		}
	}
	__be16 remote_port = into_local ? p.sport : p.dport;
	key.kind = into_local ? ZM_KIND_INGRESS : ZM_KIND_EGRESS;
	key.port = zm_peer_port(remote_port);
	if (p.has_ports) {
		/* UDP and SCTP: the side that spoke first tells the server's port (zm_origin):
		 * the local pod's when the peer did (kept beside the client's port as the range
		 * rule left it), the remote one, even inside the ephemeral range, when the pod
		 * did (beside the pod's own port when it lies outside the range: a server
		 * there may be the side that speaks first). A peer talking from a port to the
		 * same port (gossip) keeps it on both sides, whoever spoke first, as a known
		 * endpoint's key does: the receiver's side is its request, the sender's its
		 * copy. So does an exchange between two unmarked ephemeral-range ports, or
		 * between one and a fixed port, without asking zm_origins: a server there may
		 * speak first (zm_unmarked_ephemeral, zm_unmarked_to_fixed).
		 * TCP has its handshake: zm_local_port for the server's side, zm_tcp_dialled
		 * for a client of an ephemeral-range port, whatever the client's own port
		 * (docs/datapath.md, "Late endpoints"). */
		if (p.proto != IPPROTO_TCP) {
			/* key.port 0: the remote port is an unmarked ephemeral one */
			int remote_unmarked = !key.port && remote_port;
			if (remote_port == svc_port ||
			    (remote_unmarked && zm_unmarked_ephemeral(svc_port)) ||
			    zm_unmarked_to_fixed(remote_unmarked, remote_port, svc_port)) {
				key.port = remote_port;
				key.local_port = svc_port;
			} else if (zm_origin(&key, into_local, remote_port, svc_port) ==
				   ZM_ORIGIN_REMOTE) {
				key.local_port = svc_port;
			} else {
				/* the pod spoke first: its own port outside the range is kept,
				 * as zm_local_port keeps it beside a remote port of 0 */
				key.port = remote_port;
				key.local_port = zm_local_port(&p, into_local, 0, svc_port);
			}
		} else {
			/* not asked for a port a local pod accepted connections on (its SYN-ACK
			 * marked it): its packets are a server's */
			if (!key.port && remote_port && !zm_server_port(svc_port) &&
			    zm_tcp_dialled(&key, &p, into_local, remote_port, svc_port))
				key.port = remote_port;
			key.local_port = zm_local_port(&p, into_local, key.port, svc_port);
		}
	}
#ifdef ZM_SOCK_COUNTERS
	if (zm_sk_claim(skb, into_local, &key, bytes, packets))
		return;
#endif
	zm_cache_probe(zm_active_cache(), &key, &pr);
	if (pr.hit)
		zm_cache_add(pr.hit, bytes, packets);
	else
		zm_count_miss(flows, &pr, &key, NULL, bytes, packets);
}

#endif /* ZONEMETER_CLASSIFY_H */
