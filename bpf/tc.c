/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tc.c - clsact programs for the host side of pod veths, loaded by agent/datapath/attach.py.
 *
 * On the host-side veth, clsact ingress sees packets LEAVING the pod and clsact egress
 * sees packets ENTERING it. Both programs only count: they return TC_ACT_UNSPEC (-1),
 * which in direct-action mode means "continue with the next filter", so any other
 * filter on the hook (a CNI program) still runs and decides the packet's fate.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>
#include "maps.h"

/* Map accessors required by classify.h and account.h (BCC rewrites map.lookup() in this
 * file only). */

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

/* Returns the flow table the programs currently write to, or NULL when none is set. */
static __always_inline void *zm_active_flows(void)
{
	int zero = 0;
	return zm_active.lookup(&zero);
}

/* Returns the cache slot idx (0..ZM_CACHE_SLOTS-1) of this CPU in the active per-CPU flow
 * cache, or NULL when no cache is set. */
static __always_inline struct zm_cache_slot *zm_cache_slot_at(__u32 idx)
{
	int zero = 0;
	void *cache = zm_cache_active.lookup(&zero);
	if (!cache)
		return NULL;
	return bpf_map_lookup_elem(cache, &idx);
}

/* Returns the counter of packets that found no flow or overflow entry (never NULL in practice). */
static __always_inline struct zm_flow_value *zm_lost_counter(void)
{
	int zero = 0;
	return zm_lost.lookup(&zero);
}

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

/* clsact ingress of the host-side veth: packets leaving the pod. Returns TC_ACT_UNSPEC. */
int zm_tc_from_pod(struct __sk_buff *skb)
{
	int family = zm_tc_family(skb);
	if (family)
		zm_classify_and_count(skb, ETH_HLEN, 0, family);
	return TC_ACT_UNSPEC;
}

/* clsact egress of the host-side veth: packets entering the pod. Returns TC_ACT_UNSPEC. */
int zm_tc_to_pod(struct __sk_buff *skb)
{
	int family = zm_tc_family(skb);
	if (family)
		zm_classify_and_count(skb, ETH_HLEN, 1, family);
	return TC_ACT_UNSPEC;
}
