/* SPDX-License-Identifier: Apache-2.0 */
/*
 * account.h - add a classified packet's bytes and packets to the per-CPU flow cache and
 * the active flow table (docs/datapath.md, "Counting").
 *
 * Hook independent. BCC rewrites map method calls (map.lookup()) only in the main
 * source file, never in included headers; each program file therefore defines these
 * accessors before including this header (tc.c and cgroup.c do):
 *   static __always_inline struct zm_flow_value *zm_lost_counter(void);
 *       the zm_lost counter (index 0), or NULL
 *   static __always_inline void *zm_active_cache(void);
 *       the active per-CPU flow cache (zm_cache_active's map), or NULL when none is set
 * Flow tables are reached through the map pointer the caller passes (what
 * zm_active_flows() returned), with the plain bpf_map_*_elem helpers, which need no
 * rewriting.
 */
#ifndef ZONEMETER_ACCOUNT_H
#define ZONEMETER_ACCOUNT_H

#include <uapi/linux/bpf.h>
#include "zonemeter.h"

/* Adds bytes/packets to *v with atomic adds (several CPUs may hit one flow). Returns
 * nothing. */
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

/* Adds bytes/packets to zm_lost (no flow table is active). Returns nothing. */
static __always_inline void zm_account_lost(__u64 bytes, __u64 packets)
{
	struct zm_flow_value *lost = zm_lost_counter();
	if (lost)
		zm_add_value(lost, bytes, packets);
}

/* Returns 1 when the two flow keys are equal (both 8-byte aligned: six 64-bit words),
 * else 0. */
static __always_inline int zm_key_eq(const struct zm_flow_key *a, const struct zm_flow_key *b)
{
	const __u64 *x = (const __u64 *)a, *y = (const __u64 *)b;
	return x[0] == y[0] && x[1] == y[1] && x[2] == y[2] && x[3] == y[3] && x[4] == y[4] &&
	       x[5] == y[5];
}

/* Where a key stands in its set of this CPU's flow cache (zm_cache_probe). */
struct zm_cache_probe {
	struct zm_cache_slot *hit;   /* the slot holding the key, or NULL */
	struct zm_cache_slot *empty; /* the first empty slot of the set, or NULL */
};

/* Looks key up in its set of cache (this CPU's slots of the active per-CPU flow cache; NULL:
 * none is active) and fills *pr. The set is chosen by a multiplicative hash of the key's
 * six 64-bit words. A slot keeps the first flow that took it until the agent empties the
 * cache (after a switch: docs/datapath.md, "Per-CPU flow cache"), so the slots of a set
 * fill from way 0 on and the first empty way ends the search. Returns nothing. */
static __always_inline void zm_cache_probe(void *cache, const struct zm_flow_key *key,
					   struct zm_cache_probe *pr)
{
	const __u64 *w = (const __u64 *)key;
	__u64 h = (w[0] ^ w[1] ^ w[2] ^ w[3] ^ w[4] ^ w[5]) * 0x9E3779B97F4A7C15ULL;
	__u32 base = ((__u32)(h >> 32) & (ZM_CACHE_SETS - 1)) * ZM_CACHE_WAYS;
	pr->hit = NULL;
	pr->empty = NULL;
	if (!cache)
		return;
#pragma unroll
	for (int i = 0; i < ZM_CACHE_WAYS; i++) {
		__u32 idx = base + i;
		struct zm_cache_slot *s = bpf_map_lookup_elem(cache, &idx);
		if (!s)
			return;
		if (!s->packets) {
			pr->empty = s;
			return;
		}
		if (zm_key_eq(&s->key, key)) {
			pr->hit = s;
			return;
		}
	}
}

/* Adds bytes/packets to a cache slot of this CPU (plain adds: a slot belongs to one CPU
 * and tc programs do not nest on a CPU; not for PREEMPT_RT kernels, where BPF programs
 * can be preempted). Returns nothing. */
static __always_inline void zm_cache_add(struct zm_cache_slot *s, __u64 bytes, __u64 packets)
{
	s->bytes += bytes;
	s->packets += packets;
}

/* Counts a packet whose key pr found in no slot of its set: the set's first empty slot
 * takes the key; when the set is full the packet goes to the flow table (into v, the key's
 * entry, when the caller already looked it up; else zm_account) and the set keeps its
 * flows. Evicting a slot's flow instead would cost a second flow-table operation (moving
 * its counts) on every such packet: at many flows two colliding flows would evict each
 * other on every packet (BENCHMARKS.md, "Many flows"). Returns nothing. */
static __always_inline void zm_count_miss(void *flows, struct zm_cache_probe *pr,
					  struct zm_flow_key *key, struct zm_flow_value *v,
					  __u64 bytes, __u64 packets)
{
	struct zm_cache_slot *s = pr->empty;
	if (s) {
		__builtin_memcpy(&s->key, key, sizeof(*key));
		s->bytes = bytes;
		s->packets = packets;
		return;
	}
	if (v)
		zm_add_value(v, bytes, packets);
	else
		zm_account(flows, key, bytes, packets);
}

#endif /* ZONEMETER_ACCOUNT_H */
