//go:build k8s_lt_1_33

// kube-proxy constructors and CategorizeEndpoints before 1.33: the trackers take
// (hostname, makeEndpointInfo, ipFamily, recorder, ...) and CategorizeEndpoints takes the node
// labels only (locality comes from the tracker's hostname). pkg/proxy endpointschangetracker.go,
// servicechangetracker.go, topology.go of 1.31/1.32.
package main

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/kubernetes/pkg/proxy"
)

func newServiceTracker(family corev1.IPFamily) *proxy.ServiceChangeTracker {
	return proxy.NewServiceChangeTracker(nil, family, nil, nil)
}

func newEndpointsTracker(family corev1.IPFamily, node string) *proxy.EndpointsChangeTracker {
	return proxy.NewEndpointsChangeTracker(node, nil, family, nil, nil)
}

func categorize(eps []proxy.Endpoint, sp proxy.ServicePort, _ string, nodeLabels map[string]string) ([]proxy.Endpoint, []proxy.Endpoint, []proxy.Endpoint, bool) {
	return proxy.CategorizeEndpoints(eps, sp, nodeLabels)
}

// nodeHints: kube-proxy before 1.33 has no node hints (Endpoint has no NodeHints method).
func nodeHints(proxy.Endpoint) []string { return nil }
