package webhook

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/sliceintern"
)

// Translation of pods written for other GPU systems (the NVIDIA device
// plugin, HAMi, KAI) into ResourceClaims of Tessera's classes, at pod
// creation (docs/migration.md). Translate is a pure function of the pod,
// the configuration and the GPUs the cluster publishes; PodTranslator
// (translate_handler.go) serves it.

// Keys the translation reads and writes.
const (
	// TranslatedAnnotation records on a translated pod what was translated
	// into what. Only the translating webhook writes it: it overwrites a
	// value the pod came with, and the chart's policy refuses it from
	// anyone else (docs/security.md).
	TranslatedAnnotation = v1alpha1.TranslatedAnnotation
	// ManagedTemplateLabel marks the ResourceClaimTemplates the translation
	// makes (value ManagedTemplateValue); only the controller creates,
	// changes or deletes them (the chart's policy), and it deletes those
	// no pod uses any more.
	ManagedTemplateLabel = "tessera.dev/managed-by"
	ManagedTemplateValue = "translation"
	// ManagedTemplatePrefix starts every managed template's name; the rest
	// is a hash of its spec, so equal requests share a template.
	ManagedTemplatePrefix = "tessera-translated-"
	// LastUsedAnnotation on a managed template is when a pod last named it
	// (RFC 3339); the controller deletes templates unused for a while.
	LastUsedAnnotation = "tessera.dev/last-used"
	// TranslateNamespaceLabel, "enabled" on a namespace, opts it in to
	// translation when the chart does not translate cluster-wide.
	TranslateNamespaceLabel = "tessera.dev/translate"
	// translatedClaimPrefix names the pod's claim entries the translation adds.
	translatedClaimPrefix = "tessera-gpu-"
)

// Their keys (docs/migration.md lists where each comes from).
const (
	ResNvidiaGPU       = "nvidia.com/gpu"
	ResNvidiaGPUShared = "nvidia.com/gpu.shared"
	ResHAMiMem         = "nvidia.com/gpumem"
	ResHAMiMemPct      = "nvidia.com/gpumem-percentage"
	ResHAMiCores       = "nvidia.com/gpucores"
	ResHAMiPriority    = "nvidia.com/priority"

	AnnHAMiUseType    = "nvidia.com/use-gputype"
	AnnHAMiNoUseType  = "nvidia.com/nouse-gputype"
	AnnHAMiUseUUID    = "nvidia.com/use-gpuuuid"
	AnnHAMiNoUseUUID  = "nvidia.com/nouse-gpuuuid"
	AnnHAMiVGPUMode   = "nvidia.com/vgpu-mode"
	AnnKAIFraction    = "gpu-fraction"
	AnnKAIMemory      = "gpu-memory"
	AnnKAINumDevices  = "gpu-fraction-num-devices"
	AnnKAIContainer   = "gpu-fraction-container-name"
	AnnKAIMPS         = "mps"
	LabelKAIQueue     = "kai.scheduler/queue"
	LabelRunAIQueue   = "runai/queue"
	KAISchedulerName  = "kai-scheduler"
	HAMiSchedulerName = "hami-scheduler"
)

// hamiIgnoredAnnotations are HAMi's placement preferences: they choose
// among fitting GPUs and nodes, not what a pod gets; they stay on the pod
// and are not translated (a warning says so).
var hamiIgnoredAnnotations = []string{"hami.io/gpu-scheduler-policy", "hami.io/node-scheduler-policy", "nvidia.com/numa-bind", "hami.io/device-scoring-weights"}

// Device plugin modes: what nvidia.com/gpu: N meant on the old cluster.
const (
	DevicePluginWhole     = "whole"
	DevicePluginTimeSlice = "timeslice"
)

// Bounds of what translation accepts.
const (
	maxTranslatedDevices = 16
)

// TranslateConfig is the platform's choice (chart values translation.*).
type TranslateConfig struct {
	// Driver is the DRA driver name (gpu.tessera.dev).
	Driver string
	// GPUClass (whole GPUs and shares) and TimeSliceClass name Tessera's
	// classes; no other class is ever written.
	GPUClass, TimeSliceClass string
	// DevicePlugin says what a plain nvidia.com/gpu: N meant: whole
	// (default) or timeslice (the old cluster time-sliced GPUs).
	DevicePlugin string
	// QueueNames maps KAI queue names onto Tessera queues; a name not in
	// it is kept.
	QueueNames map[string]string
	// SchedulerNames are schedulers (kai-scheduler, hami-scheduler) whose
	// pods go to the default scheduler; other schedulerNames are kept.
	SchedulerNames []string
	// GPUMemoryMiB is the GPU memory fractions and percentages are of; 0:
	// the usable memory the cluster's GPUs publish, when they all agree.
	GPUMemoryMiB int64
}

// Inventory is what the cluster's GPUs publish (the translation reads it
// to size fractions and check selectors).
type Inventory struct {
	// MemoryMiB are the distinct usable memories (MiB) of the GPUs.
	MemoryMiB []int64
	// Products are the distinct product names.
	Products []string
}

// InventoryFromSlices reads the GPUs (type gpu) of driver from slices;
// attrs reads their attributes (nil: the slices carry them).
func InventoryFromSlices(driver string, list []resourceapi.ResourceSlice, attrs *sliceintern.Interner) Inventory {
	mem, prod := map[int64]bool{}, map[string]bool{}
	for i := range list {
		if list[i].Spec.Driver != driver {
			continue
		}
		for j, d := range list[i].Spec.Devices {
			a := attrs.Attributes(&list[i], j)
			if t, _ := a.Get("type"); t.StringValue == nil || *t.StringValue != "gpu" {
				continue
			}
			if c, ok := d.Capacity["memory"]; ok {
				mem[c.Value.Value()>>20] = true
			}
			if p, _ := a.Get("productName"); p.StringValue != nil {
				prod[*p.StringValue] = true
			}
		}
	}
	var inv Inventory
	for m := range mem {
		inv.MemoryMiB = append(inv.MemoryMiB, m)
	}
	for p := range prod {
		inv.Products = append(inv.Products, p)
	}
	slices.Sort(inv.MemoryMiB)
	slices.Sort(inv.Products)
	return inv
}

// Translation is what Translate made of a pod.
type Translation struct {
	// Pod is the translated pod (a copy); nil when nothing was translated.
	Pod *corev1.Pod
	// Templates are the managed templates the pod's claims name (in the
	// pod's namespace).
	Templates []*resourceapi.ResourceClaimTemplate
	// Summary is the value of TranslatedAnnotation.
	Summary  string
	Warnings []string
}

// TranslateError says why a pod cannot be translated: the field and the
// Tessera way to write it.
type TranslateError struct{ Path, Msg string }

func (e *TranslateError) Error() string {
	return "cannot translate this pod into Tessera ResourceClaims (docs/migration.md): " + e.Path + ": " + e.Msg
}

func refuse(path *field.Path, format string, a ...any) error {
	return &TranslateError{Path: path.String(), Msg: fmt.Sprintf(format, a...)}
}

// containerRequest is what one container asked, in their terms.
type containerRequest struct {
	index    int // in initContainers ++ containers
	init     bool
	path     *field.Path
	count    int64 // GPUs (devices)
	memMiB   int64 // per GPU; 0: the whole GPU
	cores    int64 // per GPU; 0: none asked
	timeSlc  bool
	wholeGPU bool // no memory or cores: an exclusive GPU
	what     []string
}

var (
	gpuTypeRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9 ._-]{0,62}$`)
	gpuUUIDRE  = regexp.MustCompile(`^(GPU|MIG)-[0-9a-fA-F-]{1,60}$`)
	nativeHint = "write a ResourceClaimTemplate on device class gpu.tessera.dev (capacity.requests.memory, capacity.requests.cores) and name it in spec.resourceClaims and the container's resources.claims"
)

// Translate turns the pod's device-plugin, HAMi and KAI requests into
// claims on Tessera's classes. It returns a nil Pod when the pod has
// nothing to translate (it may still carry warnings), and a
// *TranslateError when it cannot translate the pod faithfully.
func (c TranslateConfig) Translate(pod *corev1.Pod, inv Inventory) (*Translation, error) {
	out := &Translation{}
	p := pod.DeepCopy()
	var summary []string
	forged := false
	if _, ok := p.Annotations[TranslatedAnnotation]; ok {
		delete(p.Annotations, TranslatedAnnotation)
		forged = true
		out.Warnings = append(out.Warnings, "annotation "+TranslatedAnnotation+" is written by Tessera's translation only: the value the pod came with was removed")
	}
	ann := p.Annotations
	meta := field.NewPath("metadata")

	// Which systems' keys the pod carries.
	hamiAnn, kaiAnn := []string{}, []string{}
	for _, k := range []string{AnnHAMiUseType, AnnHAMiNoUseType, AnnHAMiUseUUID, AnnHAMiNoUseUUID, AnnHAMiVGPUMode} {
		if _, ok := ann[k]; ok {
			hamiAnn = append(hamiAnn, k)
		}
	}
	for _, k := range []string{AnnKAIFraction, AnnKAIMemory, AnnKAINumDevices, AnnKAIContainer, AnnKAIMPS} {
		if _, ok := ann[k]; ok {
			kaiAnn = append(kaiAnn, k)
		}
	}
	all := allContainers(p)
	hamiRes, gpuRes := false, false
	for _, ac := range all {
		for name := range ac.c.Resources.Limits {
			switch string(name) {
			case ResHAMiMem, ResHAMiMemPct, ResHAMiCores, ResHAMiPriority:
				hamiRes = true
			case ResNvidiaGPU, ResNvidiaGPUShared:
				gpuRes = true
			default:
				if strings.HasPrefix(string(name), "nvidia.com/mig-") {
					gpuRes = true
				}
			}
		}
		for name := range ac.c.Resources.Requests {
			switch string(name) {
			case ResHAMiMem, ResHAMiMemPct, ResHAMiCores, ResHAMiPriority:
				hamiRes = true
			case ResNvidiaGPU, ResNvidiaGPUShared:
				gpuRes = true
			}
		}
	}
	kaiFraction := slices.Contains(kaiAnn, AnnKAIFraction) || slices.Contains(kaiAnn, AnnKAIMemory)
	if kaiFraction && hamiRes {
		return nil, refuse(meta.Child("annotations").Key(kaiAnn[0]), "the pod carries both KAI's fraction annotations (%s) and HAMi's resources (nvidia.com/gpumem, gpumem-percentage, gpucores): two systems' keys on one pod; keep one of them, or %s", strings.Join(kaiAnn, ", "), nativeHint)
	}
	if kaiFraction && gpuRes {
		return nil, refuse(meta.Child("annotations").Key(AnnKAIFraction), "a GPU fraction (annotations gpu-fraction/gpu-memory) and a whole-GPU limit (nvidia.com/gpu) on one pod: KAI refuses this too; ask for one of them")
	}
	if len(kaiAnn) > 0 && !kaiFraction {
		return nil, refuse(meta.Child("annotations").Key(kaiAnn[0]), "needs annotation gpu-fraction or gpu-memory")
	}
	if len(hamiAnn) > 0 && !hamiRes && !gpuRes {
		return nil, refuse(meta.Child("annotations").Key(hamiAnn[0]), "HAMi's GPU selection annotations need a GPU request (resources.limits nvidia.com/gpu)")
	}
	var systems []string
	if gpuRes && !hamiRes && len(hamiAnn) == 0 && !kaiFraction {
		systems = append(systems, "device-plugin")
	}
	if hamiRes || len(hamiAnn) > 0 || p.Spec.SchedulerName == HAMiSchedulerName {
		systems = append(systems, "hami")
	}
	_, kaiLabel := p.Labels[LabelKAIQueue]
	_, runaiLabel := p.Labels[LabelRunAIQueue]
	if kaiFraction || len(kaiAnn) > 0 || kaiLabel || runaiLabel || p.Spec.SchedulerName == KAISchedulerName {
		systems = append(systems, "kai")
	}
	from := "from " + strings.Join(systems, "+")
	foreignDevices := kaiFraction || hamiRes || gpuRes
	if foreignDevices && len(p.Spec.ResourceClaims) > 0 {
		return nil, refuse(field.NewPath("spec", "resourceClaims"), "the pod asks for GPUs both with ResourceClaims and with another system's keys (nvidia.com/gpu, HAMi's resources or KAI's annotations): two systems' keys on one pod; ask all of them with claims")
	}

	// Queue labels and the scheduler.
	queueChanged := false
	kq, kok := p.Labels[LabelKAIQueue]
	rq, rok := p.Labels[LabelRunAIQueue]
	if kok && rok && kq != rq {
		return nil, refuse(meta.Child("labels").Key(LabelRunAIQueue), "names queue %q and label %s names %q: keep one queue label", rq, LabelKAIQueue, kq)
	}
	if kok || rok {
		src, q := LabelKAIQueue, kq
		if !kok {
			src, q = LabelRunAIQueue, rq
		}
		mapped := q
		if m, ok := c.QueueNames[q]; ok {
			mapped = m
		}
		if errs := validateLabelValue(mapped); errs != "" {
			return nil, refuse(meta.Child("labels").Key(src), "queue %q maps to %q, not a valid label value: %s", q, mapped, errs)
		}
		if own, ok := p.Labels[v1alpha1.QueueLabel]; ok && own != mapped {
			return nil, refuse(meta.Child("labels").Key(v1alpha1.QueueLabel), "names queue %q and label %s names %q (Tessera queue %q): two systems' queue labels that disagree; keep one", own, src, q, mapped)
		}
		if _, ok := p.Labels[v1alpha1.QueueLabel]; !ok {
			p.Labels[v1alpha1.QueueLabel] = mapped
			queueChanged = true
			summary = append(summary, fmt.Sprintf("label %s=%s -> %s=%s", src, q, v1alpha1.QueueLabel, mapped))
		}
	}
	if p.Spec.SchedulerName != "" && slices.Contains(c.SchedulerNames, p.Spec.SchedulerName) {
		summary = append(summary, fmt.Sprintf("schedulerName %s -> the default scheduler", p.Spec.SchedulerName))
		p.Spec.SchedulerName = ""
	} else if p.Spec.SchedulerName == KAISchedulerName || p.Spec.SchedulerName == HAMiSchedulerName {
		out.Warnings = append(out.Warnings, fmt.Sprintf("spec.schedulerName %s is kept (the platform does not move its pods to the default scheduler): the pod waits for that scheduler", p.Spec.SchedulerName))
	}

	// What each container asks.
	var reqs []*containerRequest
	if hamiRes || gpuRes {
		for _, ac := range all {
			r, err := c.deviceRequest(ac, inv)
			if err != nil {
				return nil, err
			}
			if r != nil {
				reqs = append(reqs, r)
			}
		}
	}
	if kaiFraction {
		r, err := c.kaiRequest(p, all, inv)
		if err != nil {
			return nil, err
		}
		reqs = append(reqs, r)
	}
	for _, k := range hamiIgnoredAnnotations {
		if _, ok := ann[k]; ok && len(reqs) > 0 {
			out.Warnings = append(out.Warnings, "annotation "+k+" (a HAMi placement preference) is not translated: the scheduler picks among fitting GPUs")
		}
	}

	// Pod-wide selection and enforcement (HAMi's annotations, KAI's mps).
	selectors, selWhat, err := c.hamiSelectors(ann, inv)
	if err != nil {
		return nil, err
	}
	var cfg *v1alpha1.GpuConfig
	if mode, ok := ann[AnnHAMiVGPUMode]; ok {
		switch strings.TrimSpace(mode) {
		case "hami-core":
			cfg = &v1alpha1.GpuConfig{Enforcement: v1alpha1.EnforcementInterposer}
		case "mps":
			cfg = &v1alpha1.GpuConfig{Enforcement: v1alpha1.EnforcementMPS}
		case "mig":
			return nil, refuse(meta.Child("annotations").Key(AnnHAMiVGPUMode), "mig is not translated: ask for a MIG device with a ResourceClaimTemplate on device class mig.tessera.dev (a selector on attribute migProfile)")
		default:
			return nil, refuse(meta.Child("annotations").Key(AnnHAMiVGPUMode), "unsupported value %q: supported values: \"hami-core\", \"mps\"", mode)
		}
		selWhat = append(selWhat, AnnHAMiVGPUMode+"="+mode+" -> enforcement "+string(cfg.Enforcement))
	}
	if v, ok := ann[AnnKAIMPS]; ok {
		if v != "true" && v != "false" {
			return nil, refuse(meta.Child("annotations").Key(AnnKAIMPS), "unsupported value %q: \"true\" or \"false\"", v)
		}
		if v == "true" {
			cfg = &v1alpha1.GpuConfig{Enforcement: v1alpha1.EnforcementMPS}
			selWhat = append(selWhat, "mps=true -> enforcement mps")
		}
	}

	if len(reqs) == 0 {
		if !queueChanged && !forged && len(summary) == 0 {
			return out, nil
		}
		out.Pod = p
		if len(summary) > 0 {
			setAnnotation(p, TranslatedAnnotation, strings.Join(append([]string{from}, summary...), "; "))
			out.Summary = p.Annotations[TranslatedAnnotation]
		}
		return out, nil
	}

	used := map[string]bool{}
	for _, rc := range p.Spec.ResourceClaims {
		used[rc.Name] = true
	}
	for _, r := range reqs {
		tmpl, err := c.template(r, selectors, cfg)
		if err != nil {
			return nil, err
		}
		if !slices.ContainsFunc(out.Templates, func(t *resourceapi.ResourceClaimTemplate) bool { return t.Name == tmpl.Name }) {
			tmpl.Namespace = p.Namespace
			out.Templates = append(out.Templates, tmpl)
		}
		name := translatedClaimPrefix + strconv.Itoa(r.index)
		for used[name] {
			name += "x"
		}
		used[name] = true
		p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: name, ResourceClaimTemplateName: ptr.To(tmpl.Name)})
		ctr := containerAt(p, r.index)
		if len(ctr.Resources.Claims) > 0 {
			return nil, refuse(r.path.Child("resources", "claims"), "the container names claims and another system's GPU keys: two systems' keys on one container; ask all of them with claims")
		}
		ctr.Resources.Claims = []corev1.ResourceClaim{{Name: name}}
		for _, k := range []corev1.ResourceName{ResNvidiaGPU, ResNvidiaGPUShared, ResHAMiMem, ResHAMiMemPct, ResHAMiCores} {
			delete(ctr.Resources.Limits, k)
			delete(ctr.Resources.Requests, k)
		}
		summary = append(summary, fmt.Sprintf("container %s: %s -> %s", ctr.Name, strings.Join(r.what, ", "), describe(r, c)))
	}
	summary = append(summary, selWhat...)
	setAnnotation(p, TranslatedAnnotation, strings.Join(append([]string{from}, summary...), "; "))
	out.Summary = p.Annotations[TranslatedAnnotation]
	out.Pod = p
	return out, nil
}

func setAnnotation(p *corev1.Pod, k, v string) {
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations[k] = v
}

func validateLabelValue(v string) string {
	if v == "" || len(v) > 63 || !regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`).MatchString(v) {
		return "a label value is at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
	}
	return ""
}

type indexedContainer struct {
	index int
	init  bool
	c     *corev1.Container
	path  *field.Path
}

// allContainers is initContainers ++ containers (the scheduler's order).
func allContainers(p *corev1.Pod) []indexedContainer {
	var out []indexedContainer
	for i := range p.Spec.InitContainers {
		out = append(out, indexedContainer{len(out), true, &p.Spec.InitContainers[i], field.NewPath("spec", "initContainers").Index(i)})
	}
	for i := range p.Spec.Containers {
		out = append(out, indexedContainer{len(out), false, &p.Spec.Containers[i], field.NewPath("spec", "containers").Index(i)})
	}
	return out
}

func containerAt(p *corev1.Pod, index int) *corev1.Container {
	if index < len(p.Spec.InitContainers) {
		return &p.Spec.InitContainers[index]
	}
	return &p.Spec.Containers[index-len(p.Spec.InitContainers)]
}

// quantity reads resource name of a container: limits first, then requests
// (HAMi's order); found is false when neither has it.
func quantity(c *corev1.Container, name string, path *field.Path) (int64, bool, error) {
	q, ok := c.Resources.Limits[corev1.ResourceName(name)]
	p := path.Child("resources", "limits").Key(name)
	if !ok {
		q, ok = c.Resources.Requests[corev1.ResourceName(name)]
		p = path.Child("resources", "requests").Key(name)
	}
	if !ok {
		return 0, false, nil
	}
	v, exact := q.AsInt64()
	if !exact || q.Sign() < 0 {
		return 0, true, refuse(p, "%s is not a non-negative integer", q.String())
	}
	return v, true, nil
}
