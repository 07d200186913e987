package scale

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	tesserav1 "github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/test/localcluster"
)

func TestSharePods(t *testing.T) {
	const gi = int64(1) << 30
	for _, tc := range []struct {
		gpus        int
		mem, share  int64
		want        int
		bothLimited bool
	}{
		{gpus: 8, mem: 80 * gi, share: 8 * gi, want: 88},
		{gpus: 1, mem: 80 * gi, share: 8 * gi, want: 11},
		{gpus: 8, mem: 15 * gi, share: 8 * gi, want: 23}, // 15 whole shares fit in 8 x 15Gi
	} {
		got := sharePods(tc.gpus, tc.mem, tc.share)
		if got != tc.want {
			t.Errorf("sharePods(%d, %d, %d) = %d, want %d", tc.gpus, tc.mem, tc.share, got, tc.want)
		}
		// More pods than either admitter can take: devices, and shares that fit.
		if got <= tc.gpus || int64(got)*tc.share <= int64(tc.gpus)*tc.mem {
			t.Errorf("sharePods(%d, %d, %d) = %d leaves a quota unfilled", tc.gpus, tc.mem, tc.share, got)
		}
	}
}

func TestKueueObjects(t *testing.T) {
	objs := kueueObjects("cq", "ns1", 512)
	if len(objs) != 3 {
		t.Fatalf("%d objects, want a flavor, a ClusterQueue and a LocalQueue", len(objs))
	}
	kinds := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		if o.GetAPIVersion() != "kueue.x-k8s.io/v1beta2" {
			t.Errorf("%s: apiVersion %q", o.GetKind(), o.GetAPIVersion())
		}
		kinds[o.GetKind()] = o
	}
	cq := kinds["ClusterQueue"]
	groups, _, _ := unstructured.NestedSlice(cq.Object, "spec", "resourceGroups")
	if len(groups) != 1 {
		t.Fatalf("resourceGroups %v", groups)
	}
	g := groups[0].(map[string]any)
	flavor := g["flavors"].([]any)[0].(map[string]any)
	res := flavor["resources"].([]any)[0].(map[string]any)
	if g["coveredResources"].([]any)[0] != kueueGPU || flavor["name"] != kueueFlavor || res["name"] != kueueGPU || res["nominalQuota"] != int64(512) {
		t.Errorf("resource group %v, want %d %s of flavor %s", g, 512, kueueGPU, kueueFlavor)
	}
	lq := kinds["LocalQueue"]
	if lq.GetNamespace() != "ns1" || lq.GetName() != kueueLocalQueue {
		t.Errorf("LocalQueue %s/%s", lq.GetNamespace(), lq.GetName())
	}
	if got, _, _ := unstructured.NestedString(lq.Object, "spec", "clusterQueue"); got != "cq" {
		t.Errorf("LocalQueue's clusterQueue %q", got)
	}
	if rf := kinds["ResourceFlavor"]; rf.GetNamespace() != "" || rf.GetName() != kueueFlavor {
		t.Errorf("ResourceFlavor %s/%s", rf.GetNamespace(), rf.GetName())
	}
}

// TestPeerWorkloads: Kueue's pods name its LocalQueue in a namespace it
// manages and nothing Tessera's webhooks select; Tessera's name a queue.
func TestPeerWorkloads(t *testing.T) {
	cfg := Small()
	ws := peerWorkloads(cfg)
	if len(ws) != 2 || ws[0].name != "queued-whole" || ws[1].name != "kueue-whole" {
		t.Fatalf("peer workloads %v", ws)
	}
	for _, w := range ws {
		if w.pods != cfg.BigGang {
			t.Errorf("%s: %d pods, want %d", w.name, w.pods, cfg.BigGang)
		}
		p := basePod("ns", 0)
		w.pod(0, p)
		if len(p.Spec.ResourceClaims) != 1 || *p.Spec.ResourceClaims[0].ResourceClaimTemplateName != wholeTemplate {
			t.Errorf("%s: claims %v, want the whole-GPU template", w.name, p.Spec.ResourceClaims)
		}
		_, tessera := p.Labels[tesserav1.QueueLabel]
		_, kueue := p.Labels[kueueQueueLabel]
		_, tesseraNS := w.nsLabels[tesserav1.QueueLabel]
		switch w.name {
		case "queued-whole":
			if !tessera || kueue || w.setup != nil {
				t.Errorf("%s: labels %v, setup %v: want a Tessera queue only", w.name, p.Labels, w.setup != nil)
			}
		case "kueue-whole":
			if tessera || tesseraNS || !kueue || w.nsLabels[kueueNamespaceLabel] != kueueNamespaceValue || w.setup == nil {
				t.Errorf("%s: labels %v, namespace labels %v: want Kueue's only", w.name, p.Labels, w.nsLabels)
			}
		}
	}
	opts := KueueOptions()
	if opts.NamespaceLabel != kueueNamespaceLabel+"="+kueueNamespaceValue || opts.DeviceClassMappings[kueueGPU][0] != localcluster.DriverName {
		t.Errorf("Kueue options %+v", opts)
	}
}
