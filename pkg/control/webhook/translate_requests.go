package webhook

// What one container (or, for KAI, the pod) asks in another system's terms,
// read into a containerRequest.

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// deviceRequest reads a container's nvidia.com/gpu and HAMi resources.
func (c TranslateConfig) deviceRequest(ac indexedContainer, inv Inventory) (*containerRequest, error) {
	ctr, path := ac.c, ac.path
	for name := range ctr.Resources.Limits {
		n := string(name)
		if strings.HasPrefix(n, "nvidia.com/mig-") {
			return nil, refuse(path.Child("resources", "limits").Key(n), "MIG devices of the device plugin are not translated: ask for a MIG device with a ResourceClaimTemplate on device class mig.tessera.dev (a selector on attribute migProfile)")
		}
		if n == ResHAMiPriority {
			return nil, refuse(path.Child("resources", "limits").Key(n), "HAMi's task priority has no Tessera equivalent: remove it (Tessera orders work by queue and PriorityClass)")
		}
	}
	gpus, hasGPU, err := quantity(ctr, ResNvidiaGPU, path)
	if err != nil {
		return nil, err
	}
	shared, hasShared, err := quantity(ctr, ResNvidiaGPUShared, path)
	if err != nil {
		return nil, err
	}
	mem, hasMem, err := quantity(ctr, ResHAMiMem, path)
	if err != nil {
		return nil, err
	}
	pct, hasPct, err := quantity(ctr, ResHAMiMemPct, path)
	if err != nil {
		return nil, err
	}
	cores, hasCores, err := quantity(ctr, ResHAMiCores, path)
	if err != nil {
		return nil, err
	}
	hami := hasMem || hasPct || hasCores
	if !hasGPU && !hasShared && !hami {
		return nil, nil
	}
	r := &containerRequest{index: ac.index, init: ac.init, path: path}
	lim := path.Child("resources", "limits")
	if hasShared {
		if hasGPU || hami {
			return nil, refuse(lim.Key(ResNvidiaGPUShared), "nvidia.com/gpu.shared (time-sliced replicas) next to nvidia.com/gpu or HAMi's resources: ask for one of them")
		}
		if shared < 1 || shared > maxTranslatedDevices {
			return nil, refuse(lim.Key(ResNvidiaGPUShared), "%d is out of range: 1 to %d", shared, maxTranslatedDevices)
		}
		r.count, r.timeSlc = shared, true
		r.what = []string{fmt.Sprintf("%s: %d", ResNvidiaGPUShared, shared)}
		return r, nil
	}
	if !hasGPU {
		gpus = 1 // HAMi's defaultGPUNum
	}
	if gpus < 1 || gpus > maxTranslatedDevices {
		if gpus == 0 && !hami {
			return nil, nil // nvidia.com/gpu: 0 asks for nothing
		}
		return nil, refuse(lim.Key(ResNvidiaGPU), "%d is out of range: 1 to %d GPUs", gpus, maxTranslatedDevices)
	}
	r.count = gpus
	r.what = []string{fmt.Sprintf("%s: %d", ResNvidiaGPU, gpus)}
	if !hami {
		if c.DevicePlugin == DevicePluginTimeSlice {
			r.timeSlc = true
		} else {
			r.wholeGPU = true
		}
		return r, nil
	}
	if hasCores {
		if cores > 100 {
			return nil, refuse(lim.Key(ResHAMiCores), "%d is out of range: 0 to 100 (percent of each GPU's SMs); HAMi clamps it, Tessera does not guess: write 100", cores)
		}
		r.cores = cores
		r.what = append(r.what, fmt.Sprintf("%s: %d", ResHAMiCores, cores))
	}
	switch {
	case hasMem && mem > 0:
		if max := maxMemory(inv); max > 0 && mem > max {
			return nil, refuse(lim.Key(ResHAMiMem), "%d MiB fits no GPU of the cluster (the largest publishes %d MiB usable)", mem, max)
		}
		r.memMiB = mem
		r.what = append(r.what, fmt.Sprintf("%s: %d", ResHAMiMem, mem))
		if hasPct {
			r.what = append(r.what, ResHAMiMemPct+" ignored (gpumem wins, as on HAMi)")
		}
	case hasPct && pct > 0:
		if pct > 100 {
			return nil, refuse(lim.Key(ResHAMiMemPct), "%d is out of range: 1 to 100 (percent of each GPU's memory)", pct)
		}
		r.what = append(r.what, fmt.Sprintf("%s: %d", ResHAMiMemPct, pct))
		if pct == 100 && (r.cores == 0 || r.cores == 100) {
			r.wholeGPU, r.cores = true, 0
			break
		}
		base, err := c.baseMemory(inv, lim.Key(ResHAMiMemPct))
		if err != nil {
			return nil, err
		}
		r.memMiB = base * pct / 100
	default:
		// nvidia.com/gpu with gpucores only: HAMi gives all the memory.
		if r.cores == 0 || r.cores == 100 {
			r.wholeGPU, r.cores = true, 0
			break
		}
		base, err := c.baseMemory(inv, lim.Key(ResHAMiCores))
		if err != nil {
			return nil, err
		}
		r.memMiB = base
	}
	return r, nil
}

// kaiRequest reads KAI's fraction annotations.
func (c TranslateConfig) kaiRequest(p *corev1.Pod, all []indexedContainer, inv Inventory) (*containerRequest, error) {
	ann := p.Annotations
	path := field.NewPath("metadata", "annotations")
	target := all[len(p.Spec.InitContainers)] // KAI's default: container index 0
	if name, ok := ann[AnnKAIContainer]; ok {
		i := slices.IndexFunc(all, func(ac indexedContainer) bool { return ac.c.Name == name })
		if i < 0 {
			return nil, refuse(path.Key(AnnKAIContainer), "no container or init container is named %q", name)
		}
		target = all[i]
	}
	r := &containerRequest{index: target.index, init: target.init, path: target.path, count: 1}
	if v, ok := ann[AnnKAINumDevices]; ok {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || n < 1 || n > maxTranslatedDevices {
			return nil, refuse(path.Key(AnnKAINumDevices), "%q is out of range: an integer from 1 to %d", v, maxTranslatedDevices)
		}
		r.count = n
		r.what = append(r.what, AnnKAINumDevices+"="+v)
	}
	f, hasF := ann[AnnKAIFraction]
	m, hasM := ann[AnnKAIMemory]
	switch {
	case hasF && hasM:
		return nil, refuse(path.Key(AnnKAIMemory), "gpu-memory and gpu-fraction on one pod: KAI refuses this too; keep one")
	case hasF:
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || math.IsNaN(v) || v <= 0 || v >= 1 {
			return nil, refuse(path.Key(AnnKAIFraction), "%q is out of range: a number greater than 0 and smaller than 1 (a whole GPU is resources.limits nvidia.com/gpu: 1)", f)
		}
		base, err := c.baseMemory(inv, path.Key(AnnKAIFraction))
		if err != nil {
			return nil, err
		}
		r.memMiB = int64(math.Ceil(v * float64(base)))
		if r.memMiB < 256 {
			return nil, refuse(path.Key(AnnKAIFraction), "%s of %d MiB is %d MiB, below the smallest share (256 MiB)", f, base, r.memMiB)
		}
		r.what = append([]string{AnnKAIFraction + "=" + f}, r.what...)
	default:
		v, err := strconv.ParseInt(strings.TrimSpace(m), 10, 64)
		if err != nil || v <= 0 {
			return nil, refuse(path.Key(AnnKAIMemory), "%q is not a positive integer (MiB)", m)
		}
		if max := maxMemory(inv); max > 0 && v > max {
			return nil, refuse(path.Key(AnnKAIMemory), "%d MiB fits no GPU of the cluster (the largest publishes %d MiB usable)", v, max)
		}
		r.memMiB = v
		r.what = append([]string{AnnKAIMemory + "=" + m}, r.what...)
	}
	return r, nil
}

func maxMemory(inv Inventory) int64 {
	if len(inv.MemoryMiB) == 0 {
		return 0
	}
	return inv.MemoryMiB[len(inv.MemoryMiB)-1]
}

// baseMemory is the GPU memory fractions are of.
func (c TranslateConfig) baseMemory(inv Inventory, path *field.Path) (int64, error) {
	if c.GPUMemoryMiB > 0 {
		return c.GPUMemoryMiB, nil
	}
	switch len(inv.MemoryMiB) {
	case 0:
		return 0, refuse(path, "a fraction of a GPU needs the GPU's memory, and no GPU of driver %s is published (the platform can set translation.gpuMemoryMiB); or ask for capacity.requests.memory in a ResourceClaimTemplate", c.Driver)
	case 1:
		return inv.MemoryMiB[0], nil
	default:
		return 0, refuse(path, "a fraction of which GPU? the cluster's GPUs publish different memory (%v MiB) and the platform sets no translation.gpuMemoryMiB: use annotation gpu-memory / resource nvidia.com/gpumem in MiB, or capacity.requests.memory in a ResourceClaimTemplate", inv.MemoryMiB)
	}
}

// hamiSelectors turns HAMi's GPU type and UUID annotations into CEL
// selectors over the driver's attributes. Values are checked against a
// strict pattern before they reach an expression.
func (c TranslateConfig) hamiSelectors(ann map[string]string, inv Inventory) ([]string, []string, error) {
	var sels, what []string
	attr := fmt.Sprintf("device.attributes[%q]", c.Driver)
	path := field.NewPath("metadata", "annotations")
	for _, k := range []string{AnnHAMiUseType, AnnHAMiNoUseType} {
		v, ok := ann[k]
		if !ok || strings.TrimSpace(v) == "" {
			continue
		}
		var terms []string
		known := false
		for _, t := range strings.Split(v, ",") {
			t = strings.TrimSpace(t)
			if !gpuTypeRE.MatchString(t) {
				return nil, nil, refuse(path.Key(k), "GPU type %q is not a product name (letters, digits, space, '.', '_', '-'): select GPUs with a CEL selector on attribute productName in a ResourceClaimTemplate", t)
			}
			known = known || slices.ContainsFunc(inv.Products, func(p string) bool {
				return strings.Contains(strings.ToLower(p), strings.ToLower(t))
			})
			terms = append(terms, fmt.Sprintf("%s.productName.lowerAscii().contains(%q)", attr, strings.ToLower(t)))
		}
		if k == AnnHAMiUseType && len(inv.Products) > 0 && !known {
			return nil, nil, refuse(path.Key(k), "GPU types %q match no GPU of the cluster (products: %s): name a product the cluster has, or select GPUs with a CEL selector on attribute productName in a ResourceClaimTemplate", v, strings.Join(inv.Products, ", "))
		}
		expr := "(" + strings.Join(terms, " || ") + ")"
		if k == AnnHAMiNoUseType {
			expr = "!" + expr
		}
		sels = append(sels, expr)
		what = append(what, k+"="+v+" -> selector on productName")
	}
	for _, k := range []string{AnnHAMiUseUUID, AnnHAMiNoUseUUID} {
		v, ok := ann[k]
		if !ok || strings.TrimSpace(v) == "" {
			continue
		}
		var ids []string
		for _, u := range strings.Split(v, ",") {
			u = strings.TrimSpace(u)
			if !gpuUUIDRE.MatchString(u) {
				return nil, nil, refuse(path.Key(k), "%q is not a GPU UUID (GPU-...)", u)
			}
			ids = append(ids, strconv.Quote(u))
		}
		expr := fmt.Sprintf("%s.uuid in [%s]", attr, strings.Join(ids, ", "))
		if k == AnnHAMiNoUseUUID {
			expr = "!(" + expr + ")"
		}
		sels = append(sels, expr)
		what = append(what, k+" -> selector on uuid")
	}
	return sels, what, nil
}
