//go:build k8s_lt_1_33

// kube-controller-manager's wiring of the reconciler in 1.31/1.32
// (pkg/controller/endpointslice endpointslice_controller.go NewController): the topology cache
// exists only with the TopologyAwareHints gate; trafficDistribution is honoured with the
// ServiceTrafficDistribution gate.
package main

import (
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	clientset "k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/record"
	endpointslicerec "k8s.io/endpointslice"
	"k8s.io/endpointslice/topologycache"
	endpointsliceutil "k8s.io/endpointslice/util"
	"k8s.io/kubernetes/pkg/features"
)

func newTopologyCache() *topologycache.TopologyCache {
	if utilfeature.DefaultFeatureGate.Enabled(features.TopologyAwareHints) {
		return topologycache.NewTopologyCache()
	}
	return nil
}

func newReconciler(client clientset.Interface, nodes corelisters.NodeLister, maxEPS int32, tracker *endpointsliceutil.EndpointSliceTracker, tc *topologycache.TopologyCache, rec record.EventRecorder) *endpointslicerec.Reconciler {
	return endpointslicerec.NewReconciler(client, nodes, maxEPS, tracker, tc, rec, controllerName,
		endpointslicerec.WithTrafficDistributionEnabled(utilfeature.DefaultFeatureGate.Enabled(features.ServiceTrafficDistribution)))
}
