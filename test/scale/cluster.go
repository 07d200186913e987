package scale

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	tesserav1 "github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/node/plugin"
	"github.com/tessera-dev/tessera/test/localcluster"
)

// Names of what the harness creates.
const (
	parentQueue = "scale"
	gangQueue   = "scale-gangs"
	// shareTemplate and wholeTemplate are the ResourceClaimTemplates every
	// workload namespace gets.
	shareTemplate = "share"
	wholeTemplate = "whole"
)

// leafQueue is the name of share queue i.
func leafQueue(i int) string { return fmt.Sprintf("scale-%02d", i) }

// ClusterOptions are the local-cluster options of a scale run: Tessera from
// its Helm chart with the controller, and the client rate limits of the
// upstream components lifted as kwokctl's --disable-qps-limits does (their
// defaults, 50 QPS for the scheduler and 20 for the controller-manager,
// would measure the defaults rather than the system). Tessera's controller
// keeps its own defaults: they are ours to measure.
//
// The API server deletes collections with 16 workers instead of its one:
// between workloads the harness deletes 4,000 pods and the namespace
// controller their claims and events, each a DeleteCollection, which with
// one worker took 1.5 to 3 minutes per workload (about 10 of a full run's
// minutes). Nothing is measured while they run.
func ClusterOptions(logf localcluster.Logf) localcluster.Options {
	unlimited := []string{"--kube-api-qps=5000", "--kube-api-burst=10000"}
	return localcluster.Options{
		Install:    localcluster.InstallChart,
		Controller: true,
		ComponentArgs: map[string][]string{
			"kube-apiserver":          {"--delete-collection-workers=16"},
			"kube-scheduler":          unlimited,
			"kube-controller-manager": append([]string{"--concurrent-resourceclaim-syncs=50"}, unlimited...),
		},
		// The chart's local-cluster values log at 4 and probe the plugin
		// every 2 s for the e2e tests; production verbosity and probe
		// period here, or the logs and probes are part of what is measured.
		ChartValues: map[string]any{
			"controller":    map[string]any{"logVerbosity": 2},
			"kubeletPlugin": map[string]any{"healthcheck": map[string]any{"periodSeconds": 10, "failureThreshold": 3, "startupFailureThreshold": 30}},
		},
		Logf: logf,
	}
}

// nodeName is the name of fake node i.
func nodeName(i int) string { return fmt.Sprintf("kwok-node-%04d", i) }

// setUp creates the fake nodes, publishes every node's ResourceSlices as
// the kubelet plugin would for cfg.Profile (the plugin's own discover →
// model → publish path over a mock node seeded with the node's name) and
// creates the queues. It returns the number of GPUs and of devices per
// node.
func setUp(ctx context.Context, cs kubernetes.Interface, cl client.Client, cfg Config, logf localcluster.Logf) (gpus, devices int, err error) {
	opts, err := pluginOptions(cfg.Profile, false)
	if err != nil {
		return 0, 0, err
	}
	probe, err := plugin.NodeSlices(ctx, opts, nodeName(0))
	if err != nil {
		return 0, 0, fmt.Errorf("the plugin's model of %q: %w", cfg.Profile, err)
	}
	for _, s := range probe {
		devices += len(s.Spec.Devices)
		for _, d := range s.Spec.Devices {
			if a, ok := d.Attributes["type"]; ok && a.StringValue != nil && *a.StringValue == "gpu" {
				gpus++
			}
		}
	}
	if err := cfg.Validate(gpus); err != nil {
		return 0, 0, err
	}
	start := time.Now()
	var created atomic.Int64
	err = parallel(ctx, cfg.Nodes, cfg.Workers, func(ctx context.Context, i int) error {
		name := nodeName(i)
		if _, err := cs.CoreV1().Nodes().Create(ctx, localcluster.FakeNode(name, nil), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("node %s: %w", name, err)
		}
		slices, err := plugin.NodeSlices(ctx, opts, name)
		if err != nil {
			return err
		}
		for _, s := range slices {
			if _, err := cs.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("ResourceSlice %s: %w", s.Name, err)
			}
			created.Add(1)
		}
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	logf("created %d fake nodes of %s (%d GPUs each) and %d ResourceSlices in %s", cfg.Nodes, cfg.Profile, gpus, created.Load(), time.Since(start).Round(100*time.Millisecond))
	if err := waitNodesReady(ctx, cs, cfg.Nodes, logf); err != nil {
		return 0, 0, err
	}
	return gpus, devices, createQueues(ctx, cl, cfg)
}

// waitNodesReady waits until the kwok controller has made every fake node
// Ready.
func waitNodesReady(ctx context.Context, cs kubernetes.Interface, n int, logf localcluster.Logf) error {
	start := time.Now()
	for {
		nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: localcluster.FakeNodeLabel + "=true"})
		if err != nil {
			return err
		}
		ready := 0
		for _, node := range nodes.Items {
			for _, c := range node.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		if ready >= n {
			logf("%d fake nodes Ready (%s)", ready, time.Since(start).Round(100*time.Millisecond))
			return nil
		}
		if time.Since(start) > 3*time.Minute {
			return fmt.Errorf("only %d of %d fake nodes Ready after 3 minutes (is the kwok controller running? see its log)", ready, n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// createQueues creates the share queues (each with the quota its pods need,
// so that quota admits them all and what is measured is the path) under one
// parent, and the gang queue with a GPU quota for the largest gang.
func createQueues(ctx context.Context, cl client.Client, cfg Config) error {
	share := resource.MustParse(cfg.Share)
	perQueue := (cfg.Pods + cfg.Queues - 1) / cfg.Queues
	quota := resource.NewQuantity(share.Value()*int64(perQueue), resource.BinarySI)
	gpus := resource.NewQuantity(int64(max(cfg.BigGang, cfg.Gangs*cfg.GangSize)), resource.DecimalSI)
	queues := []*tesserav1.Queue{{ObjectMeta: metav1.ObjectMeta{Name: parentQueue}}}
	for i := range cfg.Queues {
		queues = append(queues, &tesserav1.Queue{
			ObjectMeta: metav1.ObjectMeta{Name: leafQueue(i)},
			Spec: tesserav1.QueueSpec{Parent: parentQueue, Resources: map[tesserav1.ResourceName]tesserav1.QueueResource{
				tesserav1.ResourceGPUMemory: {Quota: quota},
			}},
		})
	}
	queues = append(queues, &tesserav1.Queue{
		ObjectMeta: metav1.ObjectMeta{Name: gangQueue},
		Spec: tesserav1.QueueSpec{Parent: parentQueue, Resources: map[tesserav1.ResourceName]tesserav1.QueueResource{
			tesserav1.ResourceGPUs: {Quota: gpus},
		}},
	})
	for _, q := range queues {
		if err := cl.Create(ctx, q); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("queue %s: %w", q.Name, err)
		}
	}
	return nil
}

// claimTemplates are the templates every workload namespace gets: a share
// of cfg.Share and a whole GPU (a claim that names no capacity).
func claimTemplates(cfg Config) []*resourceapi.ResourceClaimTemplate {
	request := func(name string, capacity *resourceapi.CapacityRequirements) *resourceapi.ResourceClaimTemplate {
		return &resourceapi.ResourceClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
				Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
					DeviceClassName: localcluster.DriverName,
					Capacity:        capacity,
				}}},
			}}},
		}
	}
	return []*resourceapi.ResourceClaimTemplate{
		request(shareTemplate, &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			"memory": resource.MustParse(cfg.Share),
		}}),
		request(wholeTemplate, nil),
	}
}

// scheme is what the controller-runtime client of the harness knows.
func scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := tesserav1.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, nil
}

// parallel runs fn for 0..n-1 on workers goroutines and returns the first
// error (the others stop early).
func parallel(ctx context.Context, n, workers int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan int)
	var (
		wg       sync.WaitGroup
		once     sync.Once
		firstErr error
	)
	for range min(workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := fn(ctx, i); err != nil {
					once.Do(func() { firstErr = err; cancel() })
				}
			}
		}()
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}
