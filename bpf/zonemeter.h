/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zonemeter.h - the layout of everything that crosses the kernel/user boundary.
 *
 * Mirrored field by field in agent/datapath/abi.py. Every struct below carries
 * _Static_assert on its size and on the offset of every field Python reads, so a layout
 * change fails the build here first; tests/unit/datapath/test_abi.py compiles this header
 * with plain gcc, measures sizeof/offsetof and also reads these assertions, and checks
 * both against the ctypes mirror. Reserved bytes are named fields (reserved_<offset>,
 * as cilium's bpf/lib names its padding), always 0: a field that takes their place is a
 * visible layout change (bump ZM_LAYOUT_VERSION).
 *
 * The other headers, one concern each: maps.h the maps, parse.h the packet parser,
 * classify.h the classification, account.h the counting (docs/datapath.md).
 *
 * Addresses are 16 bytes in network byte order; IPv4 addresses are stored in their
 * IPv4-mapped IPv6 form (::ffff:a.b.c.d, RFC 4291 2.5.5.2) so one key type serves both
 * families and an IPv4 key can never equal an IPv6 key. Ports are __be16 (network byte
 * order). Counters are host byte order __u64.
 *
 * Options (pass as -D defines, agent/datapath/config.py flags_for does):
 *   ZM_FLOW_CAPACITY      flow entries per table before bytes go to the overflow entries
 *   ZM_ENDPOINT_CAPACITY  local endpoints (address, port, protocol) the agent may write
 *   ZM_EPHEMERAL_MIN/MAX  ephemeral port range, host byte order, inclusive: a remote port
 *                         in it is recorded as 0 for non-Service flows
 *   ZM_PIN_DIR            optional string literal, a directory on a BPF filesystem: every
 *                         map is pinned there (created, or reused when a previous agent
 *                         left it), so the kernel keeps counting across agent restarts
 */
#ifndef ZONEMETER_H
#define ZONEMETER_H

#include <linux/types.h>

#ifndef ZM_FLOW_CAPACITY
#define ZM_FLOW_CAPACITY 65536
#endif
#ifndef ZM_ENDPOINT_CAPACITY
#define ZM_ENDPOINT_CAPACITY 16384
#endif
#ifndef ZM_EPHEMERAL_MIN
#define ZM_EPHEMERAL_MIN 32768
#endif
#ifndef ZM_EPHEMERAL_MAX
#define ZM_EPHEMERAL_MAX 60999
#endif

/* Version of everything pinned under ZM_PIN_DIR (struct layouts, map set, meaning of the
 * fields). Stored in the pinned zm_layout map; a restarted agent that finds another
 * value (or other map sizes) recreates the pins instead of misreading them. Bump it with
 * any change to the structs below or to the maps in maps.h. */
#define ZM_LAYOUT_VERSION 3

/* Slots of the per-CPU flow cache in front of each flow table (power of two), in sets of
 * ZM_CACHE_WAYS slots (a power of two too): a key may sit in any slot of its set
 * (account.h). Overridable with -D for A/B runs (bench/bench_flows.py --variant); the
 * agent reads the slot count from the map itself. */
#ifndef ZM_CACHE_SLOTS
#define ZM_CACHE_SLOTS 256
#endif
#ifndef ZM_CACHE_WAYS
#define ZM_CACHE_WAYS 1
#endif
#define ZM_CACHE_SETS (ZM_CACHE_SLOTS / ZM_CACHE_WAYS)

/* One overflow entry per (kind, family): 4 kinds x 2 families. The agent seeds them in
 * both flow tables, so a table holds ZM_FLOW_CAPACITY flows plus these. */
#define ZM_OVERFLOW_SLOTS 8

/* Bits of a zm_endpoint_ports value (maps.h), written by the agent, per port (host order).
 * ZM_PORT_SERVICE lets the programs keep a port that lies in the ephemeral range, or a
 * local pod's port, in a non-Service key when it may be a server port the endpoint map
 * does not hold yet (classify.h; docs/datapath.md, "Late endpoints"). */
#define ZM_PORT_ENDPOINT 1 /* some local endpoint uses the port (any protocol) */
#define ZM_PORT_SERVICE 2  /* some Service in the cluster uses the port: a Service port, a
                            * numeric targetPort or an EndpointSlice port, any protocol */

/* Entries of zm_origins (maps.h): the UDP/SCTP 5-tuples of local pods whose first packet
 * the programs saw, with the side that sent it. LRU: the least recently seen tuple makes
 * room for a new one. */
#ifndef ZM_ORIGIN_CAPACITY
#define ZM_ORIGIN_CAPACITY 65536
#endif

/* Values of a zm_origins entry: the side that sent the first packet seen of its 5-tuple
 * (classify.h, zm_origin; docs/datapath.md, "Late endpoints"). */
#define ZM_ORIGIN_LOCAL 1  /* the local pod sent it: the remote port is the server's */
#define ZM_ORIGIN_REMOTE 2 /* the peer sent it: the local pod's port is the server's */

/* Values of zm_flow_key.kind (agent.records.FlowKind, in this order). */
enum zm_kind {
	ZM_KIND_REQUEST = 0,  /* into a local Service endpoint */
	ZM_KIND_RESPONSE = 1, /* out of a local Service endpoint */
	ZM_KIND_EGRESS = 2,   /* non-Service, leaving a local pod */
	ZM_KIND_INGRESS = 3,  /* non-Service, entering a local pod */
};

/* Values of zm_flow_key.family: the IP version. */
enum zm_family {
	ZM_FAMILY_INET = 4,
	ZM_FAMILY_INET6 = 6,
};

/* Size and field offset checks: the numbers Python's mirror relies on, stated here. */
#define ZM_ASSERT_SIZE(type, size) \
	_Static_assert(sizeof(struct type) == (size), "sizeof(struct " #type ") != " #size)
#define ZM_ASSERT_OFFSET(type, field, off)                                  \
	_Static_assert(__builtin_offsetof(struct type, field) == (off), \
		       "offsetof(struct " #type ", " #field ") != " #off)

/* Key of a flow entry. 48 bytes (six 64-bit words), no implicit padding; zeroed before
 * use so no byte carries garbage into the hash. */
struct zm_flow_key {
	__u8 local[16];     /* 0:  this node's side: endpoint (REQUEST/RESPONSE) or pod; network order */
	__u8 remote[16];    /* 16: the peer: client (REQUEST/RESPONSE) or other side; network order */
	__be16 port;        /* 32: endpoint port (REQUEST/RESPONSE); EGRESS/INGRESS: the remote port,
	                     * or 0 when it lies in the ephemeral range or the protocol has none */
	__be16 local_port;  /* 34: EGRESS/INGRESS only: the local pod's port when it may be a server
	                     * port (classify.h, zm_local_port), so the agent can still recognise
	                     * Service traffic to an endpoint it had not yet written to zm_endpoints
	                     * when the packet passed; else 0 */
	__u8 proto;         /* 36: IP protocol number (IPPROTO_TCP 6, UDP 17, SCTP 132, others) */
	__u8 kind;          /* 37: enum zm_kind */
	__u8 family;        /* 38: enum zm_family */
	__u8 overflow;      /* 39: 1 for the per-(kind, family) overflow entry: all else 0 */
	__u32 ifindex;      /* 40: host byte order: the host-side veth the packet crossed
	                     * (skb->ifindex); a replacement pod has a new veth, so its bytes never
	                     * share an entry with its address's previous holder (docs/datapath.md,
	                     * "The veth in the key"); cgroup_skb: the low 32 bits of the pod's
	                     * cgroup id (cgroup.c zm_cg_hook_id), ordered the same way */
	__u32 reserved_44;  /* 44: always 0 */
};
ZM_ASSERT_SIZE(zm_flow_key, 48);
ZM_ASSERT_OFFSET(zm_flow_key, local, 0);
ZM_ASSERT_OFFSET(zm_flow_key, remote, 16);
ZM_ASSERT_OFFSET(zm_flow_key, port, 32);
ZM_ASSERT_OFFSET(zm_flow_key, local_port, 34);
ZM_ASSERT_OFFSET(zm_flow_key, proto, 36);
ZM_ASSERT_OFFSET(zm_flow_key, kind, 37);
ZM_ASSERT_OFFSET(zm_flow_key, family, 38);
ZM_ASSERT_OFFSET(zm_flow_key, overflow, 39);
ZM_ASSERT_OFFSET(zm_flow_key, ifindex, 40);
ZM_ASSERT_OFFSET(zm_flow_key, reserved_44, 44);

/* Value of a flow entry: host byte order, updated with atomic adds. 16 bytes. */
struct zm_flow_value {
	__u64 bytes;   /* 0: L3 bytes (IP header included) as on the wire, GSO segments expanded */
	__u64 packets; /* 8: packets as on the wire (a GSO packet counts gso_segs) */
};
ZM_ASSERT_SIZE(zm_flow_value, 16);
ZM_ASSERT_OFFSET(zm_flow_value, bytes, 0);
ZM_ASSERT_OFFSET(zm_flow_value, packets, 8);

/* One slot of the per-CPU flow cache (zm_cache_a/b): the last flow this CPU counted whose
 * key hashed to the slot, and what it counted since the flow entered the slot and that
 * is not in the flow table yet. 64 bytes, no implicit padding (key at 0, 48 bytes; the
 * counters 8-aligned at 48 and 56). packets == 0: the slot holds nothing. */
struct zm_cache_slot {
	struct zm_flow_key key; /* 0:  as in the flow table */
	__u64 bytes;            /* 48: host order, as zm_flow_value.bytes */
	__u64 packets;          /* 56: host order, as zm_flow_value.packets */
};
ZM_ASSERT_SIZE(zm_cache_slot, 64);
ZM_ASSERT_OFFSET(zm_cache_slot, key, 0);
ZM_ASSERT_OFFSET(zm_cache_slot, bytes, 48);
ZM_ASSERT_OFFSET(zm_cache_slot, packets, 56);

/* Key of the local endpoint map: a Service endpoint on this node. 20 bytes. */
struct zm_endpoint_key {
	__u8 addr[16];    /* 0:  endpoint address, network order, IPv4 as ::ffff:a.b.c.d */
	__be16 port;      /* 16: endpoint (target) port, network order */
	__u8 proto;       /* 18: IP protocol number */
	__u8 reserved_19; /* 19: always 0 */
};
ZM_ASSERT_SIZE(zm_endpoint_key, 20);
ZM_ASSERT_OFFSET(zm_endpoint_key, addr, 0);
ZM_ASSERT_OFFSET(zm_endpoint_key, port, 16);
ZM_ASSERT_OFFSET(zm_endpoint_key, proto, 18);
ZM_ASSERT_OFFSET(zm_endpoint_key, reserved_19, 19);

#endif /* ZONEMETER_H */
