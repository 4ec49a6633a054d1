/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bypass.c - the lab's "bpf-host-routing" data plane, a lab component like the kube-proxy
 * emulation (tools/lab/bypass.py; docs/lab.md). Not zonemeter's datapath: it moves and
 * rewrites lab packets the way Cilium's BPF host routing and socket-LB do, so that no
 * host-veth filter and no host netfilter sees pod traffic.
 *
 *   lab_from_pod     TCX ingress of a host-side pod veth: to a pod of this node
 *                    bpf_redirect_peer (straight into the pod's namespace: the destination
 *                    host veth's egress never runs), to a pod of another node
 *                    bpf_redirect_neigh on the uplink (the host's routing, no netfilter)
 *   lab_from_uplink  TCX ingress of the node uplink: to a pod of this node, redirect_peer
 *   lab_connect4/6, lab_sendmsg4/6  cgroup sock_addr: a ClusterIP:port dialled from a
 *                    lab namespace becomes one of the backends that namespace's node would
 *                    pick (random), so no DNAT happens anywhere
 *   lab_recvmsg4/6, lab_getpeername4/6  the reverse for UDP replies and getpeername()
 * Everything is keyed by lab addresses or by the network namespace cookie of lab
 * namespaces, so other sockets of the machine are never touched.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>

#define LAB_NEXT -1  /* TCX_NEXT */

/* bpf_redirect_neigh with its 5.10+ signature (BCC's built-in declaration is older) */
static long (*lab_redirect_neigh)(__u32 ifindex, void *params, int plen, __u64 flags) =
	(void *)BPF_FUNC_redirect_neigh;
#define LAB_BACKENDS 8

struct lab_addr {
	__u8 a[16]; /* network order, IPv4 as ::ffff:a.b.c.d */
};

/* pod address -> ifindex of its host-side veth (pods of this node) */
BPF_HASH(local_pods, struct lab_addr, __u32, 1024);
/* pod address -> ifindex of the uplink (pods of other nodes) */
BPF_HASH(remote_pods, struct lab_addr, __u32, 1024);

struct lb_key {
	__u64 cookie;   /* netns cookie of the client's namespace */
	__u8 vip[16];
	__u16 port;     /* network order */
	__u8 proto;
	__u8 pad[5];
};
struct lb_backend {
	__u8 a[16];
	__u16 port;     /* network order */
	__u16 pad[3];
};
struct lb_val {
	__u32 n;
	__u32 pad;
	struct lb_backend be[LAB_BACKENDS];
};
/* (client netns, ClusterIP, port, proto) -> the backends that node picks from */
BPF_HASH(lb, struct lb_key, struct lb_val, 1024);
/* (client netns, backend, port, proto) -> ClusterIP, port: the reverse translation */
BPF_HASH(lb_rev, struct lb_key, struct lb_backend, 4096);

static __always_inline int lab_dst(struct __sk_buff *skb, struct lab_addr *k)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	__builtin_memset(k, 0, sizeof(*k));
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = data + ETH_HLEN;
		if ((void *)(ip + 1) > end)
			return -1;
		k->a[10] = 0xff;
		k->a[11] = 0xff;
		__builtin_memcpy(k->a + 12, &ip->daddr, 4);
		return 0;
	}
	if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = data + ETH_HLEN;
		if ((void *)(ip6 + 1) > end)
			return -1;
		__builtin_memcpy(k->a, &ip6->daddr, 16);
		return 0;
	}
	return -1;
}

int lab_from_pod(struct __sk_buff *skb)
{
	struct lab_addr k;
	if (lab_dst(skb, &k) < 0)
		return LAB_NEXT;
	__u32 *ifindex = local_pods.lookup(&k);
	if (ifindex)
		return bpf_redirect_peer(*ifindex, 0);
	ifindex = remote_pods.lookup(&k);
	if (ifindex)
		return lab_redirect_neigh(*ifindex, NULL, 0, 0);
	return LAB_NEXT;
}

int lab_from_uplink(struct __sk_buff *skb)
{
	struct lab_addr k;
	if (lab_dst(skb, &k) < 0)
		return LAB_NEXT;
	__u32 *ifindex = local_pods.lookup(&k);
	if (ifindex)
		return bpf_redirect_peer(*ifindex, 0);
	return LAB_NEXT;
}

/* Fills k with ctx's address, port and protocol in this netns (IPv4 as ::ffff:a.b.c.d). */
static __always_inline void lab_key4(struct bpf_sock_addr *ctx, struct lb_key *k)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->cookie = bpf_get_netns_cookie(ctx);
	k->vip[10] = 0xff;
	k->vip[11] = 0xff;
	__u32 ip = ctx->user_ip4;
	__builtin_memcpy(k->vip + 12, &ip, 4);
	k->port = (__u16)ctx->user_port;
	k->proto = ctx->protocol;
}

/* The same for IPv6 (user_ip6 is read one 32-bit word at a time, as the verifier requires). */
static __always_inline void lab_key6(struct bpf_sock_addr *ctx, struct lb_key *k)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->cookie = bpf_get_netns_cookie(ctx);
	__u32 w0 = ctx->user_ip6[0], w1 = ctx->user_ip6[1], w2 = ctx->user_ip6[2],
	      w3 = ctx->user_ip6[3];
	__builtin_memcpy(k->vip, &w0, 4);
	__builtin_memcpy(k->vip + 4, &w1, 4);
	__builtin_memcpy(k->vip + 8, &w2, 4);
	__builtin_memcpy(k->vip + 12, &w3, 4);
	k->port = (__u16)ctx->user_port;
	k->proto = ctx->protocol;
}

/* Sets ctx's IPv4 address to the last 4 bytes of a (16 bytes) and its port to port. */
static __always_inline void lab_set4(struct bpf_sock_addr *ctx, const __u8 *a, __u32 port)
{
	__u32 ip;
	__builtin_memcpy(&ip, a + 12, 4);
	ctx->user_ip4 = ip;
	ctx->user_port = port;
}

/* Sets ctx's IPv6 address to a (16 bytes, written one 32-bit word at a time) and its port. */
static __always_inline void lab_set6(struct bpf_sock_addr *ctx, const __u8 *a, __u32 port)
{
	__u32 x;
	__builtin_memcpy(&x, a, 4);
	ctx->user_ip6[0] = x;
	__builtin_memcpy(&x, a + 4, 4);
	ctx->user_ip6[1] = x;
	__builtin_memcpy(&x, a + 8, 4);
	ctx->user_ip6[2] = x;
	__builtin_memcpy(&x, a + 12, 4);
	ctx->user_ip6[3] = x;
	ctx->user_port = port;
}

/* Rewrites the destination of ctx to a random backend when it is a ClusterIP; six selects
 * the address family. */
static __always_inline void lab_pick(struct bpf_sock_addr *ctx, int six)
{
	struct lb_key k;
	if (six)
		lab_key6(ctx, &k);
	else
		lab_key4(ctx, &k);
	struct lb_val *v = lb.lookup(&k);
	if (!v || !v->n)
		return;
	__u32 i = bpf_get_prandom_u32() % v->n;
	if (i >= LAB_BACKENDS)
		return;
	if (six)
		lab_set6(ctx, v->be[i].a, v->be[i].port);
	else
		lab_set4(ctx, v->be[i].a, v->be[i].port);
}

/* The reverse: a backend source becomes the ClusterIP the socket dialled. */
static __always_inline void lab_unpick(struct bpf_sock_addr *ctx, int six)
{
	struct lb_key k;
	if (six)
		lab_key6(ctx, &k);
	else
		lab_key4(ctx, &k);
	struct lb_backend *r = lb_rev.lookup(&k);
	if (!r)
		return;
	if (six)
		lab_set6(ctx, r->a, r->port);
	else
		lab_set4(ctx, r->a, r->port);
}

int lab_connect4(struct bpf_sock_addr *ctx) { lab_pick(ctx, 0); return 1; }
int lab_connect6(struct bpf_sock_addr *ctx) { lab_pick(ctx, 1); return 1; }
int lab_sendmsg4(struct bpf_sock_addr *ctx) { lab_pick(ctx, 0); return 1; }
int lab_sendmsg6(struct bpf_sock_addr *ctx) { lab_pick(ctx, 1); return 1; }
int lab_recvmsg4(struct bpf_sock_addr *ctx) { lab_unpick(ctx, 0); return 1; }
int lab_recvmsg6(struct bpf_sock_addr *ctx) { lab_unpick(ctx, 1); return 1; }
int lab_getpeername4(struct bpf_sock_addr *ctx) { lab_unpick(ctx, 0); return 1; }
int lab_getpeername6(struct bpf_sock_addr *ctx) { lab_unpick(ctx, 1); return 1; }
