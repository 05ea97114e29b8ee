package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sort"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
)

// apiNodes answers the API server's node list and watch on the wire (JSON), for watchNodes: the
// watch-list (initial events, then the bookmark that ends them, as client-go asks first) and a plain
// list then watch, whichever the client asks; after the initial state, the watch sends what the test
// puts on events.
type apiNodes struct {
	initial []corev1.Node
	events  chan metav1.WatchEvent
}

func (a *apiNodes) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/api/v1/nodes" {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	q := r.URL.Query()
	if q.Get("watch") != "true" {
		list := corev1.NodeList{TypeMeta: metav1.TypeMeta{Kind: "NodeList", APIVersion: "v1"},
			ListMeta: metav1.ListMeta{ResourceVersion: "10"}, Items: a.initial}
		_ = json.NewEncoder(w).Encode(list)
		return
	}
	enc := json.NewEncoder(w)
	send := func(e metav1.WatchEvent) bool {
		if enc.Encode(e) != nil {
			return false
		}
		w.(http.Flusher).Flush()
		return true
	}
	if q.Get("sendInitialEvents") == "true" {
		for i := range a.initial {
			if !send(event("ADDED", &a.initial[i])) {
				return
			}
		}
		bookmark := &corev1.Node{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "10",
			Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}
		if !send(event("BOOKMARK", bookmark)) {
			return
		}
	} else {
		w.(http.Flusher).Flush()
	}
	for {
		select {
		case <-r.Context().Done():
			return
		case e := <-a.events:
			if !send(e) {
				return
			}
		}
	}
}

func event(typ string, n *corev1.Node) metav1.WatchEvent {
	n = n.DeepCopy()
	n.TypeMeta = metav1.TypeMeta{Kind: "Node", APIVersion: "v1"}
	raw, err := json.Marshal(n)
	if err != nil {
		panic(err)
	}
	return metav1.WatchEvent{Type: typ, Object: runtime.RawExtension{Raw: raw}}
}

func node(name, rv, podCIDR, internalIP string) corev1.Node {
	n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: rv}}
	if podCIDR != "" {
		n.Spec.PodCIDR, n.Spec.PodCIDRs = podCIDR, []string{podCIDR}
	}
	if internalIP != "" {
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: internalIP}}
	}
	return n
}

// TestWatchNodes runs watchNodes over nodeClient against an API server's wire format: the nodes it
// first lists, then every change the watch sends, reach the store decoded, each with a call of
// changed.
func TestWatchNodes(t *testing.T) {
	api := &apiNodes{
		initial: []corev1.Node{node("cp", "9", "10.244.0.0/24", "172.18.0.2")},
		events:  make(chan metav1.WatchEvent),
	}
	srv := httptest.NewServer(api)
	defer srv.Close()
	client, err := nodeClient(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	changed := make(chan struct{}, 100)
	store, err := watchNodes(ctx, client, 0, func() { changed <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	infos := func() []nodeInfo {
		out := nodeInfos(store.List())
		sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
		return out
	}
	// waitFor waits for one call of changed and then for the store to hold want.
	waitFor := func(step string, want []nodeInfo) {
		t.Helper()
		select {
		case <-changed:
		case <-ctx.Done():
			t.Fatalf("%s: changed was not called", step)
		}
		for {
			got := infos()
			diff := cmp.Diff(want, got, cmp.AllowUnexported(nodeInfo{}))
			if diff == "" {
				return
			}
			select {
			case <-ctx.Done():
				t.Fatalf("%s: the store's nodes (-want +got):\n%s", step, diff)
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	cp := nodeInfo{name: "cp", podCIDRs: []string{"10.244.0.0/24"}, internalIP: "172.18.0.2"}
	waitFor("the first list", []nodeInfo{cp})

	w1 := node("w1", "11", "10.244.1.0/24", "172.18.0.3")
	api.events <- event("ADDED", &w1)
	w1Info := nodeInfo{name: "w1", podCIDRs: []string{"10.244.1.0/24"}, internalIP: "172.18.0.3"}
	waitFor("a node added", []nodeInfo{cp, w1Info})

	moved := node("w1", "12", "10.244.1.0/24", "172.18.0.9")
	api.events <- event("MODIFIED", &moved)
	w1Info.internalIP = "172.18.0.9"
	waitFor("a node's address changed", []nodeInfo{cp, w1Info})

	api.events <- event("DELETED", &moved)
	waitFor("a node deleted", []nodeInfo{cp})
}
