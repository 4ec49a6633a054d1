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
 * Scope (only when built with -DZM_SCOPE_NETNS or -DZM_SCOPE_CGROUP): count only packets
 * whose socket lives in a network namespace whose cookie (bpf_get_netns_cookie,
 * SO_NETNS_COOKIE) is in zm_scope, or (-DZM_SCOPE_CGROUP) whose socket's cgroup is a given
 * cgroup or below it, either suffices. A node needs none (every socket of the node is the
 * node's); the lab gives each lab node its own namespace and the cgroup its pods' cgroups
 * are made under (tools/lab/proc.py), since every namespace on the machine shares the
 * host's cgroup tree (another lab's pods may even reuse the same addresses).
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
	return used && (*used & ZM_PORT_ENDPOINT);
}

/* Returns 1 when some Service in the cluster uses port (__be16), else 0. */
static __always_inline int zm_service_port(__be16 port)
{
	int idx = bpf_ntohs(port);
	__u32 *used = zm_endpoint_ports.lookup(&idx);
	return used && (*used & ZM_PORT_SERVICE);
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

/* Returns the counter of packets that found no flow or overflow entry. */
static __always_inline struct zm_flow_value *zm_lost_counter(void)
{
	int zero = 0;
	return zm_lost.lookup(&zero);
}

/* Accessors of uplink.h (the uplink programs at the end of this file). */

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

#include "parse.h"

#ifndef AF_INET
#define AF_INET 2
#endif
#ifndef AF_INET6
#define AF_INET6 10
#endif

/* Writes the socket's address (sock_common: src_ip4/src_ip6 or dst_ip4/dst_ip6, network
 * order) into dst (16 bytes, IPv4 mapped) when it is set; returns 1 when written, 0 when
 * the socket has none (an unbound or unconnected side, the kernel's control socket of
 * RSTs and TIME-WAIT ACKs) or its family does not fit the packet's. */
static __always_inline int zm_sock_addr(struct bpf_sock *sk, int family, int remote, __u8 *dst)
{
	__u32 skfam = sk->family;
	if (skfam == AF_INET) {
		if (family != ZM_FAMILY_INET)
			return 0;
		__u32 a = remote ? sk->dst_ip4 : sk->src_ip4;
		if (!a)
			return 0;
		zm_map_v4(dst, a);
		return 1;
	}
	if (skfam != AF_INET6)
		return 0;
	__u32 w0 = remote ? sk->dst_ip6[0] : sk->src_ip6[0];
	__u32 w1 = remote ? sk->dst_ip6[1] : sk->src_ip6[1];
	__u32 w2 = remote ? sk->dst_ip6[2] : sk->src_ip6[2];
	__u32 w3 = remote ? sk->dst_ip6[3] : sk->src_ip6[3];
	if (!(w0 | w1 | w2 | w3))
		return 0;
	/* an IPv4 packet of a dual-stack socket: its address is ::ffff:a.b.c.d already */
	int mapped = w0 == 0 && w1 == 0 && w2 == bpf_htonl(0xffff);
	if ((family == ZM_FAMILY_INET) != mapped)
		return 0;
	__builtin_memcpy(dst, &w0, 4);
	__builtin_memcpy(dst + 4, &w1, 4);
	__builtin_memcpy(dst + 8, &w2, 4);
	__builtin_memcpy(dst + 12, &w3, 4);
	return 1;
}

/* Key of zm_wild: a peer of a socket bound to a wildcard address (a listener, an
 * unconnected UDP server), and the socket's port. */
struct zm_wild_key {
	__u8 remote[16];  /* the peer, IPv4 mapped */
	__be16 rport;     /* the peer's port */
	__be16 lport;     /* the socket's port */
	__u8 proto;
	__u8 pad[3];
};
/* the local address a peer reached a wildcard-bound socket at, as the ingress packet had
 * it (after DNAT): restored at egress, where a reply of a connection DNATed on this node
 * carries the ClusterIP as its source (a SYN-ACK is sent on the listener, whose address
 * is the wildcard). Not part of the pinned layout. */
BPF_TABLE("lru_hash", struct zm_wild_key, struct zm_wild_key, zm_wild, 65536);

/*
 * The socket view (docs/datapath.md, "The cgroup_skb hook"): the addresses and ports of
 * the packet's socket replace the packet's, side by side, where the socket has them. At
 * egress the packet has passed the host's netfilter already (ip_finish_output runs after
 * POSTROUTING): a host socket's packet to a ClusterIP carries the backend, and the reply
 * of a host-network server to a connection DNATed on this node carries the ClusterIP as
 * its source. The socket still has what connect() and accept() gave it, as the ingress
 * packet does after netfilter undid the NAT: so both directions of a flow get one key.
 * For a SYN-ACK skb->sk is the request socket, whose sock_common has the same fields.
 */
static __always_inline void zm_socket_view(struct __sk_buff *skb, struct zm_pkt *p, int into_local)
{
	struct bpf_sock *sk = skb->sk;
	if (!sk)
		return;
	__u8 *local = into_local ? p->daddr : p->saddr;
	__u8 *remote = into_local ? p->saddr : p->daddr;
	__u8 addr[16];
	if (p->has_ports && !zm_sock_addr(sk, p->family, 0, addr) && sk->src_port) {
		/* a wildcard-bound socket: remember (ingress) or restore (egress) the local
		 * address its peer dialled */
		struct zm_wild_key k;
		__builtin_memset(&k, 0, sizeof(k));
		__builtin_memcpy(k.remote, remote, 16);
		k.rport = into_local ? p->sport : p->dport;
		k.lport = bpf_htons((__u16)sk->src_port);
		k.proto = p->proto;
		if (into_local) {
			struct zm_wild_key v;
			__builtin_memset(&v, 0, sizeof(v));
			__builtin_memcpy(v.remote, local, 16);
			zm_wild.update(&k, &v);
		} else {
			struct zm_wild_key *v = zm_wild.lookup(&k);
			if (v) {
				__builtin_memcpy(local, v->remote, 16);
				p->sport = k.lport;
			}
		}
		return;
	}
	if (zm_sock_addr(sk, p->family, 0, addr)) {
		__builtin_memcpy(local, addr, 16);
		__u32 port = sk->src_port; /* host order */
		if (p->has_ports && port) {
			if (into_local)
				p->dport = bpf_htons(port);
			else
				p->sport = bpf_htons(port);
		}
	}
	if (zm_sock_addr(sk, p->family, 1, addr)) {
		__u16 port = (__u16)sk->dst_port; /* network order */
		if (p->has_ports && port) {
			__builtin_memcpy(remote, addr, 16);
			if (into_local)
				p->sport = port;
			else
				p->dport = port;
		}
	}
}
#define ZM_SOCKET_VIEW 1

#ifdef ZM_SOCK_COUNTERS
/*
 * Per-socket counters (DatapathConfig.socket_counters, an experiment; docs/datapath.md,
 * "Per-socket counters"). An established TCP socket keeps, per direction, the flow key its
 * first packet was classified to and the bytes and packets of the packets after it, in
 * its own storage (BPF_MAP_TYPE_SK_STORAGE, bpf_sk_storage_get; net/core/bpf_sk_storage.c):
 * no parse, no flow-table or endpoint hash per packet. The counts move into the active
 * flow table (zm_sk_fold)
 *   - on the socket's first packet after the agent emptied a side (the sum of the two
 *     generations in zm_epoch changed), which also reclassifies the socket, and
 *   - on close (zm_cg_release, BPF_CGROUP_INET_SOCK_RELEASE, inet_release), after which
 *     the socket counts through the flow table again.
 * Counts only ever leave a socket by an atomic subtraction of what was read, so a packet
 * counted concurrently stays for the next fold: never twice. Not part of the pinned
 * layout (a restart forgets the counts still in sockets: the experiment's gaps).
 */
#include "account.h"

#define ZM_TCP_ESTABLISHED 1 /* include/net/tcp_states.h */
#define ZM_SK_NONE 0
#define ZM_SK_COUNTING 1
#define ZM_SK_RELEASED 2

/* The storage of one socket: per direction i ([0] egress, leaving the socket; [1]
 * ingress) the flow key its packets count to and what they counted since. The fields every
 * packet reads and writes (zm_sk_fast) come first: with the storage's own 8-byte map
 * pointer in front of them (struct bpf_local_storage_data, whose element puts it at the
 * start of a cache line: bpf_local_storage_elem.sdata is ____cacheline_aligned) they fill
 * one cache line, so a packet touches one line of its socket's storage. Not pinned. */
struct zm_sk_slot {
	__u64 gen[2];               /* 0:  zm_generation() when key[i] was taken */
	__u64 bytes[2];             /* 16: wire L3 bytes not yet in a flow table */
	__u64 packets[2];           /* 32: wire packets not yet in a flow table */
	__u8 state[2];              /* 48: ZM_SK_* */
	__u8 family[2];             /* 50: key[i].family */
	__u32 reserved_52;          /* 52: always 0 */
	struct zm_flow_key key[2];  /* 56: the flow direction i counts to */
};
_Static_assert(sizeof(struct zm_sk_slot) == 152, "sizeof(struct zm_sk_slot) != 152");
_Static_assert(__builtin_offsetof(struct zm_sk_slot, key) == 56, "zm_sk_slot.key != 56");
BPF_SK_STORAGE(zm_sk, struct zm_sk_slot);

/* Returns zm_epoch[1] + zm_epoch[2]: grows by one each time the agent empties a side. */
static __always_inline __u64 zm_generation(void)
{
	int one = 1, two = 2;
	__u64 *a = zm_epoch.lookup(&one);
	__u64 *b = zm_epoch.lookup(&two);
	return (a ? *a : 0) + (b ? *b : 0);
}

/* Moves what direction i (0 or 1) of s holds into the active flow table (zm_account: entry,
 * overflow or zm_lost). Returns nothing. */
static __always_inline void zm_sk_fold(struct zm_sk_slot *s, int i)
{
	__u64 b = s->bytes[i], n = s->packets[i];
	if (!b && !n)
		return;
	__sync_fetch_and_add(&s->bytes[i], -b);
	__sync_fetch_and_add(&s->packets[i], -n);
	struct zm_flow_key k __attribute__((aligned(8)));
	__builtin_memcpy(&k, &s->key[i], sizeof(k));
	void *flows = zm_active_flows();
	if (flows)
		zm_account(flows, &k, b, n);
	else
		zm_account_lost(b, n);
}

/* Returns the established TCP full socket of skb, or NULL. */
static __always_inline struct bpf_sock *zm_sk_tcp(struct __sk_buff *skb)
{
	struct bpf_sock *sk = skb->sk;
	if (!sk)
		return NULL;
	sk = bpf_sk_fullsock(sk);
	if (!sk || sk->protocol != IPPROTO_TCP || sk->state != ZM_TCP_ESTABLISHED)
		return NULL;
	return sk;
}

/* classify.h: the packet was classified to key; 1 when its established TCP socket took
 * key (and this packet's counts) for the direction, 0 to count it in the table. */
static __always_inline int zm_sk_claim(struct __sk_buff *skb, int into_local,
				       struct zm_flow_key *key, __u64 bytes, __u64 packets)
{
	struct bpf_sock *sk = zm_sk_tcp(skb);
	if (!sk)
		return 0;
	struct zm_sk_slot *s = zm_sk.sk_storage_get(sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!s)
		return 0;
	int i = into_local ? 1 : 0;
	if (s->state[i] == ZM_SK_RELEASED)
		return 0;
	zm_sk_fold(s, i); /* what a racing packet left under the old key */
	__builtin_memcpy(&s->key[i], key, sizeof(*key));
	s->family[i] = key->family;
	s->gen[i] = zm_generation();
	__sync_fetch_and_add(&s->bytes[i], bytes);
	__sync_fetch_and_add(&s->packets[i], packets);
	s->state[i] = ZM_SK_COUNTING;
	return 1;
}

/* Returns the L3+L4 header bytes of a TCP packet (IP header at 0), or 0 when they cannot
 * be read (IPv6 with extension headers: then the full path counts it). */
static __always_inline __u32 zm_sk_hdr_len(struct __sk_buff *skb, int family)
{
	__u8 b;
	__u32 l3;
	if (family == ZM_FAMILY_INET) {
		if (bpf_skb_load_bytes(skb, 0, &b, 1) < 0)
			return 0;
		l3 = (b & 0x0f) * 4; /* IHL: RFC 791 3.1 */
	} else {
		if (bpf_skb_load_bytes(skb, 6, &b, 1) < 0 || b != IPPROTO_TCP)
			return 0;
		l3 = 40;
	}
	if (l3 < 20 || l3 > 60 || bpf_skb_load_bytes(skb, l3 + 12, &b, 1) < 0)
		return 0;
	return l3 + (b >> 4) * 4; /* data offset: RFC 9293 3.1 */
}

/* The per-packet path of a socket that holds a key: adds the packet to its storage.
 * Returns 1 when counted there, 0 when the full path must classify and count it.
 * skb->sk goes to bpf_sk_storage_get as it is (the helper takes a sock_common and finds
 * no storage for request, time-wait and other non-full sockets: net/core/bpf_sk_storage.c,
 * bpf_sk_storage_get), so no bpf_sk_fullsock call; only established TCP sockets ever get
 * storage (zm_sk_claim), so the protocol needs no test, only the state. */
static __always_inline int zm_sk_fast(struct __sk_buff *skb, int into_local, int family)
{
	struct bpf_sock *sk = skb->sk;
	if (!sk)
		return 0;
	struct zm_sk_slot *s = zm_sk.sk_storage_get(sk, 0, 0);
	if (!s)
		return 0;
	int i = into_local ? 1 : 0;
	if (s->state[i] != ZM_SK_COUNTING || s->family[i] != family ||
	    sk->state != ZM_TCP_ESTABLISHED)
		return 0;
	if (s->gen[i] != zm_generation()) {
		s->state[i] = ZM_SK_NONE;
		zm_sk_fold(s, i);
		return 0;
	}
	__u64 bytes = skb->len, packets = 1;
	__u32 segs = skb->gso_segs;
	if (segs > 1) {
		__u32 hdr = zm_sk_hdr_len(skb, family);
		if (!hdr)
			return 0;
		packets = segs;
		bytes += (__u64)(segs - 1) * hdr;
	}
	__sync_fetch_and_add(&s->bytes[i], bytes);
	__sync_fetch_and_add(&s->packets[i], packets);
	return 1;
}
#endif /* ZM_SOCK_COUNTERS */

#include "classify.h"

/* Returns 1 when the packet is to be counted: always without a scope, else when the
 * network namespace of its socket is in zm_scope (-DZM_SCOPE_NETNS) or its socket's cgroup
 * is the cgroup -DZM_SCOPE_CGROUP=<id> (at level -DZM_SCOPE_CGROUP_LEVEL) or below it. */
static __always_inline int zm_in_scope(struct __sk_buff *skb)
{
#if defined(ZM_SCOPE_NETNS) || defined(ZM_SCOPE_CGROUP)
#ifdef ZM_SCOPE_NETNS
	__u64 cookie = bpf_get_netns_cookie(skb);
	if (zm_scope.lookup(&cookie))
		return 1;
#endif
#ifdef ZM_SCOPE_CGROUP
	/* the socket's cgroup is ZM_SCOPE_CGROUP (at level ZM_SCOPE_CGROUP_LEVEL) or below it */
	if (bpf_skb_ancestor_cgroup_id(skb, ZM_SCOPE_CGROUP_LEVEL) == ZM_SCOPE_CGROUP)
		return 1;
#endif
	return 0;
#else
	return 1;
#endif
}

/* Returns 1 when the packet (IP header at offset 0) is addressed to a loopback address
 * (127.0.0.0/8, ::1): it never leaves the node and has no peer elsewhere, and both of
 * its ends would be counted as an external peer's (docs/datapath.md). */
static __always_inline int zm_loopback(struct __sk_buff *skb, int family)
{
	if (family == ZM_FAMILY_INET) {
		__u8 first;
		if (bpf_skb_load_bytes(skb, 16, &first, 1) < 0) /* daddr: RFC 791 3.1 */
			return 0;
		return first == 127;
	}
	__u32 w[4];
	if (bpf_skb_load_bytes(skb, 24, w, 16) < 0) /* daddr: RFC 8200 3 */
		return 0;
	return w[0] == 0 && w[1] == 0 && w[2] == 0 && w[3] == bpf_htonl(1);
}

#ifndef ZM_CG_MAX_LEVEL
#define ZM_CG_MAX_LEVEL 16 /* cgroup levels searched for the socket's own (root: 0) */
#endif

/* Returns the key's ifindex for the packet's socket (host byte order): the low 32 bits of
 * the id of the parent of the socket's cgroup v2 cgroup, or 0 when the socket's cgroup is
 * the root or a child of the root, or deeper than ZM_CG_MAX_LEVEL.
 *
 * kubelet puts each container's cgroup directly under its pod's
 * (kubepods[.slice]/<qos>/pod<uid>/<container>: pkg/kubelet/cm/pod_container_manager_linux.go
 * and the runtime's scope), so the parent is the pod's cgroup: one id per pod, shared by
 * its containers and their restarts, so a pod replacing another on the same address never
 * shares an entry with it, as a new veth does not on the veth hook. A cgroup's id is its
 * kernfs node id, allocated by idr_alloc_cyclic under one lock (kernfs_new_node in
 * fs/kernfs/dir.c); the agent orders an address's pods by their containers' ids
 * (PodCgroupOrder in agent/datapath/cgroup.py; docs/datapath.md, "The cgroup_skb hook").
 * The socket's cgroup is the one its creator ran in (sk_cgrp_data, set in sk_alloc; an
 * accepted socket inherits its listener's). Host processes (the root, system.slice/<unit>)
 * key their node's address, which attribution does not resolve by veth. Up to
 * ZM_CG_MAX_LEVEL helper calls (bpf_skb_ancestor_cgroup_id: an array read each). */
static __always_inline __u32 zm_cg_hook_id(struct __sk_buff *skb)
{
	__u64 own = bpf_skb_cgroup_id(skb);
	if (!own)
		return 0;
	__u64 parent = 0;
#pragma unroll
	for (int level = 1; level < ZM_CG_MAX_LEVEL; level++) {
		__u64 id = bpf_skb_ancestor_cgroup_id(skb, level);
		if (id == own)
			return (__u32)parent;
		if (!id)
			return 0;
		parent = id;
	}
	return 0;
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
#ifdef ZM_SOCK_COUNTERS
	if (zm_sk_fast(skb, into_local, family))
		return;
#endif
	if (zm_in_scope(skb) && !zm_loopback(skb, family))
		zm_classify_and_count(skb, 0, into_local, family, zm_cg_hook_id(skb));
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

#ifdef ZM_SOCK_COUNTERS
/* cgroup/sock_release (BPF_CGROUP_INET_SOCK_RELEASE, inet_release, before the protocol's
 * close): moves the socket's remaining counts into the flow table; its later packets (FIN,
 * data still queued) count through the table. Returns 1 (allow). */
int zm_cg_release(struct bpf_sock *sk)
{
	struct zm_sk_slot *s = zm_sk.sk_storage_get(sk, 0, 0);
	if (s) {
		s->state[0] = ZM_SK_RELEASED;
		s->state[1] = ZM_SK_RELEASED;
		zm_sk_fold(s, 0);
		zm_sk_fold(s, 1);
	}
	return 1;
}
#endif

/* An empty cgroup_skb program: the baseline of bench/bench_cgroup.py. Returns 1. */
int zm_cg_empty(struct __sk_buff *skb)
{
	return 1;
}

/* The first hop of a node port on the node's uplinks (uplink.h): with the socket hook as
 * with the veth hook, no socket of this node is on that hop, so the same tc programs as
 * tc.c's count it (TCX links, or clsact filters before Linux 6.6). */
#include "uplink.h"

/* TCX ingress of an uplink. Returns TCX_NEXT (TC_ACT_UNSPEC). */
int zm_tcx_up_in(struct __sk_buff *skb)
{
	zm_tcx_note(skb, 0);
	zm_uplink_count(skb, 1);
	return -1;
}

/* TCX egress of an uplink. Returns TCX_NEXT (TC_ACT_UNSPEC). */
int zm_tcx_up_out(struct __sk_buff *skb)
{
	zm_tcx_note(skb, 1);
	zm_uplink_count(skb, 0);
	return -1;
}

/* clsact ingress of an uplink. Returns TC_ACT_UNSPEC. */
int zm_tc_up_in(struct __sk_buff *skb)
{
	if (!zm_tcx_counted(skb, 0))
		zm_uplink_count(skb, 1);
	return -1;
}

/* clsact egress of an uplink. Returns TC_ACT_UNSPEC. */
int zm_tc_up_out(struct __sk_buff *skb)
{
	if (!zm_tcx_counted(skb, 1))
		zm_uplink_count(skb, 0);
	return -1;
}

/* TCX, last step of an uplink's switch to clsact (tc.c's, docs/datapath.md "Switching
 * between clsact and TCX"). Returns TCX_NEXT. */
int zm_tcx_handoff(struct __sk_buff *skb)
{
	__u32 *ran = zm_tcx_mark();
	if (ran)
		*ran = 0;
	return -1;
}
