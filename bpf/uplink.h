/* SPDX-License-Identifier: Apache-2.0 */
/*
 * uplink.h - the tc side shared by tc.c and cgroup.c: the family of a frame, the TCX/clsact
 * hand-over mark, and the count of the first hop of a node port on the node's uplinks
 * (docs/datapath.md, "The first hop of a node port").
 *
 * The first hop: a load balancer or any client off the node sends to an entry address of
 * this node, a node address on a Service's nodePort, a LoadBalancer ingress IP or an
 * externalIP on the Service's port, of a Service with externalTrafficPolicy Cluster (the
 * agent writes these into zm_entries). kube-proxy DNATs the packet (and masquerades it) to
 * an endpoint, often on another node: no pod veth and no local socket is on that hop, so
 * only the uplink that received it sees it. The programs here count, on an uplink,
 *   ingress: packets whose destination (address, port, protocol) is an entry  -> REQUEST
 *   egress:  packets whose source (address, port, protocol) is an entry       -> RESPONSE
 * keyed (entry address, peer, entry port, local_port = the entry port, ifindex of the
 * uplink). local_port, 0 in every other REQUEST/RESPONSE key, marks the key as an entry
 * hop, so the key layout and the pinned tables stay what they are (ZM_LAYOUT_VERSION 3).
 * Everything else on the uplink costs the parse and one inlined array lookup.
 *
 * Hook independent of the socket hook: cgroup.c includes it for its uplink programs too.
 * Each including file defines, besides classify.h's accessors (BCC rewrites map.lookup()
 * in the main source file only):
 *   static __always_inline __u32 *zm_entry_lookup(struct zm_endpoint_key *k);
 *       the zm_entries value (1) of k, or NULL when k is no entry of this node
 *   static __always_inline int zm_entry_port(__be16 port);
 *       1 when some entry of this node uses port, else 0
 *   static __always_inline __u32 *zm_tcx_mark(void);
 *       this CPU's zm_tcx_ran slot, or NULL
 */
#ifndef ZONEMETER_UPLINK_H
#define ZONEMETER_UPLINK_H

#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include "zonemeter.h"
#include "classify.h"

/* Returns the enum zm_family of an IPv4/IPv6 frame, 0 otherwise (ARP, VLAN in payload...). */
static __always_inline int zm_tc_family(struct __sk_buff *skb)
{
	if (skb->protocol == bpf_htons(ETH_P_IP))
		return ZM_FAMILY_INET;
	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return ZM_FAMILY_INET6;
	return 0;
}

/* The zm_tcx_ran mark of this hook: direction 0 = ingress of the device, 1 = egress. */
static __always_inline __u32 zm_hook_mark(struct __sk_buff *skb, int egress)
{
	return skb->ifindex * 2 + egress + 1;
}

/* TCX program of ours: note that this packet was counted here for a clsact program of
 * ours that may run after it on the same hook (zm_tcx_ran, maps.h). Returns nothing. */
static __always_inline void zm_tcx_note(struct __sk_buff *skb, int egress)
{
	__u32 *ran = zm_tcx_mark();
	if (ran)
		*ran = zm_hook_mark(skb, egress);
}

/* clsact program of ours: returns 1 (and clears the mark) when the TCX program of ours
 * on this hook already counted this packet, else 0. */
static __always_inline int zm_tcx_counted(struct __sk_buff *skb, int egress)
{
	__u32 *ran = zm_tcx_mark();
	if (ran && *ran == zm_hook_mark(skb, egress)) {
		*ran = 0;
		return 1;
	}
	return 0;
}

/* Returns 1 when (addr, port, proto) is in zm_entries, else 0. addr: 16 bytes, network
 * order, IPv4 mapped; port: __be16. */
static __always_inline int zm_entry_at(const __u8 *addr, __be16 port, __u8 proto)
{
	struct zm_endpoint_key ek;
	__builtin_memset(&ek, 0, sizeof(ek));
	__builtin_memcpy(ek.addr, addr, 16);
	ek.port = port;
	ek.proto = proto;
	return zm_entry_lookup(&ek) != NULL;
}

/* Counts one packet of an uplink when it is a first-hop packet of a node port: into_node 1
 * for the uplink's ingress (the entry is the destination), 0 for its egress (the entry is
 * the source). The IP header follows the Ethernet header. Returns nothing; never touches
 * the packet. */
static __always_inline void zm_uplink_count(struct __sk_buff *skb, int into_node)
{
	int family = zm_tc_family(skb);
	if (!family)
		return;
	struct zm_flow_key key __attribute__((aligned(8))); /* read as six u64 words */
	__builtin_memset(&key, 0, sizeof(key));
	struct zm_pkt p;
	__builtin_memset(&p, 0, sizeof(p));
	p.saddr = into_node ? key.remote : key.local;
	p.daddr = into_node ? key.local : key.remote;
	if (zm_parse(skb, ETH_HLEN, family, &p) < 0 || !p.has_ports)
		return;
	__be16 port = into_node ? p.dport : p.sport;
	if (!zm_entry_port(port) || !zm_entry_at(key.local, port, p.proto))
		return;
	__u64 packets;
	__u64 bytes = zm_wire_bytes(skb, ETH_HLEN, p.hdr_len, &packets);
	void *flows = zm_active_flows();
	if (!flows) {
		zm_account_lost(bytes, packets);
		return;
	}
	key.kind = into_node ? ZM_KIND_REQUEST : ZM_KIND_RESPONSE;
	key.port = port;
	key.local_port = port; /* the entry-hop mark (see above) */
	key.proto = p.proto;
	key.family = p.family;
	key.ifindex = skb->ifindex;
	struct zm_cache_probe pr;
	zm_cache_probe(zm_active_cache(), &key, &pr);
	if (pr.hit)
		zm_cache_add(pr.hit, bytes, packets);
	else
		zm_count_miss(flows, &pr, &key, NULL, bytes, packets);
}

#endif /* ZONEMETER_UPLINK_H */
