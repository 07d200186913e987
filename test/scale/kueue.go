package scale

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	tesserav1 "github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/test/localcluster"
)

// The peer comparison: Kueue (localcluster.KueueVersion) admitting the
// same pods as Tessera's controller, in the same cluster, after every
// other workload (Kueue is stopped and its webhooks removed after it).
const (
	// kueueNamespaceLabel marks the namespaces whose pods Kueue manages;
	// Tessera's webhooks select pods by tessera.dev/queue (on the pod or
	// its namespace), which these pods and namespaces do not have.
	kueueNamespaceLabel = "tessera.dev/bench-peer"
	kueueNamespaceValue = "kueue"
	// kueueGPU is the logical resource Kueue's deviceClassMappings map the
	// DeviceClass gpu.tessera.dev to: one per device a claim asks for.
	kueueGPU = "tessera.dev/gpu"
	// kueueQueueLabel names a pod's LocalQueue.
	kueueQueueLabel = "kueue.x-k8s.io/queue-name"
	kueueFlavor     = "scale"
	kueueLocalQueue = "scale"
	// shareQueue is the Tessera Queue of the share-admission scenario.
	shareQueue = "scale-shares-cmp"
	// ShareScenarioGPUs is the quota, in GPUs, both admitters get in the
	// share-admission scenario: one node's worth.
	ShareScenarioGPUs = 8
)

// KueueOptions are the Kueue manager's options in a scale run.
func KueueOptions() localcluster.KueueOptions {
	return localcluster.KueueOptions{
		NamespaceLabel:      kueueNamespaceLabel + "=" + kueueNamespaceValue,
		DeviceClassMappings: map[string][]string{kueueGPU: {localcluster.DriverName}},
	}
}

// ShareAdmission is what each admitter let through when every pod asks a
// memory share and the quota is ShareScenarioGPUs GPUs.
type ShareAdmission struct {
	// GPUs is the quota; Pods how many pods each side created; Share what
	// each pod's claim asks for.
	GPUs, Pods int
	Share      string
	// Tessera and Kueue are the pods bound once admission settled.
	Tessera, Kueue int
}

// peerWorkloads are (e') the whole-GPU pods admitted by Tessera's
// controller (a GPU quota, no gang) and (e) the same pods admitted by
// Kueue.
func peerWorkloads(cfg Config) []workload {
	return []workload{
		{name: "queued-whole", title: fmt.Sprintf("(e') %d pods, a whole GPU each, a Tessera queue, no gang", cfg.BigGang), pods: cfg.BigGang,
			pod: func(_ int, p *corev1.Pod) {
				p.Labels[tesserav1.QueueLabel] = gangQueue
				useClaim(p, wholeTemplate)
			}},
		{name: "kueue-whole", title: fmt.Sprintf("(e) %d pods, a whole GPU each, admitted by Kueue %s", cfg.BigGang, localcluster.KueueVersion), pods: cfg.BigGang,
			nsLabels: map[string]string{kueueNamespaceLabel: kueueNamespaceValue},
			setup: func(ctx context.Context, h *harness, ns string) (func(context.Context) error, error) {
				return nil, createKueueQueues(ctx, h.crc, "scale-whole", ns, cfg.BigGang)
			},
			pod: func(_ int, p *corev1.Pod) {
				p.Labels[kueueQueueLabel] = kueueLocalQueue
				useClaim(p, wholeTemplate)
			}},
	}
}

// runPeer starts Kueue, measures the peer workloads and the share
// scenario, and stops Kueue (whatever happened).
func runPeer(ctx context.Context, h *harness, cl *localcluster.Cluster, rep *Report) (err error) {
	started := time.Now()
	k, err := cl.StartKueue(ctx, KueueOptions())
	rep.PeerStart = time.Since(started)
	if err != nil {
		return fmt.Errorf("starting kueue: %w", err)
	}
	defer func() { err = errors.Join(err, k.Stop(ctx)) }()
	// Each admitter is measured as a fresh process: Kueue was just
	// started, and Tessera's controller would otherwise carry the memory
	// of the workloads before (the dynamic-MIG one's above all).
	if err := cl.RestartController(ctx); err != nil {
		rep.Failed = fmt.Sprintf("restarting Tessera's controller before the peer run: %v", err)
		return err
	}
	for _, w := range peerWorkloads(h.cfg) {
		run, err := h.measure(ctx, w)
		if err != nil {
			rep.Failed = fmt.Sprintf("%s: %v", w.title, err)
			return err
		}
		rep.Runs = append(rep.Runs, run)
	}
	rep.Shares, err = h.shareAdmission(ctx)
	if err != nil {
		rep.Failed = fmt.Sprintf("share admission, Tessera vs Kueue: %v", err)
	}
	return err
}

// kueueObjects are the ResourceFlavor, a ClusterQueue named cq with gpus of
// kueueGPU (every namespace may use it) and the LocalQueue of namespace ns.
func kueueObjects(cq, ns string, gpus int) []*unstructured.Unstructured {
	obj := func(kind, name, namespace string, spec map[string]any) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "kueue.x-k8s.io/v1beta2",
			"kind":       kind,
			"metadata":   map[string]any{"name": name},
			"spec":       spec,
		}}
		if namespace != "" {
			u.SetNamespace(namespace)
		}
		return u
	}
	return []*unstructured.Unstructured{
		obj("ResourceFlavor", kueueFlavor, "", map[string]any{}),
		obj("ClusterQueue", cq, "", map[string]any{
			"namespaceSelector": map[string]any{},
			"resourceGroups": []any{map[string]any{
				"coveredResources": []any{kueueGPU},
				"flavors": []any{map[string]any{
					"name":      kueueFlavor,
					"resources": []any{map[string]any{"name": kueueGPU, "nominalQuota": int64(gpus)}},
				}},
			}},
		}),
		obj("LocalQueue", kueueLocalQueue, ns, map[string]any{"clusterQueue": cq}),
	}
}

// createKueueQueues creates kueueObjects (the flavor once) and waits until
// the ClusterQueue is active.
func createKueueQueues(ctx context.Context, cl client.Client, cq, ns string, gpus int) error {
	for _, o := range kueueObjects(cq, ns, gpus) {
		err := cl.Create(ctx, o)
		if o.GetKind() == "ResourceFlavor" && apierrors.IsAlreadyExists(err) {
			continue // made for an earlier workload
		}
		if err != nil {
			return fmt.Errorf("kueue %s %s: %w", o.GetKind(), o.GetName(), err)
		}
	}
	return waitUntil(ctx, time.Minute, "kueue ClusterQueue "+cq+" active", func() (bool, error) {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("kueue.x-k8s.io/v1beta2")
		u.SetKind("ClusterQueue")
		if err := cl.Get(ctx, client.ObjectKey{Name: cq}, u); err != nil {
			return false, nil
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == "Active" && m["status"] == "True" {
				return true, nil
			}
		}
		return false, nil
	})
}

// sharePods is how many share pods each side of the scenario gets: more
// than a device count (gpus) and than GPU memory (gpus x memory of a GPU
// over share) admit, so that the quota stops both.
func sharePods(gpus int, gpuMemory, share int64) int {
	return int(int64(gpus)*gpuMemory/share) + gpus
}

// shareAdmission runs the share scenario: ShareScenarioGPUs GPUs of quota
// for Tessera (a queue with gpu.tessera.dev/gpus, GPU equivalents) and for
// Kueue (a ClusterQueue of kueueGPU, devices), each side's pods asking a
// cfg.Share memory share, created at once; it counts the pods bound once
// neither count has changed for settleFor.
func (h *harness) shareAdmission(ctx context.Context) (*ShareAdmission, error) {
	gpus := ShareScenarioGPUs
	gpuMemory, err := h.gpuMemory(ctx)
	if err != nil {
		return nil, err
	}
	share, err := resource.ParseQuantity(h.cfg.Share)
	if err != nil {
		return nil, fmt.Errorf("scale: Share %q: %w", h.cfg.Share, err)
	}
	out := &ShareAdmission{GPUs: gpus, Share: h.cfg.Share, Pods: sharePods(gpus, gpuMemory, share.Value())}
	q := &tesserav1.Queue{
		ObjectMeta: metav1.ObjectMeta{Name: shareQueue},
		Spec: tesserav1.QueueSpec{Resources: map[tesserav1.ResourceName]tesserav1.QueueResource{
			tesserav1.ResourceGPUs: {Quota: resource.NewQuantity(int64(gpus), resource.DecimalSI)},
		}},
	}
	if err := h.crc.Create(ctx, q); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("queue %s: %w", shareQueue, err)
	}
	defer func() {
		if err := h.crc.Delete(ctx, q); err != nil {
			h.logf("deleting queue %s: %v", shareQueue, err)
		}
	}()
	sides := []struct {
		ns     string
		labels map[string]string
		setup  func(ns string) error
		pod    func(p *corev1.Pod)
	}{
		{ns: "scale-cmp-tessera", pod: func(p *corev1.Pod) { p.Labels[tesserav1.QueueLabel] = shareQueue }},
		{ns: "scale-cmp-kueue", labels: map[string]string{kueueNamespaceLabel: kueueNamespaceValue},
			setup: func(ns string) error { return createKueueQueues(ctx, h.crc, "scale-shares", ns, gpus) },
			pod:   func(p *corev1.Pod) { p.Labels[kueueQueueLabel] = kueueLocalQueue }},
	}
	for _, s := range sides {
		if err := h.createNamespace(ctx, s.ns, s.labels); err != nil {
			return nil, err
		}
		defer func() {
			if err := h.deleteNamespace(ctx, s.ns); err != nil {
				h.logf("cleaning up %s: %v", s.ns, err)
			}
		}()
		if s.setup != nil {
			if err := s.setup(s.ns); err != nil {
				return nil, err
			}
		}
	}
	h.logf("share admission: %d pods of a %s share on each side, quota %d GPUs", out.Pods, h.cfg.Share, gpus)
	for _, s := range sides {
		err := parallel(ctx, out.Pods, h.cfg.Workers, func(ctx context.Context, i int) error {
			p := basePod(s.ns, i)
			s.pod(p)
			useClaim(p, shareTemplate)
			_, err := h.cs.CoreV1().Pods(s.ns).Create(ctx, p, metav1.CreateOptions{})
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("share admission: creating pods in %s: %w", s.ns, err)
		}
	}
	const settleFor = 10 * time.Second
	counts := make([]int, len(sides))
	stable := time.Now()
	err = waitUntil(ctx, 2*time.Minute, "share admission to settle", func() (bool, error) {
		changed := false
		for i, s := range sides {
			n, err := h.boundPods(ctx, s.ns)
			if err != nil {
				return false, err
			}
			if n != counts[i] {
				counts[i], changed = n, true
			}
		}
		if changed {
			stable = time.Now()
		}
		return time.Since(stable) >= settleFor, nil
	})
	if err != nil {
		return nil, err
	}
	out.Tessera, out.Kueue = counts[0], counts[1]
	h.logf("share admission: Tessera bound %d, Kueue %d of %d pods each", out.Tessera, out.Kueue, out.Pods)
	return out, nil
}

// boundPods counts the pods of ns with a node.
func (h *harness) boundPods(ctx context.Context, ns string) (int, error) {
	pods, err := h.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, p := range pods.Items {
		if p.Spec.NodeName != "" {
			n++
		}
	}
	return n, nil
}

// gpuMemory is the memory capacity of a GPU of the fake nodes' slices (not
// the real node's, whose plugin models another profile).
func (h *harness) gpuMemory(ctx context.Context) (int64, error) {
	slices, err := h.cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + nodeName(0)})
	if err != nil {
		return 0, err
	}
	for _, s := range slices.Items {
		for _, d := range s.Spec.Devices {
			a, ok := d.Attributes["type"]
			if !ok || a.StringValue == nil || *a.StringValue != "gpu" {
				continue
			}
			if c, ok := d.Capacity["memory"]; ok {
				return c.Value.Value(), nil
			}
		}
	}
	return 0, fmt.Errorf("no GPU device with a memory capacity in the ResourceSlices of %s", nodeName(0))
}
