//go:build !k8s_lt_1_36

// kube-controller-manager's wiring of the reconciler from 1.36
// (pkg/controller/endpointslice endpointslice_controller.go NewController): the
// TopologyAwareHints and ServiceTrafficDistribution gates are gone, the topology cache always
// exists, and only PreferSameTrafficDistribution is passed to the reconciler.
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
	return topologycache.NewTopologyCache()
}

func newReconciler(client clientset.Interface, nodes corelisters.NodeLister, maxEPS int32, tracker *endpointsliceutil.EndpointSliceTracker, tc *topologycache.TopologyCache, rec record.EventRecorder) *endpointslicerec.Reconciler {
	return endpointslicerec.NewReconciler(client, nodes, maxEPS, tracker, tc, rec, controllerName,
		endpointslicerec.WithPreferSameTrafficDistributionEnabled(utilfeature.DefaultFeatureGate.Enabled(features.PreferSameTrafficDistribution)))
}
