/* SPDX-License-Identifier: Apache-2.0 */
/*
 * parse.h - the packet parser: IPv4/IPv6 header, IPv6 extension headers, L4 ports.
 *
 * One parser for every skb. Each header is read through zm_header(), which points into
 * the linear packet data when the header lies there (direct packet access, no helper
 * call: on veths the linear part holds the headers of nearly every packet) and otherwise
 * copies it with bpf_skb_load_bytes (non-linear skbs), so both load paths parse alike.
 * Hook independent: the caller passes the offset of the IP header (ETH_HLEN for a clsact
 * program on an Ethernet device, 0 for a cgroup_skb program); clsact and cgroup_skb
 * programs have both kinds of access. Never writes to the packet. See docs/datapath.md.
 */
#ifndef ZONEMETER_PARSE_H
#define ZONEMETER_PARSE_H

#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/tcp.h>
#include <uapi/linux/udp.h>
#include "zonemeter.h"

#ifndef IPPROTO_SCTP
#define IPPROTO_SCTP 132
#endif
#define ZM_SCTP_COMMON_HLEN 12 /* RFC 9260 3.1: ports, verification tag, checksum */
#define ZM_IPV6_MAX_EXT 6      /* IPv6 extension headers followed before giving up on ports */

/* Parsed packet, host-internal (never crosses the boundary). */
struct zm_pkt {
	__u8 *saddr;      /* where the parser writes the source address (16 bytes, network
			   * order, IPv4 mapped): straight into the flow key */
	__u8 *daddr;      /* same for the destination address */
	__be16 sport;     /* network order; 0 when the protocol has no ports or for fragments */
	__be16 dport;     /* network order; as sport */
	__u8 proto;       /* IP protocol number of the L4 header (after IPv6 extensions) */
	__u8 family;      /* enum zm_family */
	__u8 has_ports;   /* 1 when sport/dport were read from an L4 header */
	__u8 tcp_flags;   /* TCP: byte 13 of the header (CWR..FIN, RFC 9293 3.1), else 0 */
	__u32 hdr_len;    /* L3 + L4 header bytes, repeated in every GSO segment on the wire */
};

/* Writes ::ffff:<v4> (16 bytes, network order) into dst. Returns nothing. */
static __always_inline void zm_map_v4(__u8 *dst, __be32 v4)
{
	__builtin_memset(dst, 0, 10);
	dst[10] = 0xff;
	dst[11] = 0xff;
	__builtin_memcpy(dst + 12, &v4, 4);
}

/* Returns a pointer to the len bytes at offset off of the packet data: into the linear
 * data when they all lie there (direct packet access), else into buf (len bytes of the
 * caller's stack) filled by bpf_skb_load_bytes; NULL when the packet ends before
 * off + len. */
static __always_inline const void *zm_header(struct __sk_buff *skb, __u32 off, void *buf,
					     __u32 len)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	if (data + off + len <= end)
		return data + off;
	if (bpf_skb_load_bytes(skb, off, buf, len) < 0)
		return NULL;
	return buf;
}

/* Reads the ports (first 4 bytes of TCP/UDP/SCTP) at off and adds the L4 header length
 * to p->hdr_len; other protocols are left without ports. Returns 0, or -1 when the
 * packet is too short. */
static __always_inline int zm_parse_l4(struct __sk_buff *skb, __u32 off, struct zm_pkt *p)
{
	__be16 ports_buf[2];
	const __be16 *ports;
	if (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP && p->proto != IPPROTO_SCTP)
		return 0;
	ports = zm_header(skb, off, ports_buf, sizeof(ports_buf));
	if (!ports)
		return -1;
	p->sport = ports[0];
	p->dport = ports[1];
	p->has_ports = 1;
	if (p->proto == IPPROTO_TCP) {
		__u8 th_buf[2];
		/* data offset: high nibble of byte 12, in 32-bit words; the flags: byte 13 */
		const __u8 *th = zm_header(skb, off + 12, th_buf, sizeof(th_buf));
		if (!th)
			return -1;
		p->hdr_len += (th[0] >> 4) * 4;
		p->tcp_flags = th[1];
	} else if (p->proto == IPPROTO_UDP) {
		p->hdr_len += sizeof(struct udphdr);
	} else {
		p->hdr_len += ZM_SCTP_COMMON_HLEN;
	}
	return 0;
}

/* Parses the IPv4 header at off and its L4 ports. Returns 0, or -1 when it is not a
 * parsable IPv4 packet. */
static __always_inline int zm_parse_v4(struct __sk_buff *skb, __u32 off, struct zm_pkt *p)
{
	struct iphdr ip_buf;
	const struct iphdr *ip = zm_header(skb, off, &ip_buf, sizeof(ip_buf));
	if (!ip)
		return -1;
	if (ip->version != 4 || ip->ihl < 5)
		return -1;
	p->family = ZM_FAMILY_INET;
	p->proto = ip->protocol;
	zm_map_v4(p->saddr, ip->saddr);
	zm_map_v4(p->daddr, ip->daddr);
	__u32 ip_len = ip->ihl * 4; /* header length: ihl counts 32-bit words */
	p->hdr_len = ip_len;
	/* non-first fragments carry no L4 header: ports stay 0 */
	if (ip->frag_off & bpf_htons(0x1fff))
		return 0;
	return zm_parse_l4(skb, off + ip_len, p);
}

/* Parses the IPv6 header, up to ZM_IPV6_MAX_EXT extension headers (RFC 8200 4) and the
 * L4 ports at off. Returns 0, or -1 when it is not a parsable IPv6 packet. */
static __always_inline int zm_parse_v6(struct __sk_buff *skb, __u32 off, struct zm_pkt *p)
{
	struct ipv6hdr ip6_buf;
	const struct ipv6hdr *ip6 = zm_header(skb, off, &ip6_buf, sizeof(ip6_buf));
	if (!ip6)
		return -1;
	if (ip6->version != 6)
		return -1;
	p->family = ZM_FAMILY_INET6;
	__builtin_memcpy(p->saddr, &ip6->saddr, 16);
	__builtin_memcpy(p->daddr, &ip6->daddr, 16);
	__u8 nexthdr = ip6->nexthdr;
	__u32 l4 = off + sizeof(struct ipv6hdr);
#pragma unroll
	for (int i = 0; i < ZM_IPV6_MAX_EXT; i++) {
		__u8 ext_buf[2];
		const __u8 *ext;
		if (nexthdr != IPPROTO_HOPOPTS && nexthdr != IPPROTO_ROUTING &&
		    nexthdr != IPPROTO_DSTOPTS && nexthdr != IPPROTO_FRAGMENT &&
		    nexthdr != IPPROTO_AH)
			break;
		ext = zm_header(skb, l4, ext_buf, sizeof(ext_buf)); /* next header, length */
		if (!ext)
			return -1;
		__u8 next = ext[0], len = ext[1];
		if (nexthdr == IPPROTO_FRAGMENT) {
			__be16 frag_buf;
			const __be16 *frag = zm_header(skb, l4 + 2, &frag_buf, sizeof(frag_buf));
			if (!frag)
				return -1;
			nexthdr = next;
			l4 += 8;
			if (*frag & bpf_htons(0xfff8)) { /* non-first fragment: no ports */
				p->proto = nexthdr;
				p->hdr_len = l4 - off;
				return 0;
			}
			continue;
		}
		if (nexthdr == IPPROTO_AH) /* RFC 4302 2.2: length in 4-octet units, minus 2 */
			l4 += ((__u32)len + 2) * 4;
		else /* RFC 8200 4.3: length in 8-octet units, not counting the first 8 */
			l4 += ((__u32)len + 1) * 8;
		nexthdr = next;
	}
	p->proto = nexthdr;
	p->hdr_len = l4 - off;
	return zm_parse_l4(skb, l4, p);
}

/* Parses the packet whose IP header starts at l3_off, of family (from skb->protocol),
 * into *p (p->saddr and p->daddr set by the caller). Returns 0 when parsed, -1 when it
 * is no parsable IP packet (then nothing is to be counted). */
static __always_inline int zm_parse(struct __sk_buff *skb, __u32 l3_off, enum zm_family family,
				    struct zm_pkt *p)
{
	if (family == ZM_FAMILY_INET)
		return zm_parse_v4(skb, l3_off, p);
	return zm_parse_v6(skb, l3_off, p);
}

#endif /* ZONEMETER_PARSE_H */
