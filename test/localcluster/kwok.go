package localcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// KWOK (sigs.k8s.io/kwok) simulates nodes for the scale benchmarks: the kwok
// controller keeps fake Node objects alive (status, heartbeat, Lease) and
// plays the kubelet's part for pods bound to them (Running, then deleted
// when asked). Nothing runs on a fake node, so nothing is prepared there:
// the scale runs measure the control plane (Tessera's controller, the
// scheduler's DRA allocator, the API server), not the node.
const (
	// FakeNodeLabel marks the nodes the kwok controller manages
	// (value "true"); they also carry FakeNodeTaint.
	FakeNodeLabel = "tessera.dev/kwok-node"
	// FakeNodeTaint keeps every pod that does not tolerate it (the chart's
	// DaemonSet and controller) off fake nodes.
	FakeNodeTaint = "kwok.x-k8s.io/node"
	// KwokPort serves the kwok controller's /healthz and /metrics.
	KwokPort = 10247

	compKwok       = "kwok"
	kwokStagesFile = "stages.yaml"
)

// kwokStages are the Stage manifests of the kwok module that make up its
// "fast" lifecycle with node leases (what `kwokctl create cluster` uses).
var kwokStages = []string{
	"kustomize/stage/node/fast/node-initialize.yaml",
	"kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
	"kustomize/stage/pod/fast/pod-ready.yaml",
	"kustomize/stage/pod/fast/pod-complete.yaml",
	"kustomize/stage/pod/fast/pod-delete.yaml",
}

func buildKwok(ctx context.Context, logf Logf, dst string) error {
	return buildOnce(ctx, logf, "kwok", KwokVersion, dst, []string{"kwok"}, "about 3 minutes cold",
		func(work, out string, run runFunc) error {
			if err := run("env", "GOBIN="+out, "CGO_ENABLED=0", "go", "install", "-trimpath", "-ldflags", "-s -w", "sigs.k8s.io/kwok/cmd/kwok@"+KwokVersion); err != nil {
				return err
			}
			mod, err := downloadModule(ctx, work, "sigs.k8s.io/kwok@"+KwokVersion)
			if err != nil {
				return err
			}
			var docs []string
			for _, f := range kwokStages {
				b, err := os.ReadFile(filepath.Join(mod.Dir, f))
				if err != nil {
					return err
				}
				docs = append(docs, strings.TrimSpace(string(b)))
			}
			return os.WriteFile(filepath.Join(out, kwokStagesFile), []byte(strings.Join(docs, "\n---\n")+"\n"), 0o644)
		})
}

// StartKwok starts the kwok controller (as a host process, with the admin
// kubeconfig) managing the nodes labelled FakeNodeLabel=true, and waits
// until it is healthy. Down stops it with the other components.
func (c *Cluster) StartKwok(ctx context.Context) error {
	if err := buildKwok(ctx, c.logf, filepath.Dir(c.Bin.Kwok)); err != nil {
		return fmt.Errorf("building kwok %s: %w", KwokVersion, err)
	}
	stages, err := os.ReadFile(c.Bin.KwokStages)
	if err != nil {
		return err
	}
	// The kwok controller reads its configuration and Stages from one
	// multi-document file.
	conf := "apiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokConfiguration\noptions:\n  nodePlayStageParallelism: 16\n  podPlayStageParallelism: 16\n  nodeLeaseParallelism: 16\n  podsOnNodeSyncParallelism: 4\n---\n" + string(stages)
	path := filepath.Join(c.Dirs.Root, "kwok.yaml")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		return err
	}
	if err := c.start(compKwok, c.Bin.Kwok, []string{
		"--config=" + path,
		"--kubeconfig=" + c.Kubeconfig,
		"--manage-all-nodes=false",
		"--manage-nodes-with-label-selector=" + FakeNodeLabel + "=true",
		"--node-lease-duration-seconds=40",
		fmt.Sprintf("--server-address=127.0.0.1:%d", KwokPort),
		"--cidr=10.128.0.0/10",
		"--node-ip=10.0.0.2",
	}, []string{c.hostPath()}); err != nil {
		return err
	}
	return c.waitFor(ctx, "kwok controller /healthz", 60*time.Second, []string{compKwok, compAPIServer}, func() (bool, error) {
		body, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d/healthz", KwokPort), nil)
		return err == nil && strings.TrimSpace(body) == "ok", nil
	})
}

// FakeNode is a Node the kwok controller manages: labelled FakeNodeLabel
// (plus labels), tainted FakeNodeTaint=fake:NoSchedule, with room for 110
// pods and no CPU or memory pressure.
func FakeNode(name string, labels map[string]string) *corev1.Node {
	l := map[string]string{
		FakeNodeLabel:             "true",
		corev1.LabelHostname:      name,
		corev1.LabelOSStable:      "linux",
		corev1.LabelArchStable:    "amd64",
		"node.kubernetes.io/kwok": "fake",
	}
	for k, v := range labels {
		l[k] = v
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("128"),
		corev1.ResourceMemory: resource.MustParse("2Ti"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Labels:      l,
			Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"},
		},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: FakeNodeTaint, Value: "fake", Effect: corev1.TaintEffectNoSchedule}}},
		Status: corev1.NodeStatus{
			Capacity:    capacity,
			Allocatable: capacity,
		},
	}
}

// FakeNodeToleration lets a pod onto fake nodes.
var FakeNodeToleration = corev1.Toleration{Key: FakeNodeTaint, Operator: corev1.TolerationOpEqual, Value: "fake", Effect: corev1.TaintEffectNoSchedule}
