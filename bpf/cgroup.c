/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cgroup.c - the socket-side programs, loaded by agent/datapath/cgroup.py and attached as
 * cgroup_skb links (multi-attach) on the node's cgroup v2 root, so they run for every
 * socket of the node whatever moves its packets (docs/datapath.md, "The cgroup_skb hook"):
 *   zm_cg_egress   BPF_CGROUP_INET_EGRESS, ip_finish_output / ip6_finish_output: packets
 *                  leaving a local socket, after the host's netfilter (post-DNAT/SNAT)
 *   zm_cg_ingress  BPF_CGROUP_INET_INGRESS, sk_filter on a full socket: packets entering
 *                  a local socket, after netfilter undid the NAT of the connection
 * "local" is the socket's side, as the pod side is for tc.c. The programs only count and
 * always return 1 (let the packet pass); the packet starts at its IP header (l3_off 0).
 *
 * Scope (only when built with -DZM_SCOPE_NETNS): count only packets whose socket lives in
 * a network namespace whose cookie (bpf_get_netns_cookie, SO_NETNS_COOKIE) is in
 * zm_scope. A node needs none (every socket of the node is the node's); the lab gives each
 * lab node its pods' namespaces, since every namespace on the machine shares the host's
 * cgroup tree (another lab's pods may even reuse the same addresses).
 */
#include <uapi/linux/bpf.h>
#include "maps.h"

#ifdef ZM_SCOPE_NETNS
/* Network namespace cookies whose sockets are counted (value unused, 1). Not part of the
 * pinned layout: the agent fills it at every start. */
BPF_HASH(zm_scope, __u64, __u32, 1024);
#endif

/* Map accessors required by classify.h and account.h; the same as tc.c's (BCC rewrites
 * map.lookup() in the main source file only, so each program file carries its own). */

/* Returns the endpoint map value (1) for k, or NULL when k is no local endpoint. */
static __always_inline __u32 *zm_endpoint_lookup(struct zm_endpoint_key *k)
{
	return zm_endpoints.lookup(k);
}

/* Returns 1 when some local endpoint uses port (__be16), else 0. */
static __always_inline int zm_endpoint_port(__be16 port)
{
	int idx = bpf_ntohs(port);
	__u32 *used = zm_endpoint_ports.lookup(&idx);
	return used && *used;
}

/* Returns 1 when a local socket answered a TCP SYN from port (__be16), else 0. */
static __always_inline int zm_server_port(__be16 port)
{
	int idx = bpf_ntohs(port);
	__u32 *seen = zm_server_ports.lookup(&idx);
	return seen && *seen;
}

/* Marks port (__be16) as one a local socket accepts TCP connections on. */
static __always_inline void zm_server_port_learn(__be16 port)
{
	int idx = bpf_ntohs(port);
	__u32 *seen = zm_server_ports.lookup(&idx);
	if (seen && !*seen)
		*seen = 1;
}

/* Returns the flow table the programs currently write to, or NULL when none is set. */
static __always_inline void *zm_active_flows(void)
{
	int zero = 0;
	return zm_active.lookup(&zero);
}

/* Returns this CPU's slot idx of the active per-CPU flow cache, or NULL. */
static __always_inline struct zm_cache_slot *zm_cache_slot_at(__u32 idx)
{
	int zero = 0;
	void *cache = zm_cache_active.lookup(&zero);
	if (!cache)
		return NULL;
	return bpf_map_lookup_elem(cache, &idx);
}

/* Returns the counter of packets that found no flow or overflow entry. */
static __always_inline struct zm_flow_value *zm_lost_counter(void)
{
	int zero = 0;
	return zm_lost.lookup(&zero);
}

#include "classify.h"

/* Returns 1 when the packet is to be counted: always without -DZM_SCOPE_NETNS, else when
 * the network namespace of its socket is in zm_scope. */
static __always_inline int zm_in_scope(struct __sk_buff *skb)
{
#ifdef ZM_SCOPE_NETNS
	__u64 cookie = bpf_get_netns_cookie(skb);
	return zm_scope.lookup(&cookie) != NULL;
#else
	return 1;
#endif
}

/* Counts one packet of a local socket; into_local: 1 ingress, 0 egress. */
static __always_inline void zm_cg_count(struct __sk_buff *skb, int into_local)
{
	int family;
	if (skb->protocol == bpf_htons(ETH_P_IP))
		family = ZM_FAMILY_INET;
	else if (skb->protocol == bpf_htons(ETH_P_IPV6))
		family = ZM_FAMILY_INET6;
	else
		return;
	if (zm_in_scope(skb))
		zm_classify_and_count(skb, 0, into_local, family, 0);
}

/* cgroup_skb/ingress: packets entering a local socket. Returns 1 (pass). */
int zm_cg_ingress(struct __sk_buff *skb)
{
	zm_cg_count(skb, 1);
	return 1;
}

/* cgroup_skb/egress: packets leaving a local socket. Returns 1 (pass). */
int zm_cg_egress(struct __sk_buff *skb)
{
	zm_cg_count(skb, 0);
	return 1;
}

/* An empty cgroup_skb program: the baseline of bench/bench_cgroup.py. Returns 1. */
int zm_cg_empty(struct __sk_buff *skb)
{
	return 1;
}
