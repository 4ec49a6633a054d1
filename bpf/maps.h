/* SPDX-License-Identifier: Apache-2.0 */
/*
 * maps.h - the maps of the zonemeter programs (BCC declarations), in one place.
 * Sizes come from the -D options documented in zonemeter.h.
 */
#ifndef ZONEMETER_MAPS_H
#define ZONEMETER_MAPS_H

#include "zonemeter.h"

/* Two flow tables with the same definition. zm_active (an array-of-maps with one slot)
 * points at the one the programs write to; the agent points it at the other one before
 * draining. Updating an array-of-maps waits for running programs (synchronize_rcu in
 * the bpf() syscall), so the table being drained receives no increment any more:
 * nothing can land between read and delete. */
BPF_HASH(zm_flows_a, struct zm_flow_key, struct zm_flow_value, ZM_FLOW_CAPACITY + ZM_OVERFLOW_SLOTS);
BPF_HASH(zm_flows_b, struct zm_flow_key, struct zm_flow_value, ZM_FLOW_CAPACITY + ZM_OVERFLOW_SLOTS);
BPF_ARRAY_OF_MAPS(zm_active, "zm_flows_a", 1);

/* Local endpoints, written by the agent (value: 1). */
BPF_HASH(zm_endpoints, struct zm_endpoint_key, __u32, ZM_ENDPOINT_CAPACITY);

/* Index: a port in host byte order; value 1 when some local endpoint uses that port, else
 * 0. Written by the agent with zm_endpoints. An array lookup is inlined by the verifier,
 * so the hash lookup in zm_endpoints is skipped for the side of a packet whose port no
 * endpoint uses (the client's ephemeral port): one hash lookup fewer per packet. */
BPF_ARRAY(zm_endpoint_ports, __u32, 65536);

/* Packets that found neither a flow entry nor an overflow entry (the agent did not seed
 * the overflow entries, or no table is active). Index 0; should stay zero, reported. */
BPF_ARRAY(zm_lost, struct zm_flow_value, 1);

#endif /* ZONEMETER_MAPS_H */
