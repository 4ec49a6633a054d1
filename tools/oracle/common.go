package main

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/kubernetes/pkg/proxy"
)

type proxyEP = proxy.Endpoint

func ctxTODO() context.Context { return context.TODO() }

func portKey(name, protocol string) string { return fmt.Sprintf("%s/%s", name, protocol) }

// proxyServicePorts runs the Service through kube-proxy's ServiceChangeTracker and
// ServicePortMap.Update, as the proxiers do on a Service event, and returns the ServicePorts
// by "portName/protocol" (empty when kube-proxy skips the Service).
func proxyServicePorts(family corev1.IPFamily, svc *corev1.Service) map[string]proxy.ServicePort {
	sct := newServiceTracker(family)
	sct.Update(nil, svc)
	sm := proxy.ServicePortMap{}
	sm.Update(sct)
	out := map[string]proxy.ServicePort{}
	for spn, sp := range sm {
		out[portKey(spn.Port, string(spn.Protocol))] = sp
	}
	return out
}

// proxyEndpoints feeds every slice to kube-proxy's EndpointsChangeTracker (as the proxiers do
// on EndpointSlice events; the tracker ignores slices of the other family) for a kube-proxy on
// node, and returns the EndpointsMap entries by "portName/protocol".
func proxyEndpoints(family corev1.IPFamily, node string, slices []*discovery.EndpointSlice) map[string][]proxy.Endpoint {
	ect := newEndpointsTracker(family, node)
	for _, s := range slices {
		ect.EndpointSliceUpdate(s.DeepCopy(), false)
	}
	em := proxy.EndpointsMap{}
	em.Update(ect)
	out := map[string][]proxy.Endpoint{}
	for spn, eps := range em {
		out[portKey(spn.Port, string(spn.Protocol))] = eps
	}
	return out
}
