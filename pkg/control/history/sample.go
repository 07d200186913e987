package history

import (
	"encoding/json"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/catalog"
	"github.com/tessera-dev/tessera/pkg/control/queue"
	"github.com/tessera-dev/tessera/pkg/control/sliceintern"
	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
)

// UnknownModel names devices no published slice describes.
const UnknownModel = "unknown"

const gib = 1 << 30

// Rates is what every queue's subtree holds and uses now, per namespace
// and model (GPUs and GiB). A claim counts once, for the queue of the
// first pod in its reservedFor that names one (else the queue of its
// namespace, for managed namespaces); claims of no queue are left out.
// Used GPUs are the SM utilization the kubelet plugin sampled (percent of
// the device / 100), used memory its memory sample; a device not sampled
// yet counts as unused. attrs reads the devices' attributes (nil: the
// slices carry them).
func Rates(queues []*v1alpha1.Queue, pods []*corev1.Pod, claims []*resourceapi.ResourceClaim, slices []*resourceapi.ResourceSlice, attrs *sliceintern.Interner, namespaces []*corev1.Namespace) map[string]map[Key]Amounts {
	cat := catalog.NewCatalog(slices, nil, nil, attrs)
	models := map[string]string{}
	for _, s := range slices {
		if s.Spec.Driver != devicemodel.DriverName {
			continue
		}
		for i, d := range s.Spec.Devices {
			if a, ok := attrs.Attributes(s, i).Get(devicemodel.AttrProductName); ok && a.StringValue != nil {
				models[s.Spec.Pool.Name+"/"+d.Name] = *a.StringValue
			}
		}
	}
	podQueue := map[string]string{} // namespace/name -> queue
	for _, p := range pods {
		if q := p.Labels[v1alpha1.QueueLabel]; q != "" && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			podQueue[p.Namespace+"/"+p.Name] = q
		}
	}
	nsQueue := map[string]string{}
	for _, n := range namespaces {
		if q := n.Labels[v1alpha1.QueueLabel]; q != "" {
			nsQueue[n.Name] = q
		}
	}
	tree := queue.NewTree(queues)
	out := map[string]map[Key]Amounts{}
	for _, c := range claims {
		if c.Status.Allocation == nil || len(c.Status.ReservedFor) == 0 {
			continue
		}
		leaf := ""
		for _, r := range c.Status.ReservedFor {
			if r.Resource == "pods" && podQueue[c.Namespace+"/"+r.Name] != "" {
				leaf = podQueue[c.Namespace+"/"+r.Name]
				break
			}
		}
		if leaf == "" {
			leaf = nsQueue[c.Namespace]
		}
		q := tree.Queues[leaf]
		if q == nil {
			continue
		}
		used := map[string]v1alpha1.DeviceUsage{}
		for _, d := range c.Status.Devices {
			if d.Driver != devicemodel.DriverName || d.Data == nil {
				continue
			}
			var st v1alpha1.DeviceStatus
			if json.Unmarshal(d.Data.Raw, &st) == nil && st.Usage != nil {
				used[d.Pool+"/"+d.Device] = *st.Usage
			}
		}
		for i := range c.Status.Allocation.Devices.Results {
			r := &c.Status.Allocation.Devices.Results[i]
			if r.Driver != devicemodel.DriverName {
				continue
			}
			charge := cat.ChargeResult(r)
			a := Amounts{AllocGPU: float64(charge[queue.GPUs]) / queue.GPU, AllocMem: float64(charge[queue.Memory]) / gib}
			if u, ok := used[r.Pool+"/"+r.Device]; ok {
				a.UsedMem = float64(u.MemoryUsedBytes) / gib
				a.UsedGPU = float64(min(max(u.SMUtilizationPercent, 0), 100)) / 100
			}
			model := models[r.Pool+"/"+r.Device]
			if model == "" {
				model = UnknownModel
			}
			k := Key{c.Namespace, model}
			for n := q; n != nil; n = n.Parent {
				m := out[n.Name]
				if m == nil {
					m = map[Key]Amounts{}
					out[n.Name] = m
				}
				m[k] = m[k].Add(a)
			}
		}
	}
	return out
}
