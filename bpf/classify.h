/* SPDX-License-Identifier: Apache-2.0 */
/*
 * classify.h - parse one packet, classify it against the local endpoint map and add it
 * to the active flow table. Hook independent: a clsact program (tc.c) passes the offset
 * of the IP header after the Ethernet header; a cgroup_skb program would pass 0.
 * Headers are read from the linear packet data (direct packet access, the fast path);
 * when they are not all there (non-linear skb) or IPv6 extension headers follow, a
 * second parser reads them with bpf_skb_load_bytes, so every skb parses the same way.
 * clsact and cgroup_skb programs have both kinds of access.
 */
#ifndef ZONEMETER_CLASSIFY_H
#define ZONEMETER_CLASSIFY_H

#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/tcp.h>
#include <uapi/linux/udp.h>
#include "zonemeter.h"

/*
 * BCC rewrites map method calls (map.lookup()) only in the main source file, never in
 * included headers. Each program file therefore defines these five accessors before
 * including this header (tc.c does); they are the only map accesses by name:
 *   static __always_inline __u32 *zm_endpoint_lookup(struct zm_endpoint_key *k);
 *   static __always_inline int zm_endpoint_port(__be16 port);  1 when an endpoint uses port
 *   static __always_inline void *zm_active_flows(void);      the active flow table or NULL
 *   static __always_inline struct zm_flow_value *zm_lost_counter(void);
 *   static __always_inline struct zm_cache_slot *zm_cache_slot_at(__u32 idx);  or NULL
 * Flow tables are then reached through the map pointer zm_active_flows() returns, with
 * the plain bpf_map_*_elem helpers, which need no rewriting.
 */

#ifndef IPPROTO_SCTP
#define IPPROTO_SCTP 132
#endif
#define ZM_SCTP_COMMON_HLEN 12
#define ZM_IPV6_MAX_EXT 6

/* Parsed packet, host-internal (never crosses the boundary). */
struct zm_pkt {
	__u8 *saddr;      /* where the parser writes the source address (16 bytes, network
			   * order, IPv4 mapped): straight into the flow key */
	__u8 *daddr;      /* same for the destination address */
	__be16 sport;     /* network order; 0 when the protocol has no ports or for fragments */
	__be16 dport;
	__u8 proto;
	__u8 family;      /* ZM_FAMILY_* */
	__u8 has_ports;   /* 1 when sport/dport were read from an L4 header */
	__u8 _pad;
	__u32 hdr_len;    /* L3 + L4 header bytes, repeated in every GSO segment on the wire */
};

/* Writes ::ffff:<v4> into dst. Returns nothing. */
static __always_inline void zm_map_v4(__u8 *dst, __be32 v4)
{
	__builtin_memset(dst, 0, 10);
	dst[10] = 0xff;
	dst[11] = 0xff;
	__builtin_memcpy(dst + 12, &v4, 4);
}

/* Reads the ports (first 4 bytes of TCP/UDP/SCTP) at off and the L4 header length.
 * Returns 0, or -1 when the packet is too short. */
static __always_inline int zm_parse_l4(struct __sk_buff *skb, __u32 off, struct zm_pkt *p)
{
	__be16 ports[2];
	if (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP && p->proto != IPPROTO_SCTP)
		return 0;
	if (bpf_skb_load_bytes(skb, off, ports, sizeof(ports)) < 0)
		return -1;
	p->sport = ports[0];
	p->dport = ports[1];
	p->has_ports = 1;
	if (p->proto == IPPROTO_TCP) {
		__u8 doff = 0;
		/* data offset: high nibble of byte 12, in 32-bit words */
		if (bpf_skb_load_bytes(skb, off + 12, &doff, 1) < 0)
			return -1;
		p->hdr_len += (doff >> 4) * 4;
	} else if (p->proto == IPPROTO_UDP) {
		p->hdr_len += sizeof(struct udphdr);
	} else {
		p->hdr_len += ZM_SCTP_COMMON_HLEN;
	}
	return 0;
}

/* Parses the IPv4 header at off. Returns 0, or -1 when it is not a parsable IPv4 packet. */
static __always_inline int zm_parse_v4(struct __sk_buff *skb, __u32 off, struct zm_pkt *p)
{
	struct iphdr ip;
	if (bpf_skb_load_bytes(skb, off, &ip, sizeof(ip)) < 0)
		return -1;
	if (ip.version != 4 || ip.ihl < 5)
		return -1;
	p->family = ZM_FAMILY_INET;
	p->proto = ip.protocol;
	zm_map_v4(p->saddr, ip.saddr);
	zm_map_v4(p->daddr, ip.daddr);
	p->hdr_len = ip.ihl * 4;
	/* non-first fragments carry no L4 header: ports stay 0 */
	if (ip.frag_off & bpf_htons(0x1fff))
		return 0;
	return zm_parse_l4(skb, off + ip.ihl * 4, p);
}

/* Parses the IPv6 header and up to ZM_IPV6_MAX_EXT extension headers at off.
 * Returns 0, or -1 when it is not a parsable IPv6 packet. */
static __always_inline int zm_parse_v6(struct __sk_buff *skb, __u32 off, struct zm_pkt *p)
{
	struct ipv6hdr ip6;
	if (bpf_skb_load_bytes(skb, off, &ip6, sizeof(ip6)) < 0)
		return -1;
	if (ip6.version != 6)
		return -1;
	p->family = ZM_FAMILY_INET6;
	__builtin_memcpy(p->saddr, &ip6.saddr, 16);
	__builtin_memcpy(p->daddr, &ip6.daddr, 16);
	__u8 nexthdr = ip6.nexthdr;
	__u32 l4 = off + sizeof(ip6);
#pragma unroll
	for (int i = 0; i < ZM_IPV6_MAX_EXT; i++) {
		__u8 ext[2];
		if (nexthdr != IPPROTO_HOPOPTS && nexthdr != IPPROTO_ROUTING &&
		    nexthdr != IPPROTO_DSTOPTS && nexthdr != IPPROTO_FRAGMENT &&
		    nexthdr != IPPROTO_AH)
			break;
		if (bpf_skb_load_bytes(skb, l4, ext, sizeof(ext)) < 0)
			return -1;
		if (nexthdr == IPPROTO_FRAGMENT) {
			__be16 frag = 0;
			if (bpf_skb_load_bytes(skb, l4 + 2, &frag, sizeof(frag)) < 0)
				return -1;
			nexthdr = ext[0];
			l4 += 8;
			if (frag & bpf_htons(0xfff8)) { /* non-first fragment: no ports */
				p->proto = nexthdr;
				p->hdr_len = l4 - off;
				return 0;
			}
			continue;
		}
		if (nexthdr == IPPROTO_AH)
			l4 += ((__u32)ext[1] + 2) * 4;
		else
			l4 += ((__u32)ext[1] + 1) * 8;
		nexthdr = ext[0];
	}
	p->proto = nexthdr;
	p->hdr_len = l4 - off;
	return zm_parse_l4(skb, l4, p);
}

/* Stores ports and the L4 header length from a bounds-checked L4 header at l4 (at least 4
 * bytes, 13 for TCP). Returns 0. */
static __always_inline int zm_direct_ports(__u8 *l4, struct zm_pkt *p)
{
	__be16 *ports = (__be16 *)l4;
	p->sport = ports[0];
	p->dport = ports[1];
	p->has_ports = 1;
	if (p->proto == IPPROTO_TCP)
		p->hdr_len += (l4[12] >> 4) * 4;
	else if (p->proto == IPPROTO_UDP)
		p->hdr_len += sizeof(struct udphdr);
	else
		p->hdr_len += ZM_SCTP_COMMON_HLEN;
	return 0;
}

/* Fast path: parses from the linear packet data (direct packet access), which on veths
 * holds the headers of nearly every packet; skips the helper calls of the parsers above.
 * Returns 0 when parsed, -1 when it is no parsable IP packet, 1 when the headers are not
 * all in the linear part or an IPv6 extension header follows: the caller then uses
 * zm_parse_v4/zm_parse_v6, which read with bpf_skb_load_bytes. */
static __always_inline int zm_parse_direct(struct __sk_buff *skb, __u32 l3_off, int family,
					   struct zm_pkt *p)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	void *l3 = data + l3_off;
	__u8 *l4;

	if (family == ZM_FAMILY_INET) {
		struct iphdr *ip = l3;
		if ((void *)(ip + 1) > end)
			return 1;
		if (ip->version != 4 || ip->ihl < 5)
			return -1;
		p->family = ZM_FAMILY_INET;
		p->proto = ip->protocol;
		zm_map_v4(p->saddr, ip->saddr);
		zm_map_v4(p->daddr, ip->daddr);
		p->hdr_len = ip->ihl * 4;
		if (ip->frag_off & bpf_htons(0x1fff))
			return 0;
		l4 = (__u8 *)l3 + ip->ihl * 4;
	} else {
		struct ipv6hdr *ip6 = l3;
		if ((void *)(ip6 + 1) > end)
			return 1;
		if (ip6->version != 6)
			return -1;
		if (ip6->nexthdr == IPPROTO_HOPOPTS || ip6->nexthdr == IPPROTO_ROUTING ||
		    ip6->nexthdr == IPPROTO_DSTOPTS || ip6->nexthdr == IPPROTO_FRAGMENT ||
		    ip6->nexthdr == IPPROTO_AH)
			return 1;
		p->family = ZM_FAMILY_INET6;
		p->proto = ip6->nexthdr;
		__builtin_memcpy(p->saddr, &ip6->saddr, 16);
		__builtin_memcpy(p->daddr, &ip6->daddr, 16);
		p->hdr_len = sizeof(*ip6);
		l4 = (__u8 *)(ip6 + 1);
	}
	if (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP && p->proto != IPPROTO_SCTP)
		return 0;
	if ((void *)(l4 + 13) > end) /* ports, and the TCP data offset at byte 12 */
		return p->proto == IPPROTO_TCP || (void *)(l4 + 4) > end ? 1 : zm_direct_ports(l4, p);
	return zm_direct_ports(l4, p);
}

/* Returns port unchanged, or 0 when it lies in the ephemeral range (port is __be16). */
static __always_inline __be16 zm_remote_port(__be16 port)
{
	__u16 h = bpf_ntohs(port);
	if (h >= ZM_EPHEMERAL_MIN && h <= ZM_EPHEMERAL_MAX)
		return 0;
	return port;
}

/* Returns 1 when (addr, port, proto) is in zm_endpoints, else 0 (the hash lookup only:
 * the caller checked the port array first). */
static __always_inline int zm_endpoint_lookup_at(const __u8 *addr, __be16 port, __u8 proto)
{
	struct zm_endpoint_key ek;
	__builtin_memset(&ek, 0, sizeof(ek));
	__builtin_memcpy(ek.addr, addr, 16);
	ek.port = port;
	ek.proto = proto;
	return zm_endpoint_lookup(&ek) != NULL;
}

/* Adds bytes/packets to *v with atomic adds (several CPUs may hit one flow). */
static __always_inline void zm_add_value(struct zm_flow_value *v, __u64 bytes, __u64 packets)
{
	__sync_fetch_and_add(&v->bytes, bytes);
	__sync_fetch_and_add(&v->packets, packets);
}

/* Adds to the entry of key in flows, creating it; when the table is full, adds to the
 * overflow entry of (kind, family); when that is missing too, to zm_lost. Returns nothing:
 * every packet lands in exactly one of the three. */
static __always_inline void zm_account(void *flows, struct zm_flow_key *key, __u64 bytes,
				       __u64 packets)
{
	struct zm_flow_value *v = bpf_map_lookup_elem(flows, key);
	if (v) {
		zm_add_value(v, bytes, packets);
		return;
	}
	struct zm_flow_value init = { .bytes = bytes, .packets = packets };
	long err = bpf_map_update_elem(flows, key, &init, BPF_NOEXIST);
	if (err == 0)
		return;
	if (err == -EEXIST) { /* another CPU created it in between */
		v = bpf_map_lookup_elem(flows, key);
		if (v) {
			zm_add_value(v, bytes, packets);
			return;
		}
	}
	/* -E2BIG: table full */
	struct zm_flow_key ok;
	__builtin_memset(&ok, 0, sizeof(ok));
	ok.kind = key->kind;
	ok.family = key->family;
	ok.overflow = 1;
	v = bpf_map_lookup_elem(flows, &ok);
	if (v) {
		zm_add_value(v, bytes, packets);
		return;
	}
	v = zm_lost_counter();
	if (v)
		zm_add_value(v, bytes, packets);
}

/* Returns 1 when the two flow keys are equal (both 8-byte aligned: five 64-bit words). */
static __always_inline int zm_key_eq(const struct zm_flow_key *a, const struct zm_flow_key *b)
{
	const __u64 *x = (const __u64 *)a, *y = (const __u64 *)b;
	return x[0] == y[0] && x[1] == y[1] && x[2] == y[2] && x[3] == y[3] && x[4] == y[4];
}

/* Returns this CPU's cache slot for key (a multiplicative hash of its five words), or
 * NULL when no cache is active. */
static __always_inline struct zm_cache_slot *zm_cache_slot_for(const struct zm_flow_key *key)
{
	const __u64 *w = (const __u64 *)key;
	__u64 h = (w[0] ^ w[1] ^ w[2] ^ w[3] ^ w[4]) * 0x9E3779B97F4A7C15ULL;
	return zm_cache_slot_at((__u32)(h >> 32) & (ZM_CACHE_SLOTS - 1));
}

/* Counts bytes/packets for key through this CPU's cache slot: added in place when the
 * slot holds key; otherwise the slot's counts go to the flow table (zm_account) and key
 * takes the slot. Without a cache, straight to the table. Plain adds: a slot belongs to
 * one CPU and tc programs do not nest on a CPU (not for PREEMPT_RT kernels, where BPF
 * programs can be preempted). Returns nothing. */
static __always_inline void zm_count(void *flows, struct zm_cache_slot *slot,
				     struct zm_flow_key *key, __u64 bytes, __u64 packets)
{
	if (!slot) {
		zm_account(flows, key, bytes, packets);
		return;
	}
	if (zm_key_eq(&slot->key, key)) {
		slot->bytes += bytes;
		slot->packets += packets;
		return;
	}
	if (slot->packets)
		zm_account(flows, &slot->key, slot->bytes, slot->packets);
	__builtin_memcpy(&slot->key, key, sizeof(*key));
	slot->bytes = bytes;
	slot->packets = packets;
}

/*
 * Classifies the packet in skb and counts it. l3_off: offset of the IP header in the
 * packet data (ETH_HLEN for clsact on Ethernet devices, 0 for cgroup_skb). into_local:
 * 1 when the packet enters the local pod (veth egress, cgroup ingress), 0 when it leaves
 * it (veth ingress, cgroup egress). family: ZM_FAMILY_* from skb->protocol.
 * Bytes are L3 bytes on the wire: skb->len - l3_off, plus for GSO packets the L3+L4
 * headers of the gso_segs - 1 further segments. Returns nothing; never touches the packet.
 */
static __always_inline void zm_classify_and_count(struct __sk_buff *skb, __u32 l3_off,
						  int into_local, int family)
{
	/* The parser writes the addresses straight into the key: the destination is the
	 * local side when the packet enters the local pod, the source when it leaves it. */
	struct zm_flow_key key __attribute__((aligned(8))); /* read as five u64 words */
	__builtin_memset(&key, 0, sizeof(key));
	__u8 *src = into_local ? key.remote : key.local;
	__u8 *dst = into_local ? key.local : key.remote;
	struct zm_pkt p;
	__builtin_memset(&p, 0, sizeof(p));
	p.saddr = src;
	p.daddr = dst;
	int ret = zm_parse_direct(skb, l3_off, family, &p);
	if (ret > 0) {
		__builtin_memset(&p, 0, sizeof(p));
		p.saddr = src;
		p.daddr = dst;
		ret = family == ZM_FAMILY_INET ? zm_parse_v4(skb, l3_off, &p) : zm_parse_v6(skb, l3_off, &p);
	}
	if (ret < 0)
		return;

	__u64 bytes = skb->len - l3_off;
	__u64 packets = 1;
	__u32 segs = skb->gso_segs;
	if (segs > 1) {
		packets = segs;
		bytes += (__u64)(segs - 1) * p.hdr_len;
	}

	void *flows = zm_active_flows();
	if (!flows) {
		struct zm_flow_value *lost = zm_lost_counter();
		if (lost)
			zm_add_value(lost, bytes, packets);
		return;
	}

	/* The Service side of the packet: the destination port when it enters the local pod,
	 * the source port when it leaves it. Only a port some endpoint uses (the inlined port
	 * array) can make the packet Service traffic. A packet leaving from an endpoint port
	 * *to the same port* is not a response: it is a peer talking to a peer (memberlist
	 * gossip UDP 9094 -> 9094, NTP 123 -> 123), which the receiving endpoint counts as its
	 * request; counted here as egress too, it would be counted twice. */
	__be16 svc_port = into_local ? p.dport : p.sport;
	key.proto = p.proto;
	key.family = p.family;
	struct zm_cache_slot *slot;
	if (p.has_ports && zm_endpoint_port(svc_port) && (into_local || p.sport != p.dport)) {
		key.kind = into_local ? ZM_KIND_REQUEST : ZM_KIND_RESPONSE;
		key.port = svc_port;
		/* This Service key in this CPU's cache slot or in the active table means the
		 * endpoint test passed for this flow since the last drain: count without
		 * repeating it. An endpoint removed meanwhile is thus classified as such until
		 * the next drain starts a fresh table and cache. */
		slot = zm_cache_slot_for(&key);
		if (slot && zm_key_eq(&slot->key, &key)) {
			slot->bytes += bytes;
			slot->packets += packets;
			return;
		}
		if (bpf_map_lookup_elem(flows, &key) ||
		    zm_endpoint_lookup_at(key.local, svc_port, p.proto)) {
			zm_count(flows, slot, &key, bytes, packets);
			return;
		}
	}
	if (into_local) {
		key.kind = ZM_KIND_INGRESS;
		key.port = zm_remote_port(p.sport);
	} else {
		key.kind = ZM_KIND_EGRESS;
		key.port = zm_remote_port(p.dport);
	}
	/* The remote side's port is ephemeral: the local pod is likely the server. Keep its
	 * port (when not ephemeral itself) so the agent can still tell Service traffic to an
	 * endpoint missing from zm_endpoints (written late: a new pod, an agent restart or an
	 * API outage) from plain pod traffic. Same number of keys: the remote port is 0. */
	if (!key.port && p.has_ports && (into_local ? p.sport : p.dport)) {
		key.port = zm_remote_port(svc_port);
		key.port_local = key.port ? 1 : 0;
	}
	zm_count(flows, zm_cache_slot_for(&key), &key, bytes, packets);
}

#endif /* ZONEMETER_CLASSIFY_H */
