//go:build !k8s_lt_1_33

// kube-proxy constructors and CategorizeEndpoints as of 1.33 (pkg/proxy
// endpointschangetracker.go, servicechangetracker.go, topology.go).
package main

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/kubernetes/pkg/proxy"
)

func newServiceTracker(family corev1.IPFamily) *proxy.ServiceChangeTracker {
	return proxy.NewServiceChangeTracker(family, nil, nil)
}

func newEndpointsTracker(family corev1.IPFamily, node string) *proxy.EndpointsChangeTracker {
	return proxy.NewEndpointsChangeTracker(family, node, nil, nil)
}

func categorize(eps []proxy.Endpoint, sp proxy.ServicePort, node string, nodeLabels map[string]string) ([]proxy.Endpoint, []proxy.Endpoint, []proxy.Endpoint, bool) {
	return proxy.CategorizeEndpoints(eps, sp, node, nodeLabels)
}

// nodeHints: the endpoint's node hints as kube-proxy stored them (read only with the
// PreferSameTrafficDistribution gate, endpointslicecache.go addEndpoints).
func nodeHints(e proxy.Endpoint) []string { return sortedSet(e.NodeHints()) }
