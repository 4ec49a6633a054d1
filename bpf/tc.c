/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tc.c - the programs for the host side of pod veths, loaded by agent/datapath/attach.py:
 * zm_tcx_* attached as TCX links (Linux 6.6+), zm_tc_* as clsact filters.
 *
 * On the host-side veth, ingress sees packets LEAVING the pod and egress sees packets
 * ENTERING it. The programs only count: they return TC_ACT_UNSPEC (-1), which is
 * TCX_NEXT for TCX (the next program in the device's list runs, then legacy tc) and
 * "continue with the next filter" for a clsact filter in direct-action mode, so any
 * other program on the hook (a CNI's) still runs and decides the packet's fate.
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
	return used && (*used & ZM_PORT_ENDPOINT);
}

/* Returns 1 when some Service in the cluster uses port (__be16), else 0. */
static __always_inline int zm_service_port(__be16 port)
{
	int idx = bpf_ntohs(port);
	__u32 *used = zm_endpoint_ports.lookup(&idx);
	return used && (*used & ZM_PORT_SERVICE);
}

/* Returns 1 when a local pod answered a TCP SYN from port (__be16), else 0. */
static __always_inline int zm_server_port(__be16 port)
{
	int idx = bpf_ntohs(port);
	__u32 *seen = zm_server_ports.lookup(&idx);
	return seen && *seen;
}

/* Marks port (__be16) as one a local pod accepts TCP connections on. Returns nothing. */
static __always_inline void zm_server_port_learn(__be16 port)
{
	int idx = bpf_ntohs(port);
	__u32 *seen = zm_server_ports.lookup(&idx);
	if (seen && !*seen)
		*seen = 1;
}

/* Returns the zm_origins value of k (ZM_ORIGIN_LOCAL or ZM_ORIGIN_REMOTE), or 0 when the
 * programs never saw k's 5-tuple (or it was evicted). */
static __always_inline __u32 zm_origin_lookup(struct zm_flow_key *k)
{
	__u32 *origin = zm_origins.lookup(k);
	return origin ? *origin : 0;
}

/* Records origin (ZM_ORIGIN_LOCAL or ZM_ORIGIN_REMOTE) for k's 5-tuple unless some CPU
 * recorded one first (BPF_NOEXIST). Returns nothing. */
static __always_inline void zm_origin_learn(struct zm_flow_key *k, __u32 origin)
{
	zm_origins.insert(k, &origin);
}

/* Returns the flow table the programs currently write to, or NULL when none is set. */
static __always_inline void *zm_active_flows(void)
{
	int zero = 0;
	return zm_active.lookup(&zero);
}

/* Returns the active per-CPU flow cache (the map zm_cache_active points at), or NULL when
 * none is set. */
static __always_inline void *zm_active_cache(void)
{
	int zero = 0;
	return zm_cache_active.lookup(&zero);
}

/* Returns the counter of packets that found no flow or overflow entry (never NULL in practice). */
static __always_inline struct zm_flow_value *zm_lost_counter(void)
{
	int zero = 0;
	return zm_lost.lookup(&zero);
}

/* Returns the zm_entries value (1) for k, or NULL when k is no entry of this node. */
static __always_inline __u32 *zm_entry_lookup(struct zm_endpoint_key *k)
{
	return zm_entries.lookup(k);
}

/* Returns 1 when some entry of this node uses port (__be16), else 0. */
static __always_inline int zm_entry_port(__be16 port)
{
	int idx = bpf_ntohs(port);
	__u32 *used = zm_entry_ports.lookup(&idx);
	return used && *used;
}

/* Returns this CPU's zm_tcx_ran slot (maps.h), or NULL. */
static __always_inline __u32 *zm_tcx_mark(void)
{
	int zero = 0;
	return zm_tcx_ran.lookup(&zero);
}

#include "classify.h"

#include "uplink.h"

/* Counts one packet of the host-side veth; to_pod: 0 ingress (leaving the pod), 1 egress. */
static __always_inline void zm_tc_count(struct __sk_buff *skb, int to_pod)
{
	int family = zm_tc_family(skb);
	if (family)
		zm_classify_and_count(skb, ETH_HLEN, to_pod, family, skb->ifindex);
}

/* TCX ingress of the host-side veth: packets leaving the pod. Returns TCX_NEXT. */
int zm_tcx_from_pod(struct __sk_buff *skb)
{
	zm_tcx_note(skb, 0);
	zm_tc_count(skb, 0);
	return TC_ACT_UNSPEC;
}

/* TCX egress of the host-side veth: packets entering the pod. Returns TCX_NEXT. */
int zm_tcx_to_pod(struct __sk_buff *skb)
{
	zm_tcx_note(skb, 1);
	zm_tc_count(skb, 1);
	return TC_ACT_UNSPEC;
}

/* TCX, last step of a switch to clsact (docs/datapath.md): counts nothing and clears
 * this CPU's mark, so that the clsact program after it counts the packet and a mark left
 * from before the clsact filter existed never outlives the link. Returns TCX_NEXT. */
int zm_tcx_handoff(struct __sk_buff *skb)
{
	__u32 *ran = zm_tcx_mark();
	if (ran)
		*ran = 0;
	return TC_ACT_UNSPEC;
}

/* clsact ingress of the host-side veth: packets leaving the pod. Returns TC_ACT_UNSPEC. */
int zm_tc_from_pod(struct __sk_buff *skb)
{
	if (!zm_tcx_counted(skb, 0))
		zm_tc_count(skb, 0);
	return TC_ACT_UNSPEC;
}

/* clsact egress of the host-side veth: packets entering the pod. Returns TC_ACT_UNSPEC. */
int zm_tc_to_pod(struct __sk_buff *skb)
{
	if (!zm_tcx_counted(skb, 1))
		zm_tc_count(skb, 1);
	return TC_ACT_UNSPEC;
}

/* TCX ingress of an uplink: the first hop of a node port into this node (uplink.h).
 * Returns TCX_NEXT. */
int zm_tcx_up_in(struct __sk_buff *skb)
{
	zm_tcx_note(skb, 0);
	zm_uplink_count(skb, 1);
	return TC_ACT_UNSPEC;
}

/* TCX egress of an uplink: the answers of that hop. Returns TCX_NEXT. */
int zm_tcx_up_out(struct __sk_buff *skb)
{
	zm_tcx_note(skb, 1);
	zm_uplink_count(skb, 0);
	return TC_ACT_UNSPEC;
}

/* clsact ingress of an uplink. Returns TC_ACT_UNSPEC. */
int zm_tc_up_in(struct __sk_buff *skb)
{
	if (!zm_tcx_counted(skb, 0))
		zm_uplink_count(skb, 1);
	return TC_ACT_UNSPEC;
}

/* clsact egress of an uplink. Returns TC_ACT_UNSPEC. */
int zm_tc_up_out(struct __sk_buff *skb)
{
	if (!zm_tcx_counted(skb, 1))
		zm_uplink_count(skb, 0);
	return TC_ACT_UNSPEC;
}
