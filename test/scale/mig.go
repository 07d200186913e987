package scale

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	tesserav1 "github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/node/plugin"
	"github.com/tessera-dev/tessera/test/localcluster"
)

// The dynamic-MIG workload: the same nodes republish the plugin's slices
// with their GPUs in MIG mode (--mock-mig=all, --mig-mode=dynamic: every
// profile x placement, about 200 devices with shared counters per 8 x H100
// node), and MIGPods pods each ask one MIG partition through DeviceClass
// mig.tessera.dev, behind the share queues, against the same number of
// share pods in queues on the ordinary slices, measured right before.
const (
	// MIGSharesName and MIGName are the two workloads' names.
	MIGSharesName, MIGName = "mig-shares", "mig"
	// migClass is the DeviceClass of MIG partitions (the chart's).
	migClass = "mig.tessera.dev"
	// migTemplate is the claim template of the MIG pods.
	migTemplate = "mig"
	// MIGProfile is the partition every MIG pod asks for: the smallest
	// of an H100 80GB, seven to a GPU.
	MIGProfile = "1g.10gb"
)

// migWorkloads are the MIG workload and its baseline, in the order they
// run; none when cfg.MIGPods is 0.
func migWorkloads(cfg Config) []workload {
	if cfg.MIGPods == 0 {
		return nil
	}
	queued := func(template string) func(int, *corev1.Pod) {
		return func(i int, p *corev1.Pod) {
			p.Labels[tesserav1.QueueLabel] = leafQueue(i % cfg.Queues)
			p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &template}}
			p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
		}
	}
	return []workload{
		{name: MIGSharesName, title: fmt.Sprintf("(a) %d pods, a %s share claim each, %d queues (baseline of the MIG run)", cfg.MIGPods, cfg.Share, cfg.Queues),
			pods: cfg.MIGPods, pod: queued(shareTemplate)},
		{name: MIGName, title: fmt.Sprintf("(m) %d pods, a MIG %s each, %d queues, nodes in dynamic MIG mode", cfg.MIGPods, MIGProfile, cfg.Queues),
			pods: cfg.MIGPods, pod: queued(migTemplate), setup: migSetup},
	}
}

// migClaimTemplate asks one partition of MIGProfile.
func migClaimTemplate() *resourceapi.ResourceClaimTemplate {
	return &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: migTemplate},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: migClass,
				AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
				Count:           1,
				Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
					Expression: fmt.Sprintf("device.attributes[%q].migProfile == %q", devicemodel.DriverName, MIGProfile),
				}}},
			}}},
		}}},
	}
}

// migSetup creates the MIG claim template in ns and republishes every
// node's slices in dynamic MIG mode; the restore it returns republishes
// the ordinary ones (call it once the workload's claims are gone).
func migSetup(ctx context.Context, h *harness, ns string) (func(context.Context) error, error) {
	if _, err := h.cs.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, migClaimTemplate(), metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	if err := republish(ctx, h.cs, h.cfg, true, h.logf); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error { return republish(ctx, h.cs, h.cfg, false, h.logf) }, nil
}

// devicesPerNode is how many devices the plugin publishes for a node of
// profile, with its GPUs in dynamic MIG mode or not.
func devicesPerNode(ctx context.Context, profile string, mig bool) (int, error) {
	opts, err := pluginOptions(profile, mig)
	if err != nil {
		return 0, err
	}
	slices, err := plugin.NodeSlices(ctx, opts, nodeName(0))
	if err != nil {
		return 0, err
	}
	n := 0
	for _, s := range slices {
		n += len(s.Spec.Devices)
	}
	return n, nil
}

// pluginOptions are the kubelet plugin's options for the run's mock
// profile, its GPUs in MIG mode (dynamic) or not.
func pluginOptions(profile string, mig bool) (*plugin.Options, error) {
	opts := &plugin.Options{}
	fs := pflag.NewFlagSet("kubelet-plugin", pflag.ContinueOnError)
	opts.AddFlags(fs)
	args := []string{"--gpu-backend=mock", "--mock-profile=" + profile}
	if mig {
		args = append(args, "--mock-mig=all", "--mig-mode=dynamic")
	}
	return opts, fs.Parse(args)
}

// republish replaces every fake node's ResourceSlices by those the plugin
// builds with MIG on or off, under a new pool generation, and waits until
// the API lists them all.
func republish(ctx context.Context, cs kubernetes.Interface, cfg Config, mig bool, logf localcluster.Logf) error {
	opts, err := pluginOptions(cfg.Profile, mig)
	if err != nil {
		return err
	}
	gen := time.Now().UnixNano() // newer than any generation before
	start := time.Now()
	// The slices to replace, listed once from the API server's watch cache:
	// a DeleteCollection per node lists every slice of the cluster from
	// etcd to filter it (tens of MB once the nodes publish MIG devices),
	// and a worker's calls at once ran past the API server's timeout.
	old, err := cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{ResourceVersion: "0",
		FieldSelector: fields.OneTermEqualSelector("spec.driver", devicemodel.DriverName).String()})
	if err != nil {
		return fmt.Errorf("listing the ResourceSlices to replace: %w", err)
	}
	byNode := map[string][]string{}
	for _, s := range old.Items {
		if s.Spec.NodeName != nil {
			byNode[*s.Spec.NodeName] = append(byNode[*s.Spec.NodeName], s.Name)
		}
	}
	var devices, count atomic.Int64
	err = parallel(ctx, cfg.Nodes, cfg.Workers, func(ctx context.Context, i int) error {
		name := nodeName(i)
		slices, err := plugin.NodeSlices(ctx, opts, name)
		if err != nil {
			return err
		}
		for _, s := range byNode[name] {
			if err := cs.ResourceV1().ResourceSlices().Delete(ctx, s, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("deleting ResourceSlice %s of %s: %w", s, name, err)
			}
		}
		for _, s := range slices {
			s.Spec.Pool.Generation = gen
			if _, err := cs.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("ResourceSlice %s: %w", s.Name, err)
			}
			devices.Add(int64(len(s.Spec.Devices)))
		}
		count.Add(int64(len(slices)))
		return nil
	})
	if err != nil {
		return err
	}
	want := count.Load()
	err = waitUntil(ctx, 2*time.Minute, "the republished ResourceSlices", func() (bool, error) {
		l, err := cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		n := int64(0)
		for _, s := range l.Items {
			if s.Spec.Pool.Generation == gen {
				n++
			}
		}
		return n == want && int64(len(l.Items)) >= want, nil
	})
	if err != nil {
		return err
	}
	// The scheduler's and the controller's informers follow the watch.
	time.Sleep(republishSettle)
	logf("republished %d ResourceSlices (%d devices, %d per node) with MIG %s in %s", want, devices.Load(), devices.Load()/int64(cfg.Nodes), onOff(mig), time.Since(start).Round(100*time.Millisecond))
	return nil
}

// republishSettle is how long a republish waits after the API lists the
// new slices, for the informers of the scheduler and the controller.
const republishSettle = 5 * time.Second

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}
