// Command oracle answers "what does upstream Kubernetes do" for topology-aware routing.
//
// It reads one JSON request per line on stdin and writes one JSON answer per line on stdout
// (README.md in this directory has the format). Every decision is made by upstream code,
// built per Kubernetes release by build.sh:
//
//   - the EndpointSlice controller's reconciler (k8s.io/endpointslice NewReconciler and
//     Reconcile) with a fake clientset (k8s.io/client-go/kubernetes/fake), a fake event
//     recorder (k8s.io/client-go/tools/record) and a TopologyCache fed with the Nodes;
//   - kube-proxy's endpoint tracking and selection (k8s.io/kubernetes/pkg/proxy:
//     ServiceChangeTracker, EndpointsChangeTracker / EndpointSliceCache, CategorizeEndpoints).
//
// What this file adds is only the wiring that kube-controller-manager and kube-proxy do
// around those calls (each piece cites where upstream does it) and JSON conversion. The
// per-version differences in constructor signatures live in the build-tagged files
// controller_*.go and proxy_*.go.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"runtime/debug"
	"sort"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/component-base/featuregate"
	"k8s.io/endpointslice/topologycache"
	endpointsliceutil "k8s.io/endpointslice/util"
	"k8s.io/klog/v2"
	_ "k8s.io/kubernetes/pkg/features" // registers kube's gates in utilfeature.DefaultMutableFeatureGate
)

// controllerName is kube-controller-manager's EndpointSlice controller name
// (pkg/controller/endpointslice ControllerName).
const controllerName = "endpointslice-controller.k8s.io"

// reportedGates are echoed in every answer (when this release knows them).
var reportedGates = []string{"TopologyAwareHints", "ServiceTrafficDistribution", "PreferSameTrafficDistribution"}

// ---------------------------------------------------------------------------------------
// Request and answer

type nodeInput struct {
	Name           string            `json:"name"`
	Labels         map[string]string `json:"labels"`
	AllocatableCPU *string           `json:"allocatable_cpu"`
	// Ready: true, false, "Unknown", or null/absent (no Ready condition).
	Ready any `json:"ready"`
}

type cacheState struct {
	// Populated: the cache marks the Service as having hints (SetHints was called before).
	Populated       bool           `json:"populated"`
	EndpointsByZone map[string]int `json:"endpoints_by_zone"`
}

type addHintsInput struct {
	ToCreate  []*discovery.EndpointSlice `json:"to_create"`
	ToUpdate  []*discovery.EndpointSlice `json:"to_update"`
	Unchanged []*discovery.EndpointSlice `json:"unchanged"`
}

type request struct {
	ID                   any                        `json:"id"`
	AddressType          string                     `json:"address_type"`
	FeatureGates         map[string]bool            `json:"feature_gates"`
	Nodes                []json.RawMessage          `json:"nodes"`
	Service              *corev1.Service            `json:"service"`
	Pods                 []*corev1.Pod              `json:"pods"`
	EndpointSlices       []*discovery.EndpointSlice `json:"endpoint_slices"`
	Controller           *bool                      `json:"controller"`
	TopologyCache        map[string]cacheState      `json:"topology_cache"`
	MaxEndpointsPerSlice int32                      `json:"max_endpoints_per_slice"`
	ProxyNodes           any                        `json:"proxy_nodes"`
	ProxySlices          string                     `json:"proxy_slices"`
	AddHints             *addHintsInput             `json:"add_hints"`
	Trials               int                        `json:"trials"`
	EchoPods             bool                       `json:"echo_pods"`
	OwnerRefs            string                     `json:"owner_refs"`
}

type event struct {
	Type    string `json:"type"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

type action struct {
	Verb string `json:"verb"`
	Name string `json:"name"`
}

type endpointHints struct {
	Slice     string                   `json:"slice"`
	Addresses []string                 `json:"addresses"`
	Pod       string                   `json:"pod,omitempty"`
	Node      *string                  `json:"node"`
	Zone      *string                  `json:"zone"`
	Ready     *bool                    `json:"ready"`
	Hints     *discovery.EndpointHints `json:"hints"`
}

type controllerAnswer struct {
	Skipped       string                     `json:"skipped,omitempty"`
	TopologyCache bool                       `json:"topology_cache"`
	Error         *string                    `json:"error"`
	Events        []event                    `json:"events"`
	Actions       []action                   `json:"actions"`
	Slices        []*discovery.EndpointSlice `json:"slices"`
	Endpoints     []endpointHints            `json:"endpoints"`
	Pods          []*corev1.Pod              `json:"pods,omitempty"`
}

type proxyEndpoint struct {
	Endpoint    string   `json:"endpoint"`
	Local       bool     `json:"local"`
	Ready       bool     `json:"ready"`
	Serving     bool     `json:"serving"`
	Terminating bool     `json:"terminating"`
	ZoneHints   []string `json:"zone_hints"`
	NodeHints   []string `json:"node_hints"`
}

type proxyPortAnswer struct {
	Cluster      []string        `json:"cluster"`
	Local        []string        `json:"local"`
	AllReachable []string        `json:"all_reachable"`
	HasAny       bool            `json:"has_any"`
	Endpoints    []proxyEndpoint `json:"endpoints"`
}

type answer struct {
	ID         any                                    `json:"id"`
	Kubernetes string                                 `json:"kubernetes"`
	Endpoint   string                                 `json:"endpointslice"`
	Gates      map[string]bool                        `json:"gates"`
	Controller *controllerAnswer                      `json:"controller,omitempty"`
	AddHints   *addHintsAnswer                        `json:"add_hints,omitempty"`
	Proxy      map[string]map[string]*proxyPortAnswer `json:"proxy,omitempty"`
	ProxySkip  string                                 `json:"proxy_skipped,omitempty"`
	Warnings   []string                               `json:"warnings,omitempty"`
}

type addHintsAnswer struct {
	ToCreate []*discovery.EndpointSlice `json:"to_create"`
	ToUpdate []*discovery.EndpointSlice `json:"to_update"`
	Events   []event                    `json:"events"`
}

type trialsAnswer struct {
	ID       any               `json:"id"`
	Trials   int               `json:"trials"`
	Distinct int               `json:"distinct"`
	Answers  []json.RawMessage `json:"answers"`
	Counts   []int             `json:"counts"`
}

// ---------------------------------------------------------------------------------------
// Feature gates

// gateDefaults holds each gate's value at start-up, so a request's gates can be undone.
var gateDefaults = map[string]bool{}

// touched: gates set by some earlier request (reset to their default before the next one).
var touched = map[string]bool{}

func knownGates() map[featuregate.Feature]featuregate.FeatureSpec {
	return utilfeature.DefaultMutableFeatureGate.GetAll()
}

func gateEnabled(name string) (bool, bool) {
	if _, ok := knownGates()[featuregate.Feature(name)]; !ok {
		return false, false
	}
	return utilfeature.DefaultFeatureGate.Enabled(featuregate.Feature(name)), true
}

func recordGateDefaults() {
	for f := range knownGates() {
		gateDefaults[string(f)] = utilfeature.DefaultFeatureGate.Enabled(f)
	}
}

// applyGates restores every gate an earlier request set, then applies this request's map
// through DefaultMutableFeatureGate.SetFromMap (unknown gates and changes of locked gates are
// refused there, as kube-controller-manager and kube-proxy refuse them at start-up).
func applyGates(want map[string]bool) error {
	reset := map[string]bool{}
	for g := range touched {
		reset[g] = gateDefaults[g]
	}
	if len(reset) > 0 {
		if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(reset); err != nil {
			return fmt.Errorf("resetting feature gates: %w", err)
		}
	}
	if len(want) == 0 {
		return nil
	}
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(want); err != nil {
		// SetFromMap may have applied part of the map before failing; undo it.
		for g := range want {
			if _, ok := gateDefaults[g]; ok {
				touched[g] = true
			}
		}
		return fmt.Errorf("feature_gates: %w", err)
	}
	for g := range want {
		touched[g] = true
	}
	return nil
}

// ---------------------------------------------------------------------------------------
// Input conversion

func parseNode(raw json.RawMessage, i int) (*corev1.Node, error) {
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(raw, &probe); err != nil {
		return nil, fmt.Errorf("nodes[%d]: %v", i, err)
	}
	if _, full := probe["metadata"]; full {
		n := &corev1.Node{}
		if err := json.Unmarshal(raw, n); err != nil {
			return nil, fmt.Errorf("nodes[%d]: %v", i, err)
		}
		if n.Name == "" {
			return nil, fmt.Errorf("nodes[%d].metadata.name: missing", i)
		}
		return n, nil
	}
	var in nodeInput
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return nil, fmt.Errorf("nodes[%d]: %v", i, err)
	}
	if in.Name == "" {
		return nil, fmt.Errorf("nodes[%d].name: missing", i)
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: in.Name, Labels: in.Labels}}
	if in.AllocatableCPU != nil {
		q, err := resource.ParseQuantity(*in.AllocatableCPU)
		if err != nil {
			return nil, fmt.Errorf("nodes[%d].allocatable_cpu: %v", i, err)
		}
		n.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: q}
	}
	switch r := in.Ready.(type) {
	case nil:
	case bool:
		st := corev1.ConditionFalse
		if r {
			st = corev1.ConditionTrue
		}
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: st}}
	case string:
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionStatus(r)}}
	default:
		return nil, fmt.Errorf("nodes[%d].ready: want true, false, a condition status string or null", i)
	}
	return n, nil
}

func isManaged(s *discovery.EndpointSlice, svc *corev1.Service) bool {
	return s.Labels[discovery.LabelServiceName] == svc.Name && s.Labels[discovery.LabelManagedBy] == controllerName
}

// podsFromSlices builds, for every endpoint of the controller's own slices, a Pod that the
// controller turns back into that endpoint (the inverse of k8s.io/endpointslice utils.go
// podToEndpoint and getEndpointPorts: PodIPs = addresses, nodeName, Ready condition =
// conditions.serving (else conditions.ready), deletionTimestamp iff conditions.terminating,
// name/uid from targetRef, a container port per named service targetPort). An endpoint the
// controller could not have written (ready unset, a zone that is not its node's label, no
// targetRef, ...) comes back normalised by the reconciler, as it would in a cluster.
func podsFromSlices(svc *corev1.Service, slices []*discovery.EndpointSlice) []*corev1.Pod {
	var pods []*corev1.Pod
	seen := map[string]bool{}
	for _, s := range slices {
		if !isManaged(s, svc) {
			continue
		}
		portByName := map[string]int32{}
		for _, p := range s.Ports {
			if p.Name != nil && p.Port != nil {
				portByName[*p.Name] = *p.Port
			}
		}
		for i, ep := range s.Endpoints {
			name := fmt.Sprintf("%s-ep%d", s.Name, i)
			uid := types.UID("")
			if ep.TargetRef != nil && ep.TargetRef.Name != "" {
				name, uid = ep.TargetRef.Name, ep.TargetRef.UID
			}
			if seen[name+"/"+string(uid)] {
				continue // the same pod listed in two slices (it moved); the controller sees one Pod
			}
			seen[name+"/"+string(uid)] = true
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
				Name: name, Namespace: svc.Namespace, UID: uid, Labels: map[string]string{},
			}}
			for k, v := range svc.Spec.Selector {
				pod.Labels[k] = v
			}
			if ep.NodeName != nil {
				pod.Spec.NodeName = *ep.NodeName
			}
			if ep.Hostname != nil {
				pod.Spec.Hostname, pod.Spec.Subdomain = *ep.Hostname, svc.Name
			}
			c := corev1.Container{Name: "c"}
			for _, sp := range svc.Spec.Ports {
				if sp.TargetPort.Type == intstr.String {
					if num, ok := portByName[sp.Name]; ok {
						c.Ports = append(c.Ports, corev1.ContainerPort{Name: sp.TargetPort.StrVal, ContainerPort: num, Protocol: sp.Protocol})
					}
				}
			}
			pod.Spec.Containers = []corev1.Container{c}
			for _, a := range ep.Addresses {
				pod.Status.PodIPs = append(pod.Status.PodIPs, corev1.PodIP{IP: a})
			}
			if len(ep.Addresses) > 0 {
				pod.Status.PodIP = ep.Addresses[0]
			}
			pod.Status.Phase = corev1.PodRunning
			ready := false
			if ep.Conditions.Serving != nil {
				ready = *ep.Conditions.Serving
			} else if ep.Conditions.Ready != nil {
				ready = *ep.Conditions.Ready
			}
			st := corev1.ConditionFalse
			if ready {
				st = corev1.ConditionTrue
			}
			pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
			if ep.Conditions.Terminating != nil && *ep.Conditions.Terminating {
				now := metav1.Unix(1700000000, 0)
				pod.DeletionTimestamp = &now
			}
			pods = append(pods, pod)
		}
	}
	return pods
}

// ---------------------------------------------------------------------------------------
// EndpointSlice controller

func drainEvents(rec *record.FakeRecorder) []event {
	out := []event{}
	for {
		select {
		case s := <-rec.Events:
			parts := strings.SplitN(s, " ", 3)
			for len(parts) < 3 {
				parts = append(parts, "")
			}
			out = append(out, event{Type: parts[0], Reason: parts[1], Message: parts[2]})
		default:
			return out
		}
	}
}

// newClient returns a fake clientset holding objs whose EndpointSlice creates get a name
// (GenerateName + a counter; the API server would append random characters) and whose
// EndpointSlice writes are recorded in order.
func newClient(objs []runtime.Object, acts *[]action) *fake.Clientset {
	client := fake.NewSimpleClientset(objs...)
	n := 0
	client.PrependReactor("*", "endpointslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		switch a.GetVerb() {
		case "create":
			s := a.(k8stesting.CreateAction).GetObject().(*discovery.EndpointSlice)
			if s.Name == "" && s.GenerateName != "" {
				n++
				s.Name = fmt.Sprintf("%soracle%d", s.GenerateName, n)
				s.GenerateName = ""
			}
			*acts = append(*acts, action{"create", s.Name})
		case "update":
			s := a.(k8stesting.UpdateAction).GetObject().(*discovery.EndpointSlice)
			*acts = append(*acts, action{"update", s.Name})
		case "delete":
			*acts = append(*acts, action{"delete", a.(k8stesting.DeleteAction).GetName()})
		}
		return false, nil, nil
	})
	return client
}

func newNodeLister(nodes []*corev1.Node) (corelisters.NodeLister, error) {
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, n := range nodes {
		if err := idx.Add(n); err != nil {
			return nil, err
		}
	}
	return corelisters.NewNodeLister(idx), nil
}

func seedCache(tc *topologycache.TopologyCache, svcKey string, st map[string]cacheState) error {
	for at, cs := range st {
		if at != string(discovery.AddressTypeIPv4) && at != string(discovery.AddressTypeIPv6) {
			return fmt.Errorf("topology_cache: key %q is not IPv4 or IPv6", at)
		}
		if cs.Populated {
			tc.SetHints(svcKey, discovery.AddressType(at), topologycache.EndpointZoneInfo(cs.EndpointsByZone))
		}
	}
	return nil
}

func runController(req *request, nodes []*corev1.Node, logger klog.Logger) (*controllerAnswer, []*discovery.EndpointSlice, error) {
	svc := req.Service
	ans := &controllerAnswer{Events: []event{}, Actions: []action{}}

	var objs []runtime.Object
	var existing []*discovery.EndpointSlice
	for _, s := range req.EndpointSlices {
		c := s.DeepCopy()
		if c.Namespace == "" {
			c.Namespace = svc.Namespace
		}
		c.ResourceVersion = ""
		// The controller deletes slices of the Service that lack its controller reference
		// (k8s.io/endpointslice utils.go ownedBy); synthetic inputs often omit it, so by default
		// the reference newEndpointSlice would have set is added to managed slices without any.
		if req.OwnerRefs != "as-given" && isManaged(c, svc) && len(c.OwnerReferences) == 0 {
			c.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(svc, schema.GroupVersionKind{Version: "v1", Kind: "Service"})}
		}
		objs = append(objs, c)
		// syncService lists only the controller's own slices of this Service and drops those
		// pending deletion (pkg/controller/endpointslice endpointslice_controller.go syncService).
		if isManaged(c, svc) && c.DeletionTimestamp == nil {
			existing = append(existing, c.DeepCopy())
		}
	}
	var acts []action
	client := newClient(objs, &acts)
	lister, err := newNodeLister(nodes)
	if err != nil {
		return nil, nil, err
	}
	rec := record.NewFakeRecorder(1000)

	// kube-controller-manager creates the topology cache (gated before 1.36) and feeds it every
	// Node on node events (endpointslice_controller.go NewController, checkNodeTopologyDistribution).
	tc := newTopologyCache()
	if tc != nil {
		ans.TopologyCache = true
		tc.SetNodes(logger, nodes)
		if err := seedCache(tc, svc.Namespace+"/"+svc.Name, req.TopologyCache); err != nil {
			return nil, nil, err
		}
	} else if len(req.TopologyCache) > 0 {
		return nil, nil, errors.New("topology_cache: this release's gates give the controller no topology cache")
	}
	maxEPS := req.MaxEndpointsPerSlice
	if maxEPS == 0 {
		maxEPS = 100 // kube-controller-manager --max-endpoints-per-slice default
	}
	r := newReconciler(client, lister, maxEPS, endpointsliceutil.NewEndpointSliceTracker(), tc, rec)

	// syncService: ExternalName and selector-less Services get no slices from the controller.
	switch {
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		ans.Skipped = "Service type ExternalName"
	case svc.Spec.Selector == nil:
		ans.Skipped = "Service has no selector"
	}
	if ans.Skipped == "" {
		pods := req.Pods
		if pods == nil {
			pods = podsFromSlices(svc, existing)
		}
		sel := labels.Set(svc.Spec.Selector).AsSelectorPreValidated()
		var matched []*corev1.Pod
		for _, p := range pods {
			if p.Namespace == "" {
				p.Namespace = svc.Namespace
			}
			if p.Namespace == svc.Namespace && sel.Matches(labels.Set(p.Labels)) {
				matched = append(matched, p)
			}
		}
		if req.EchoPods {
			ans.Pods = matched
		}
		if err := r.Reconcile(logger, svc, matched, existing, metav1.Time{}.Time); err != nil {
			msg := err.Error()
			ans.Error = &msg
			// syncService records this event when Reconcile fails.
			rec.Eventf(svc, corev1.EventTypeWarning, "FailedToUpdateEndpointSlices",
				"Error updating Endpoint Slices for Service %s/%s: %v", svc.Namespace, svc.Name, err)
		}
	}
	ans.Events = drainEvents(rec)
	ans.Actions = append(ans.Actions, acts...)

	list, err := client.DiscoveryV1().EndpointSlices(svc.Namespace).List(ctxTODO(), metav1.ListOptions{})
	if err != nil {
		return nil, nil, err
	}
	after := make([]*discovery.EndpointSlice, 0, len(list.Items))
	for i := range list.Items {
		after = append(after, &list.Items[i])
	}
	sort.Slice(after, func(i, j int) bool { return after[i].Name < after[j].Name })
	ans.Slices = after
	ans.Endpoints = []endpointHints{}
	for _, s := range after {
		if !isManaged(s, svc) {
			continue
		}
		for _, ep := range s.Endpoints {
			eh := endpointHints{Slice: s.Name, Addresses: ep.Addresses, Node: ep.NodeName, Zone: ep.Zone,
				Ready: ep.Conditions.Ready, Hints: ep.Hints}
			if ep.TargetRef != nil {
				eh.Pod = ep.TargetRef.Name
			}
			ans.Endpoints = append(ans.Endpoints, eh)
		}
	}
	return ans, after, nil
}

func runAddHints(req *request, nodes []*corev1.Node, logger klog.Logger) (*addHintsAnswer, error) {
	tc := newTopologyCache()
	if tc == nil {
		return nil, errors.New("add_hints: this release's gates give the controller no topology cache")
	}
	tc.SetNodes(logger, nodes)
	svcKey := "default/svc"
	at := discovery.AddressType(req.AddressType)
	if req.Service != nil {
		svcKey = req.Service.Namespace + "/" + req.Service.Name
	}
	if err := seedCache(tc, svcKey, req.TopologyCache); err != nil {
		return nil, err
	}
	si := &topologycache.SliceInfo{ServiceKey: svcKey, AddressType: at,
		ToCreate: req.AddHints.ToCreate, ToUpdate: req.AddHints.ToUpdate, Unchanged: req.AddHints.Unchanged}
	for _, l := range [][]*discovery.EndpointSlice{si.ToCreate, si.ToUpdate, si.Unchanged} {
		for i, s := range l {
			if s == nil {
				return nil, fmt.Errorf("add_hints: slice %d is null", i)
			}
			if s.AddressType == "" {
				s.AddressType = at
			}
		}
	}
	create, update, evs := tc.AddHints(logger, si)
	ans := &addHintsAnswer{ToCreate: create, ToUpdate: update, Events: []event{}}
	if ans.ToCreate == nil {
		ans.ToCreate = []*discovery.EndpointSlice{}
	}
	if ans.ToUpdate == nil {
		ans.ToUpdate = []*discovery.EndpointSlice{}
	}
	for _, e := range evs {
		ans.Events = append(ans.Events, event{Type: e.EventType, Reason: e.Reason, Message: e.Message})
	}
	return ans, nil
}

// ---------------------------------------------------------------------------------------
// kube-proxy

func proxyNodeNames(req *request, nodes []*corev1.Node) ([]string, error) {
	switch v := req.ProxyNodes.(type) {
	case nil:
		return nil, nil
	case string:
		if v != "all" {
			return nil, fmt.Errorf("proxy_nodes: want \"all\" or a list of node names, got %q", v)
		}
		var names []string
		for _, n := range nodes {
			names = append(names, n.Name)
		}
		return names, nil
	case []any:
		var names []string
		for i, x := range v {
			s, ok := x.(string)
			if !ok || s == "" {
				return nil, fmt.Errorf("proxy_nodes[%d]: want a node name", i)
			}
			names = append(names, s)
		}
		return names, nil
	}
	return nil, errors.New("proxy_nodes: want \"all\" or a list of node names")
}

func endpointStrings(eps []proxyEP) []string {
	if eps == nil {
		return nil
	}
	out := make([]string, 0, len(eps))
	for _, e := range eps {
		out = append(out, e.String())
	}
	sort.Strings(out)
	return out
}

func sortedSet(s interface{ UnsortedList() []string }) []string {
	l := s.UnsortedList()
	if len(l) == 0 {
		return nil
	}
	sort.Strings(l)
	return l
}

func runProxy(req *request, nodes []*corev1.Node, slices []*discovery.EndpointSlice, names []string) (map[string]map[string]*proxyPortAnswer, string, error) {
	family := corev1.IPv4Protocol
	if req.AddressType == string(discovery.AddressTypeIPv6) {
		family = corev1.IPv6Protocol
	}
	labelsByNode := map[string]map[string]string{}
	for _, n := range nodes {
		labelsByNode[n.Name] = n.Labels
	}
	out := map[string]map[string]*proxyPortAnswer{}
	for _, node := range names {
		nodeLabels := labelsByNode[node]
		if nodeLabels == nil {
			nodeLabels = map[string]string{}
		}
		svcPorts := proxyServicePorts(family, req.Service)
		if len(svcPorts) == 0 {
			return nil, "kube-proxy skips this Service (no cluster IP of the family, headless, or ExternalName)", nil
		}
		epsByPort := proxyEndpoints(family, node, slices)
		perPort := map[string]*proxyPortAnswer{}
		for key, sp := range svcPorts {
			eps := epsByPort[key]
			cl, lo, all, hasAny := categorize(eps, sp, node, nodeLabels)
			pa := &proxyPortAnswer{Cluster: endpointStrings(cl), Local: endpointStrings(lo),
				AllReachable: endpointStrings(all), HasAny: hasAny, Endpoints: []proxyEndpoint{}}
			if pa.AllReachable == nil {
				pa.AllReachable = []string{}
			}
			for _, e := range eps {
				pa.Endpoints = append(pa.Endpoints, proxyEndpoint{Endpoint: e.String(), Local: e.IsLocal(),
					Ready: e.IsReady(), Serving: e.IsServing(), Terminating: e.IsTerminating(),
					ZoneHints: sortedSet(e.ZoneHints()), NodeHints: nodeHints(e)})
			}
			sort.Slice(pa.Endpoints, func(i, j int) bool { return pa.Endpoints[i].Endpoint < pa.Endpoints[j].Endpoint })
			perPort[key] = pa
		}
		out[node] = perPort
	}
	return out, "", nil
}

// ---------------------------------------------------------------------------------------
// Request loop

func versions() (string, string) {
	k, e := "unknown", "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			v := d.Version
			if d.Replace != nil {
				v = d.Replace.Version
			}
			switch d.Path {
			case "k8s.io/kubernetes":
				k = v
			case "k8s.io/endpointslice":
				e = v
			}
		}
	}
	return k, e
}

var kubeVersion, endpointsliceVersion = versions()

func handleOnce(req *request) (ans *answer, err error) {
	defer func() {
		if p := recover(); p != nil {
			ans, err = nil, fmt.Errorf("upstream code panicked: %v", p)
		}
	}()
	if err := applyGates(req.FeatureGates); err != nil {
		return nil, err
	}
	if req.AddressType == "" {
		req.AddressType = string(discovery.AddressTypeIPv4)
	}
	if req.AddressType != string(discovery.AddressTypeIPv4) && req.AddressType != string(discovery.AddressTypeIPv6) {
		return nil, fmt.Errorf("address_type: want IPv4 or IPv6, got %q", req.AddressType)
	}
	nodes := make([]*corev1.Node, 0, len(req.Nodes))
	for i, raw := range req.Nodes {
		n, err := parseNode(raw, i)
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, n)
	}
	ans = &answer{ID: req.ID, Kubernetes: kubeVersion, Endpoint: endpointsliceVersion, Gates: map[string]bool{}}
	for _, g := range reportedGates {
		if on, known := gateEnabled(g); known {
			ans.Gates[g] = on
		}
	}
	logger := logr.Discard()

	if req.AddHints != nil {
		ah, err := runAddHints(req, nodes, logger)
		if err != nil {
			return nil, err
		}
		ans.AddHints = ah
		return ans, nil
	}

	if req.Service == nil {
		return nil, errors.New("service: missing")
	}
	if req.Service.Name == "" {
		return nil, errors.New("service.metadata.name: missing")
	}
	if req.Service.Namespace == "" {
		req.Service.Namespace = metav1.NamespaceDefault
	}
	if req.Service.UID == "" {
		req.Service.UID = types.UID("oracle-uid-" + req.Service.Namespace + "-" + req.Service.Name)
	}
	switch req.OwnerRefs {
	case "", "add-missing", "as-given":
	default:
		return nil, fmt.Errorf("owner_refs: want \"add-missing\" or \"as-given\", got %q", req.OwnerRefs)
	}
	for i, s := range req.EndpointSlices {
		if s == nil || s.Name == "" {
			return nil, fmt.Errorf("endpoint_slices[%d].metadata.name: missing", i)
		}
		if s.Namespace == "" {
			s.Namespace = req.Service.Namespace
		}
	}
	proxySlices := req.EndpointSlices
	if req.Controller == nil || *req.Controller {
		ca, after, err := runController(req, nodes, logger)
		if err != nil {
			return nil, err
		}
		ans.Controller = ca
		switch req.ProxySlices {
		case "", "after":
			proxySlices = after
		case "input":
		default:
			return nil, fmt.Errorf("proxy_slices: want \"after\" or \"input\", got %q", req.ProxySlices)
		}
	}
	names, err := proxyNodeNames(req, nodes)
	if err != nil {
		return nil, err
	}
	if len(names) > 0 {
		px, skip, err := runProxy(req, nodes, proxySlices, names)
		if err != nil {
			return nil, err
		}
		ans.Proxy, ans.ProxySkip = px, skip
	}
	return ans, nil
}

// requestFields: the top-level keys a request may have (json tags of request).
var requestFields = func() map[string]bool {
	m := map[string]bool{}
	t := reflect.TypeOf(request{})
	for i := 0; i < t.NumField(); i++ {
		m[strings.Split(t.Field(i).Tag.Get("json"), ",")[0]] = true
	}
	return m
}()

// decodeRequest is strict about the request's own keys and lenient inside the Kubernetes
// objects, as a client of this release decoding a newer API server's JSON would be: fields this
// release's API types lack (hints.forNodes before 1.33, ...) are dropped, with a warning.
func decodeRequest(line []byte) (*request, []string, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(line, &top); err != nil {
		return nil, nil, fmt.Errorf("request: %v", err)
	}
	var id any
	_ = json.Unmarshal(top["id"], &id)
	req := &request{ID: id}
	for k := range top {
		if !requestFields[k] {
			return req, nil, fmt.Errorf("request: unknown field %q", k)
		}
	}
	if err := json.Unmarshal(line, req); err != nil {
		return req, nil, fmt.Errorf("request: %v", err)
	}
	var warnings []string
	dec := json.NewDecoder(strings.NewReader(string(line)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&request{}); err != nil {
		warnings = append(warnings, "dropped: "+err.Error()+" (unknown to this release's API types)")
	}
	return req, warnings, nil
}

func handle(line []byte) []byte {
	req, warnings, err := decodeRequest(line)
	if err != nil {
		var id any
		if req != nil {
			id = req.ID
		}
		return errLine(id, err)
	}
	trials := req.Trials
	if trials <= 0 {
		trials = 1
	}
	if trials > 10000 {
		return errLine(req.ID, errors.New("trials: at most 10000"))
	}
	var distinct []json.RawMessage
	var counts []int
	for t := 0; t < trials; t++ {
		var r request
		// each trial decodes afresh: the upstream code mutates the objects it is given
		_ = json.Unmarshal(line, &r)
		ans, err := handleOnce(&r)
		if err != nil {
			return errLine(req.ID, err)
		}
		ans.Warnings = warnings
		if trials == 1 {
			b, err := json.Marshal(ans)
			if err != nil {
				return errLine(req.ID, err)
			}
			return b
		}
		ans.ID = nil
		b, err := json.Marshal(ans)
		if err != nil {
			return errLine(req.ID, err)
		}
		found := false
		for i, d := range distinct {
			if string(d) == string(b) {
				counts[i]++
				found = true
				break
			}
		}
		if !found {
			distinct = append(distinct, b)
			counts = append(counts, 1)
		}
	}
	b, err := json.Marshal(trialsAnswer{ID: req.ID, Trials: trials, Distinct: len(distinct), Answers: distinct, Counts: counts})
	if err != nil {
		return errLine(req.ID, err)
	}
	return b
}

func errLine(id any, err error) []byte {
	b, _ := json.Marshal(map[string]any{"id": id, "error": strings.ReplaceAll(err.Error(), "\n", " ")})
	return b
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "--version" {
		fmt.Printf("kubernetes %s endpointslice %s\n", kubeVersion, endpointsliceVersion)
		return
	}
	// Upstream logs go to stderr only when ORACLE_LOG is set; otherwise they are dropped so a
	// client that does not read stderr never blocks the process.
	if os.Getenv("ORACLE_LOG") == "" {
		klog.LogToStderr(false)
		klog.SetOutput(io.Discard)
	}
	recordGateDefaults()
	in := bufio.NewReaderSize(os.Stdin, 1<<20)
	out := bufio.NewWriter(os.Stdout)
	for {
		line, err := in.ReadBytes('\n')
		if len(strings.TrimSpace(string(line))) > 0 {
			out.Write(handle(line))
			out.WriteByte('\n')
			out.Flush()
		}
		if err != nil {
			return
		}
	}
}
