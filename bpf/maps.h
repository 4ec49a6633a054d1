/* SPDX-License-Identifier: Apache-2.0 */
/*
 * maps.h - the maps of the zonemeter programs (BCC declarations), in one place.
 * Sizes come from the -D options documented in zonemeter.h.
 *
 * With -DZM_PIN_DIR="/sys/fs/bpf/..." every map is pinned in that directory under its
 * own name (BCC's BPF_TABLE_PINNED: an existing pin is opened and reused, a missing one
 * is created and pinned), so a restarted agent finds the counts the kernel kept adding
 * while it was down. Without it, maps live as long as the agent's programs.
 */
#ifndef ZONEMETER_MAPS_H
#define ZONEMETER_MAPS_H

#include "zonemeter.h"

#ifdef ZM_PIN_DIR
#define ZM_MAP(type, key, leaf, name, entries) \
	BPF_TABLE_PINNED(type, key, leaf, name, entries, ZM_PIN_DIR "/" #name)
#else
#define ZM_MAP(type, key, leaf, name, entries) BPF_TABLE(type, key, leaf, name, entries)
#endif

/* Two flow tables with the same definition. zm_active (an array-of-maps with one slot)
 * points at the one the programs write to; the agent points it at the other one before
 * draining. Updating an array-of-maps waits for running programs (synchronize_rcu in
 * the bpf() syscall), so the table being drained receives no increment any more:
 * nothing can land between read and delete. */
ZM_MAP("hash", struct zm_flow_key, struct zm_flow_value, zm_flows_a,
       ZM_FLOW_CAPACITY + ZM_OVERFLOW_SLOTS);
ZM_MAP("hash", struct zm_flow_key, struct zm_flow_value, zm_flows_b,
       ZM_FLOW_CAPACITY + ZM_OVERFLOW_SLOTS);
ZM_MAP("array_of_maps$zm_flows_a", int, int, zm_active, 1);

/* Per-CPU flow caches, one per flow table, switched by the agent like the tables
 * (zm_cache_active and zm_active updated at the same time from two threads; each update
 * waits for running programs, both for the same grace period). A packet whose
 * flow sits in its CPU's slot is counted there without the flow-table hash lookup; a
 * packet of another flow moves the slot's counts into the active flow table and takes
 * the slot. After both switches the agent folds the idle cache into the idle table
 * before reading it, so nothing is lost or counted twice (docs/datapath.md). */
ZM_MAP("percpu_array", int, struct zm_cache_slot, zm_cache_a, ZM_CACHE_SLOTS);
ZM_MAP("percpu_array", int, struct zm_cache_slot, zm_cache_b, ZM_CACHE_SLOTS);
ZM_MAP("array_of_maps$zm_cache_a", int, int, zm_cache_active, 1);

/* Local endpoints, written by the agent (value: 1). */
ZM_MAP("hash", struct zm_endpoint_key, __u32, zm_endpoints, ZM_ENDPOINT_CAPACITY);

/* Index: a port in host byte order; value: ZM_PORT_ENDPOINT when some local endpoint uses
 * that port, | ZM_PORT_SERVICE when some Service in the cluster does (zonemeter.h), else
 * 0. Written by the agent with zm_endpoints. An array lookup is inlined by the verifier,
 * so the hash lookup in zm_endpoints is skipped for the side of a packet whose port no
 * endpoint uses (the client's ephemeral port): one hash lookup fewer per packet. */
ZM_MAP("array", int, __u32, zm_endpoint_ports, 65536);

/* Entry addresses of this node, written by the agent (value: 1): (node address, nodePort,
 * protocol), (LoadBalancer ingress IP or externalIP, port, protocol) of every Service with
 * externalTrafficPolicy Cluster. The uplink programs count the first hop of a node port to
 * and from them (uplink.h). Pinned, but added after layout 3 without changing any other
 * map: an agent that finds the other pins without these creates them (pins.py). */
ZM_MAP("hash", struct zm_endpoint_key, __u32, zm_entries, ZM_ENDPOINT_CAPACITY);

/* Index: a port in host byte order; value 1 when some entry of zm_entries uses that port,
 * else 0 (as zm_endpoint_ports for zm_endpoints): every other packet of an uplink costs
 * this inlined array lookup and no hash. */
ZM_MAP("array", int, __u32, zm_entry_ports, 65536);

/* Index: a port in host byte order; value 1 once a TCP SYN-ACK left a local pod from that
 * port (the pod accepts connections there), else 0. Written by the programs only
 * (classify.h, zm_local_port), never cleared: the ports local pods serve on, whether or
 * not the agent knows of an endpoint there yet. */
ZM_MAP("array", int, __u32, zm_server_ports, 65536);

/* The side that sent the first packet the programs saw of a local pod's 5-tuple of a
 * protocol with ports but no handshake they read (UDP and SCTP: parse.h reads the ports
 * of TCP, UDP and SCTP), and the TCP connections a local pod dialled to a port inside the
 * ephemeral range that is no Service port (ZM_ORIGIN_LOCAL, from the SYN leaving it).
 * Key: a zm_flow_key with the key's addresses, protocol, family and ifindex, kind 0,
 * port = the remote port and local_port = the local pod's, both as on the wire (never
 * zeroed by the ephemeral range); value: ZM_ORIGIN_LOCAL or ZM_ORIGIN_REMOTE
 * (zonemeter.h). Written by the programs only (classify.h, zm_origin), never by the
 * agent: it tells the server's port of a UDP exchange whatever the ports and whether or
 * not the agent knows of a Service there yet (not asked for an exchange between two
 * unmarked ephemeral-range ports, or one and a fixed port (outside the range, >= 1024),
 * which keep both: zm_unmarked_ephemeral, zm_unmarked_to_fixed, classify.h).
 * LRU, ZM_ORIGIN_CAPACITY entries. Pinned, but added after layout 3 without changing any
 * other map: an agent that finds the other pins without it creates it (pins.py). */
ZM_MAP("lru_hash", struct zm_flow_key, __u32, zm_origins, ZM_ORIGIN_CAPACITY);

/* Packets that found neither a flow entry nor an overflow entry (the agent did not seed
 * the overflow entries, or no table is active). Index 0; should stay zero, reported.
 * Cumulative since the map was created (with pinning: since the pins were created). */
ZM_MAP("array", int, struct zm_flow_value, zm_lost, 1);

/* Index 0: ZM_LAYOUT_VERSION, written by the agent once the maps exist. Not used by the
 * programs; it tells a restarted agent whether pinned maps have the layout it expects. */
ZM_MAP("array", int, __u32, zm_layout, 1);

/* The hand-over marker between agents (docs/datapath.md, "Exactly once across a crash").
 * Index 0: a random non-zero id of this set of pins, written by the agent that created
 * them; index 1 + i: the generation of flow table i (zm_flows_a, zm_flows_b) together
 * with flow cache i, bumped by the agent each time it has emptied them. The agent's
 * checkpoint file records, per table, the generation whose contents its totals include:
 * an idle table whose generation equals the checkpoint's was already counted and is
 * only emptied, any other idle table is counted once more. Not used by the programs. */
ZM_MAP("array", int, __u64, zm_epoch, 3);

/* Index 0, per CPU: the hook (ifindex * 2 + direction + 1) whose TCX program of ours
 * last ran on this CPU, cleared by the clsact program of ours on the same hook, which
 * then counts nothing: on a device switching between clsact and TCX (an agent upgrade)
 * both of our programs run for a moment, and each packet must be counted once. The two
 * run back to back for one packet on one CPU (sch_handle_ingress/sch_handle_egress in
 * net/core/dev.c: TCX first, then legacy tc when TCX returned TCX_NEXT; softirqs off),
 * so the mark never meets another packet's clsact run (docs/datapath.md, "Switching
 * between clsact and TCX"). Not pinned: it only pairs programs of one agent. */
BPF_PERCPU_ARRAY(zm_tcx_ran, __u32, 1);

/* Never read by the programs: the agent writes its slot 0 (with zm_tcx_ran) to wait for
 * a grace period. A bpf() update of an array-of-maps returns only after every program
 * running at that moment finished (maybe_wait_bpf_programs in kernel/bpf/syscall.c),
 * which a TCX link update does not wait for (tcx_link_update in kernel/bpf/tcx.c). */
BPF_TABLE("array_of_maps$zm_tcx_ran", int, int, zm_grace, 1);

#endif /* ZONEMETER_MAPS_H */
