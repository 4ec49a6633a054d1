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
 *   static __always_inline struct zm_cache_slot *zm_cache_slot_at(__u32 idx);
 *       this CPU's slot idx of the active flow cache, or NULL when none is active
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

/* Returns this CPU's cache slot for key (a multiplicative hash of its six words), or
 * NULL when no cache is active. */
static __always_inline struct zm_cache_slot *zm_cache_slot_for(const struct zm_flow_key *key)
{
	const __u64 *w = (const __u64 *)key;
	__u64 h = (w[0] ^ w[1] ^ w[2] ^ w[3] ^ w[4] ^ w[5]) * 0x9E3779B97F4A7C15ULL;
	return zm_cache_slot_at((__u32)(h >> 32) & (ZM_CACHE_SLOTS - 1));
}

/* Adds bytes/packets in place when slot (may be NULL) holds key. Returns 1 when counted
 * there, 0 when the slot holds another flow or there is no slot. */
static __always_inline int zm_count_cached(struct zm_cache_slot *slot,
					   const struct zm_flow_key *key, __u64 bytes,
					   __u64 packets)
{
	if (!slot || !zm_key_eq(&slot->key, key))
		return 0;
	slot->bytes += bytes;
	slot->packets += packets;
	return 1;
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
	if (zm_count_cached(slot, key, bytes, packets))
		return;
	if (slot->packets)
		zm_account(flows, &slot->key, slot->bytes, slot->packets);
	__builtin_memcpy(&slot->key, key, sizeof(*key));
	slot->bytes = bytes;
	slot->packets = packets;
}

#endif /* ZONEMETER_ACCOUNT_H */
