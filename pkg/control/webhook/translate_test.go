package webhook_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/webhook"
)

const t4MiB = 15104 // a T4's usable memory as Tessera publishes it

func translateConfig() webhook.TranslateConfig {
	return webhook.TranslateConfig{Driver: "gpu.tessera.dev", GPUClass: "gpu.tessera.dev", TimeSliceClass: "timeslice.tessera.dev",
		DevicePlugin: webhook.DevicePluginWhole, QueueNames: map[string]string{"default-queue": "team-a"}, SchedulerNames: []string{"kai-scheduler"}}
}

var t4 = webhook.Inventory{MemoryMiB: []int64{t4MiB}, Products: []string{"Tesla T4"}}

// fpod is a pod with one container "main" limited to res (name=value
// pairs), annotations ann and labels labels.
func fpod(res map[string]string, ann, labels map[string]string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", GenerateName: "job-", Annotations: ann, Labels: labels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "cuda"}}}}
	if len(res) > 0 {
		l := corev1.ResourceList{}
		for k, v := range res {
			l[corev1.ResourceName(k)] = resource.MustParse(v)
		}
		// The API server defaults requests from limits before webhooks.
		p.Spec.Containers[0].Resources = corev1.ResourceRequirements{Limits: l, Requests: l.DeepCopy()}
	}
	return p
}

// want describes one translated container's request.
type want struct {
	class  string
	count  int64
	memMiB int64 // 0: none
	cores  int64 // 0: none
	sel    []string
	enf    string
}

// checkInvariants holds for every translation: only Tessera's classes,
// only the pod's namespace, no adminAccess, no other configuration than
// enforcement, no foreign resources left, every new container claim names
// a managed template of the pod.
func checkInvariants(t *testing.T, in *corev1.Pod, tr *webhook.Translation) {
	t.Helper()
	if tr.Pod == nil {
		return
	}
	byName := map[string]*resourceapi.ResourceClaimTemplate{}
	for _, tmpl := range tr.Templates {
		byName[tmpl.Name] = tmpl
		if tmpl.Namespace != in.Namespace {
			t.Errorf("template %s in namespace %q, the pod is in %q", tmpl.Name, tmpl.Namespace, in.Namespace)
		}
		if !strings.HasPrefix(tmpl.Name, webhook.ManagedTemplatePrefix) || tmpl.Labels[webhook.ManagedTemplateLabel] != webhook.ManagedTemplateValue {
			t.Errorf("template %s is not marked managed: %v", tmpl.Name, tmpl.Labels)
		}
		for _, r := range tmpl.Spec.Spec.Devices.Requests {
			if r.Exactly == nil || (r.Exactly.DeviceClassName != "gpu.tessera.dev" && r.Exactly.DeviceClassName != "timeslice.tessera.dev") {
				t.Errorf("template %s asks %+v: not a Tessera GPU or time-slice class", tmpl.Name, r)
				continue
			}
			if r.Exactly.AdminAccess != nil {
				t.Errorf("template %s asks adminAccess", tmpl.Name)
			}
			for _, s := range r.Exactly.Selectors {
				if res := cel.GetCompiler(cel.Features{EnableConsumableCapacity: true}).CompileCELExpression(s.CEL.Expression, cel.Options{}); res.Error != nil {
					t.Errorf("selector %q does not compile: %v", s.CEL.Expression, res.Error)
				}
			}
		}
		for _, c := range tmpl.Spec.Spec.Devices.Config {
			var cfg map[string]any
			if c.Opaque == nil || json.Unmarshal(c.Opaque.Parameters.Raw, &cfg) != nil {
				t.Errorf("template %s: config %+v", tmpl.Name, c)
				continue
			}
			for k := range cfg {
				if k != "apiVersion" && k != "kind" && k != "enforcement" {
					t.Errorf("template %s sets %s: translation writes only what a claim may", tmpl.Name, k)
				}
			}
			if _, err := v1alpha1.DecodeGpuConfig(c.Opaque.Parameters.Raw); err != nil {
				t.Errorf("template %s: config does not decode: %v", tmpl.Name, err)
			}
		}
	}
	for _, rc := range tr.Pod.Spec.ResourceClaims {
		if rc.ResourceClaimName != nil {
			if !containsClaim(in.Spec.ResourceClaims, rc) {
				t.Errorf("translation names claim %s", *rc.ResourceClaimName)
			}
			continue
		}
		if rc.ResourceClaimTemplateName != nil && !containsClaim(in.Spec.ResourceClaims, rc) && byName[*rc.ResourceClaimTemplateName] == nil {
			t.Errorf("claim %s names template %s the translation does not make", rc.Name, *rc.ResourceClaimTemplateName)
		}
	}
	for _, c := range append(append([]corev1.Container(nil), tr.Pod.Spec.InitContainers...), tr.Pod.Spec.Containers...) {
		for _, l := range []corev1.ResourceList{c.Resources.Limits, c.Resources.Requests} {
			for k := range l {
				if strings.HasPrefix(string(k), "nvidia.com/") {
					t.Errorf("container %s keeps %s", c.Name, k)
				}
			}
		}
	}
}

func containsClaim(l []corev1.PodResourceClaim, rc corev1.PodResourceClaim) bool {
	for _, x := range l {
		if x.Name == rc.Name {
			return true
		}
	}
	return false
}

// requestOf returns what the template of container ctr's translated claim asks.
func requestOf(t *testing.T, tr *webhook.Translation, ctr string) (want, *resourceapi.ResourceClaimTemplate) {
	t.Helper()
	var c *corev1.Container
	for i := range tr.Pod.Spec.InitContainers {
		if tr.Pod.Spec.InitContainers[i].Name == ctr {
			c = &tr.Pod.Spec.InitContainers[i]
		}
	}
	for i := range tr.Pod.Spec.Containers {
		if tr.Pod.Spec.Containers[i].Name == ctr {
			c = &tr.Pod.Spec.Containers[i]
		}
	}
	if c == nil || len(c.Resources.Claims) != 1 {
		t.Fatalf("container %s has no one claim: %+v", ctr, c)
	}
	var tmplName string
	for _, rc := range tr.Pod.Spec.ResourceClaims {
		if rc.Name == c.Resources.Claims[0].Name {
			tmplName = *rc.ResourceClaimTemplateName
		}
	}
	for _, tmpl := range tr.Templates {
		if tmpl.Name != tmplName {
			continue
		}
		r := tmpl.Spec.Spec.Devices.Requests[0].Exactly
		w := want{class: r.DeviceClassName, count: r.Count}
		if r.Capacity != nil {
			if m, ok := r.Capacity.Requests["memory"]; ok {
				w.memMiB = m.Value() >> 20
			}
			if c, ok := r.Capacity.Requests["cores"]; ok {
				w.cores = c.Value()
			}
		}
		for _, s := range r.Selectors {
			w.sel = append(w.sel, s.CEL.Expression)
		}
		for _, cfg := range tmpl.Spec.Spec.Devices.Config {
			gc, _ := v1alpha1.DecodeGpuConfig(cfg.Opaque.Parameters.Raw)
			w.enf = string(gc.Enforcement)
		}
		return w, tmpl
	}
	t.Fatalf("no template %s", tmplName)
	return want{}, nil
}

func TestTranslate(t *testing.T) {
	kai := map[string]string{webhook.LabelKAIQueue: "default-queue"}
	timeSliced := translateConfig()
	timeSliced.DevicePlugin = webhook.DevicePluginTimeSlice
	twoKinds := webhook.Inventory{MemoryMiB: []int64{t4MiB, 81559}, Products: []string{"NVIDIA H100 80GB HBM3", "Tesla T4"}}
	withInit := func(p *corev1.Pod) *corev1.Pod {
		p.Spec.InitContainers = []corev1.Container{{Name: "gpu-init", Image: "cuda"}}
		return p
	}
	withClaim := func(p *corev1.Pod) *corev1.Pod {
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("mine")}}
		return p
	}
	tests := []struct {
		name      string
		cfg       *webhook.TranslateConfig
		inv       *webhook.Inventory
		pod       *corev1.Pod
		ctr       string // container whose claim is checked ("" = main)
		want      *want  // nil: no claim expected
		wantQueue string
		wantSched *string
		wantErr   []string // substrings of the refusal
		wantAnn   string   // substring of the annotation
	}{
		// The device plugin.
		{name: "device plugin: one whole GPU", pod: fpod(map[string]string{"nvidia.com/gpu": "1"}, nil, nil),
			want: &want{class: "gpu.tessera.dev", count: 1}, wantAnn: "nvidia.com/gpu: 1 -> 1 whole GPU of gpu.tessera.dev"},
		{name: "device plugin: two whole GPUs, cpu kept", pod: fpod(map[string]string{"nvidia.com/gpu": "2", "cpu": "1"}, nil, nil),
			want: &want{class: "gpu.tessera.dev", count: 2}},
		{name: "device plugin, time-sliced cluster: time slices", cfg: &timeSliced, pod: fpod(map[string]string{"nvidia.com/gpu": "1"}, nil, nil),
			want: &want{class: "timeslice.tessera.dev", count: 1}, wantAnn: "1 time slice of timeslice.tessera.dev"},
		{name: "device plugin renamed shared replicas: time slices", pod: fpod(map[string]string{"nvidia.com/gpu.shared": "2"}, nil, nil),
			want: &want{class: "timeslice.tessera.dev", count: 2}},
		{name: "nvidia.com/gpu: 0 asks nothing", pod: fpod(map[string]string{"nvidia.com/gpu": "0"}, nil, nil)},
		{name: "device plugin MIG resource refused", pod: fpod(map[string]string{"nvidia.com/mig-1g.5gb": "1"}, nil, nil),
			wantErr: []string{`spec.containers[0].resources.limits[nvidia.com/mig-1g.5gb]`, "mig.tessera.dev"}},
		{name: "out of range GPU count", pod: fpod(map[string]string{"nvidia.com/gpu": "17"}, nil, nil),
			wantErr: []string{`limits[nvidia.com/gpu]`, "out of range"}},

		// HAMi.
		{name: "HAMi default_use: memory and cores", pod: fpod(map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"}, nil, nil),
			want: &want{class: "gpu.tessera.dev", count: 1, memMiB: 3000, cores: 30}, wantAnn: "memory 3000Mi, cores 30"},
		{name: "HAMi memory only: compute uncapped", pod: fpod(map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}, nil, nil),
			want: &want{class: "gpu.tessera.dev", count: 1, memMiB: 3000}, wantAnn: "compute uncapped"},
		{name: "HAMi gpumem without nvidia.com/gpu: one GPU", pod: fpod(map[string]string{"nvidia.com/gpumem": "4000"}, nil, nil),
			want: &want{class: "gpu.tessera.dev", count: 1, memMiB: 4000}},
		{name: "HAMi percentage on two GPUs", pod: fpod(map[string]string{"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "50", "nvidia.com/gpucores": "30"}, nil, nil),
			want: &want{class: "gpu.tessera.dev", count: 2, memMiB: t4MiB / 2, cores: 30}, wantAnn: "on distinct GPUs"},
		{name: "HAMi exclusive card: whole GPUs", pod: fpod(map[string]string{"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "100", "nvidia.com/gpucores": "100"}, nil, nil),
			want: &want{class: "gpu.tessera.dev", count: 2}},
		{name: "HAMi cores only: the whole memory, capped", pod: fpod(map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpucores": "60"}, nil, nil),
			want: &want{class: "gpu.tessera.dev", count: 1, memMiB: t4MiB, cores: 60}},
		{name: "HAMi gpumem wins over the percentage", pod: fpod(map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpumem-percentage": "50"}, nil, nil),
			want: &want{class: "gpu.tessera.dev", count: 1, memMiB: 1000}},
		{name: "HAMi card type", pod: fpod(map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}, map[string]string{"nvidia.com/use-gputype": "T4,V100"}, nil),
			want: &want{class: "gpu.tessera.dev", count: 1, memMiB: 1000, sel: []string{`(device.attributes["gpu.tessera.dev"].productName.lowerAscii().contains("t4") || device.attributes["gpu.tessera.dev"].productName.lowerAscii().contains("v100"))`}}},
		{name: "HAMi card not to use and UUIDs", pod: fpod(map[string]string{"nvidia.com/gpu": "1"}, map[string]string{"nvidia.com/nouse-gputype": "1080", "nvidia.com/use-gpuuuid": "GPU-03f69c50-207a-2038-9b45-23cac89cb67d"}, nil),
			want: &want{class: "gpu.tessera.dev", count: 1, sel: []string{`!(device.attributes["gpu.tessera.dev"].productName.lowerAscii().contains("1080"))`, `device.attributes["gpu.tessera.dev"].uuid in ["GPU-03f69c50-207a-2038-9b45-23cac89cb67d"]`}}},
		{name: "HAMi vgpu-mode mps: enforcement mps", pod: fpod(map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000"}, map[string]string{"nvidia.com/vgpu-mode": "mps"}, nil),
			want: &want{class: "gpu.tessera.dev", count: 1, memMiB: 2000, enf: "mps"}},
		{name: "HAMi unknown card type refused", pod: fpod(map[string]string{"nvidia.com/gpu": "2"}, map[string]string{"nvidia.com/use-gputype": "A100,V100"}, nil),
			wantErr: []string{"metadata.annotations[nvidia.com/use-gputype]", `"A100,V100" match no GPU`, "Tesla T4"}},
		{name: "HAMi card type that could escape the expression refused", pod: fpod(map[string]string{"nvidia.com/gpu": "1"}, map[string]string{"nvidia.com/use-gputype": `T4") || true || ("`}, nil),
			wantErr: []string{"use-gputype", "not a product name"}},
		{name: "HAMi gpumem that fits no GPU", pod: fpod(map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000"}, nil, nil),
			wantErr: []string{"limits[nvidia.com/gpumem]", "fits no GPU", "15104"}},
		{name: "HAMi cores out of range", pod: fpod(map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpucores": "150"}, nil, nil),
			wantErr: []string{"limits[nvidia.com/gpucores]", "out of range"}},
		{name: "HAMi percentage out of range", pod: fpod(map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "120"}, nil, nil),
			wantErr: []string{"limits[nvidia.com/gpumem-percentage]", "out of range"}},
		{name: "HAMi vgpu-mode mig refused", pod: fpod(map[string]string{"nvidia.com/gpu": "1"}, map[string]string{"nvidia.com/vgpu-mode": "mig"}, nil),
			wantErr: []string{"vgpu-mode", "mig.tessera.dev"}},
		{name: "HAMi priority refused", pod: fpod(map[string]string{"nvidia.com/gpu": "1", "nvidia.com/priority": "1"}, nil, nil),
			wantErr: []string{"limits[nvidia.com/priority]"}},
		{name: "HAMi percentage on GPUs of two sizes refused", inv: &twoKinds, pod: fpod(map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}, nil, nil),
			wantErr: []string{"gpumem-percentage", "a fraction of which GPU"}},

		// KAI.
		{name: "KAI gpu-fraction: a share, the queue mapped, the scheduler moved", pod: func() *corev1.Pod {
			p := fpod(nil, map[string]string{"gpu-fraction": "0.5"}, kai)
			p.Spec.SchedulerName = "kai-scheduler"
			return p
		}(), want: &want{class: "gpu.tessera.dev", count: 1, memMiB: (t4MiB + 1) / 2}, wantQueue: "team-a", wantSched: ptr.To(""),
			wantAnn: "label kai.scheduler/queue=default-queue -> tessera.dev/queue=team-a"},
		{name: "KAI gpu-memory on two GPUs", pod: fpod(nil, map[string]string{"gpu-memory": "2000", "gpu-fraction-num-devices": "2"}, kai),
			want: &want{class: "gpu.tessera.dev", count: 2, memMiB: 2000}, wantQueue: "team-a"},
		{name: "KAI fraction for an init container", pod: withInit(fpod(nil, map[string]string{"gpu-fraction": "0.25", "gpu-fraction-container-name": "gpu-init"}, kai)),
			ctr: "gpu-init", want: &want{class: "gpu.tessera.dev", count: 1, memMiB: t4MiB / 4}},
		{name: "KAI mps", pod: fpod(nil, map[string]string{"gpu-fraction": "0.5", "mps": "true"}, kai),
			want: &want{class: "gpu.tessera.dev", count: 1, memMiB: (t4MiB + 1) / 2, enf: "mps"}},
		{name: "KAI whole GPU with the old runai/queue label", pod: fpod(map[string]string{"nvidia.com/gpu": "1"}, nil, map[string]string{webhook.LabelRunAIQueue: "research"}),
			want: &want{class: "gpu.tessera.dev", count: 1}, wantQueue: "research"},
		{name: "KAI cpu-only pod: only the queue", pod: fpod(map[string]string{"cpu": "100m"}, nil, kai), wantQueue: "team-a"},
		{name: "KAI scheduler kept when not configured", cfg: &webhook.TranslateConfig{Driver: "gpu.tessera.dev", GPUClass: "gpu.tessera.dev", TimeSliceClass: "timeslice.tessera.dev"},
			pod: func() *corev1.Pod {
				p := fpod(map[string]string{"nvidia.com/gpu": "1"}, nil, kai)
				p.Spec.SchedulerName = "kai-scheduler"
				return p
			}(),
			want: &want{class: "gpu.tessera.dev", count: 1}, wantQueue: "default-queue", wantSched: ptr.To("kai-scheduler")},
		{name: "KAI fraction 1 refused", pod: fpod(nil, map[string]string{"gpu-fraction": "1.0"}, kai),
			wantErr: []string{"metadata.annotations[gpu-fraction]", "smaller than 1", "nvidia.com/gpu: 1"}},
		{name: "KAI fraction not a number", pod: fpod(nil, map[string]string{"gpu-fraction": "half"}, kai),
			wantErr: []string{"gpu-fraction", "out of range"}},
		{name: "KAI fraction too small for a share", pod: fpod(nil, map[string]string{"gpu-fraction": "0.001"}, kai),
			wantErr: []string{"gpu-fraction", "below the smallest share"}},
		{name: "KAI gpu-memory that fits no GPU", pod: fpod(nil, map[string]string{"gpu-memory": "40000"}, kai),
			wantErr: []string{"gpu-memory", "fits no GPU"}},
		{name: "KAI num-devices alone refused", pod: fpod(nil, map[string]string{"gpu-fraction-num-devices": "2"}, kai),
			wantErr: []string{"gpu-fraction-num-devices", "needs annotation gpu-fraction or gpu-memory"}},
		{name: "KAI num-devices out of range", pod: fpod(nil, map[string]string{"gpu-fraction": "0.5", "gpu-fraction-num-devices": "0"}, kai),
			wantErr: []string{"gpu-fraction-num-devices", "out of range"}},
		{name: "KAI fraction and a GPU limit refused", pod: fpod(map[string]string{"nvidia.com/gpu": "1"}, map[string]string{"gpu-fraction": "0.5"}, kai),
			wantErr: []string{"gpu-fraction", "whole-GPU limit"}},
		{name: "KAI container name unknown", pod: fpod(nil, map[string]string{"gpu-fraction": "0.5", "gpu-fraction-container-name": "nope"}, kai),
			wantErr: []string{"gpu-fraction-container-name", `"nope"`}},
		{name: "KAI fraction with no GPU published refused", inv: &webhook.Inventory{}, pod: fpod(nil, map[string]string{"gpu-fraction": "0.5"}, kai),
			wantErr: []string{"gpu-fraction", "gpuMemoryMiB"}},

		// Two systems, or a system and Tessera.
		{name: "HAMi and KAI keys on one pod", pod: fpod(map[string]string{"nvidia.com/gpumem": "1000"}, map[string]string{"gpu-fraction": "0.5"}, nil),
			wantErr: []string{"two systems' keys", "gpu-fraction"}},
		{name: "claims and nvidia.com/gpu on one pod", pod: withClaim(fpod(map[string]string{"nvidia.com/gpu": "1"}, nil, nil)),
			wantErr: []string{"spec.resourceClaims", "two systems' keys"}},
		{name: "KAI and Tessera queue labels that disagree", pod: fpod(nil, nil, map[string]string{webhook.LabelKAIQueue: "default-queue", v1alpha1.QueueLabel: "other"}),
			wantErr: []string{"metadata.labels[tessera.dev/queue]", "disagree"}},
		{name: "KAI and runai queue labels that disagree", pod: fpod(nil, nil, map[string]string{webhook.LabelKAIQueue: "a", webhook.LabelRunAIQueue: "b"}),
			wantErr: []string{"runai/queue"}},
		{name: "KAI and Tessera queue labels that agree: nothing to do", pod: fpod(nil, nil, map[string]string{webhook.LabelKAIQueue: "default-queue", v1alpha1.QueueLabel: "team-a"})},

		// The annotation the tenant cannot forge.
		{name: "forged annotation removed", pod: fpod(nil, map[string]string{webhook.TranslatedAnnotation: "hami: 80 GPUs"}, nil)},
		{name: "forged annotation overwritten", pod: fpod(map[string]string{"nvidia.com/gpu": "1"}, map[string]string{webhook.TranslatedAnnotation: "nothing"}, nil),
			want: &want{class: "gpu.tessera.dev", count: 1}, wantAnn: "1 whole GPU"},

		// Nothing to translate.
		{name: "a native pod is not touched", pod: withClaim(fpod(nil, nil, map[string]string{v1alpha1.QueueLabel: "a"}))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := translateConfig()
			if tt.cfg != nil {
				cfg = *tt.cfg
			}
			inv := t4
			if tt.inv != nil {
				inv = *tt.inv
			}
			in := tt.pod.DeepCopy()
			tr, err := cfg.Translate(tt.pod, inv)
			if tt.wantErr != nil {
				if err == nil {
					t.Fatalf("translated (%+v); want refused with %q", tr.Summary, tt.wantErr)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !equalPods(in, tt.pod) {
				t.Error("Translate changed its input")
			}
			checkInvariants(t, in, tr)
			forged := in.Annotations[webhook.TranslatedAnnotation] != ""
			if tr.Pod == nil {
				if tt.want != nil || tt.wantQueue != "" || forged {
					t.Fatalf("nothing translated")
				}
				return
			}
			if got, ok := tr.Pod.Annotations[webhook.TranslatedAnnotation]; tt.wantAnn != "" && !strings.Contains(got, tt.wantAnn) {
				t.Errorf("annotation %q (set %v) lacks %q", got, ok, tt.wantAnn)
			} else if forged && got == in.Annotations[webhook.TranslatedAnnotation] {
				t.Errorf("the forged annotation %q survived", got)
			}
			if tt.wantQueue != "" && tr.Pod.Labels[v1alpha1.QueueLabel] != tt.wantQueue {
				t.Errorf("queue label %q, want %q", tr.Pod.Labels[v1alpha1.QueueLabel], tt.wantQueue)
			}
			if tt.wantSched != nil && tr.Pod.Spec.SchedulerName != *tt.wantSched {
				t.Errorf("schedulerName %q, want %q", tr.Pod.Spec.SchedulerName, *tt.wantSched)
			}
			if tt.want == nil {
				if len(tr.Templates) > 0 {
					t.Errorf("templates %v, want none", tr.Templates)
				}
				return
			}
			ctr := tt.ctr
			if ctr == "" {
				ctr = "main"
			}
			got, tmpl := requestOf(t, tr, ctr)
			if fmt.Sprint(got) != fmt.Sprint(*tt.want) {
				t.Errorf("request %+v, want %+v", got, *tt.want)
			}
			if distinct := len(tmpl.Spec.Spec.Devices.Constraints) > 0; distinct != (got.count > 1 && got.class == "gpu.tessera.dev") {
				t.Errorf("distinct-GPU constraint %v for %d devices of %s", distinct, got.count, got.class)
			}
			if c := tr.Pod.Spec.Containers[0]; c.Resources.Limits.Cpu().String() != in.Spec.Containers[0].Resources.Limits.Cpu().String() {
				t.Errorf("cpu limit changed: %v", c.Resources.Limits)
			}
		})
	}
}

func equalPods(a, b *corev1.Pod) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

// TestTranslateProperties: pods with random combinations of the three
// systems' keys are either refused or translated within the invariants
// (checkInvariants); a pod is never left with another system's GPU keys
// and a Tessera claim at once, and the charge is what the template asks.
func TestTranslateProperties(t *testing.T) {
	rng := rand.New(rand.NewSource(36))
	res := []struct{ k, v string }{{"nvidia.com/gpu", "1"}, {"nvidia.com/gpu", "3"}, {"nvidia.com/gpu", "-1"}, {"nvidia.com/gpumem", "2000"}, {"nvidia.com/gpumem", "99999"},
		{"nvidia.com/gpumem-percentage", "30"}, {"nvidia.com/gpucores", "20"}, {"nvidia.com/gpucores", "100"}, {"nvidia.com/gpu.shared", "1"}, {"cpu", "1"}}
	anns := []struct{ k, v string }{{"gpu-fraction", "0.3"}, {"gpu-fraction", "2"}, {"gpu-memory", "1024"}, {"gpu-fraction-num-devices", "2"},
		{"nvidia.com/use-gputype", "t4"}, {"nvidia.com/vgpu-mode", "hami-core"}, {"mps", "true"}, {webhook.TranslatedAnnotation, "forged"}, {"gpu-fraction-container-name", "main"}}
	labels := []struct{ k, v string }{{webhook.LabelKAIQueue, "q1"}, {webhook.LabelRunAIQueue, "q2"}, {v1alpha1.QueueLabel, "q1"}}
	for i := 0; i < 2000; i++ {
		r, a, l := map[string]string{}, map[string]string{}, map[string]string{}
		for _, x := range res {
			if rng.Intn(4) == 0 {
				r[x.k] = x.v
			}
		}
		for _, x := range anns {
			if rng.Intn(5) == 0 {
				a[x.k] = x.v
			}
		}
		for _, x := range labels {
			if rng.Intn(3) == 0 {
				l[x.k] = x.v
			}
		}
		var p *corev1.Pod
		func() {
			defer func() {
				if recover() != nil {
					p = nil // an invalid quantity the API server refuses first
				}
			}()
			p = fpod(r, a, l)
		}()
		if p == nil {
			continue
		}
		tr, err := translateConfig().Translate(p, t4)
		if err != nil {
			if _, ok := err.(*webhook.TranslateError); !ok {
				t.Fatalf("%v %v %v: error %v is not a refusal", r, a, l, err)
			}
			continue
		}
		checkInvariants(t, p, tr)
		if tr.Pod != nil && tr.Pod.Annotations[webhook.TranslatedAnnotation] == "forged" {
			t.Fatalf("%v %v %v: the forged annotation survived", r, a, l)
		}
		if t.Failed() {
			t.Fatalf("pod %v %v %v", r, a, l)
		}
	}
}

// The handler makes the managed template once (equal requests share it),
// leaves dry runs alone, and refuses a template of that name that is not
// the translation's.
func TestPodTranslatorHandler(t *testing.T) {
	s := scheme(t)
	slice := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "n1-gpu"}, Spec: resourceapi.ResourceSliceSpec{Driver: "gpu.tessera.dev",
		Pool: resourceapi.ResourcePool{Name: "n1", ResourceSliceCount: 1}, NodeName: ptr.To("n1"),
		Devices: []resourceapi.Device{{Name: "gpu-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type": {StringValue: ptr.To("gpu")}, "productName": {StringValue: ptr.To("Tesla T4")}},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse(fmt.Sprintf("%dMi", t4MiB))}}}}}}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(slice).Build()
	h := &webhook.PodTranslator{Decoder: webhook.NewDecoder(s), Reader: c, Client: c, Config: translateConfig()}
	ctx := context.Background()
	pod := fpod(nil, map[string]string{"gpu-fraction": "0.5"}, map[string]string{webhook.LabelKAIQueue: "default-queue"})

	dry := request(t, admissionv1.Create, "", pod)
	dry.Namespace, dry.DryRun = "ns", ptr.To(true)
	if resp := h.Handle(ctx, dry); !resp.Allowed || len(resp.Patches) == 0 {
		t.Fatalf("dry run: allowed=%v patches=%d %v", resp.Allowed, len(resp.Patches), resp.Result)
	}
	var list resourceapi.ResourceClaimTemplateList
	if err := c.List(ctx, &list); err != nil || len(list.Items) != 0 {
		t.Fatalf("a dry run made templates: %v %v", list.Items, err)
	}
	for i := 0; i < 2; i++ {
		req := request(t, admissionv1.Create, "", pod)
		req.Namespace = "ns"
		resp := h.Handle(ctx, req)
		if !resp.Allowed {
			t.Fatalf("refused: %v", resp.Result)
		}
		data, _ := json.Marshal(resp.Patches)
		for _, w := range []string{webhook.ManagedTemplatePrefix, `"/metadata/labels/tessera.dev~1queue","value":"team-a"`, "tessera.dev~1translated"} {
			if !strings.Contains(string(data), w) {
				t.Errorf("patch %s lacks %s", data, w)
			}
		}
		if len(resp.Warnings) == 0 || !strings.Contains(strings.Join(resp.Warnings, " "), "translated for Tessera") {
			t.Errorf("warnings %v do not say what was translated", resp.Warnings)
		}
	}
	if err := c.List(ctx, &list, client.InNamespace("ns")); err != nil || len(list.Items) != 1 {
		t.Fatalf("templates %d (%v), want one shared by both pods", len(list.Items), err)
	}
	tmpl := list.Items[0]
	if tmpl.Labels[webhook.ManagedTemplateLabel] != webhook.ManagedTemplateValue || tmpl.Annotations[webhook.LastUsedAnnotation] == "" {
		t.Errorf("template %s: labels %v annotations %v", tmpl.Name, tmpl.Labels, tmpl.Annotations)
	}

	// A tenant's template of that name (the chart's policy keeps tenants
	// from making one; the webhook does not trust that alone).
	other := tmpl.DeepCopy()
	other.ResourceVersion, other.Namespace = "", "other"
	other.Spec.Spec.Devices.Requests[0].Exactly.DeviceClassName = "someone-elses.example.com"
	if err := c.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	inOther := pod.DeepCopy()
	inOther.Namespace = "other"
	req := request(t, admissionv1.Create, "", inOther)
	if resp := h.Handle(ctx, req); resp.Allowed || !strings.Contains(resp.Result.Message, "is not the one the translation made") {
		t.Errorf("a foreign template of the managed name: allowed=%v %v", resp.Allowed, resp.Result)
	}

	// Refusals reach the user with the field.
	bad := request(t, admissionv1.Create, "", fpod(nil, map[string]string{"gpu-fraction": "1.5"}, nil))
	bad.Namespace = "ns"
	if resp := h.Handle(ctx, bad); resp.Allowed || !strings.Contains(resp.Result.Message, "metadata.annotations[gpu-fraction]") {
		t.Errorf("bad fraction: allowed=%v %v", resp.Allowed, resp.Result)
	}
}

// The annotation starts with the systems whose keys were translated
// (kubectl tessera top shows them).
func TestTranslatedFrom(t *testing.T) {
	kai := map[string]string{webhook.LabelKAIQueue: "default-queue"}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want string
	}{
		{"device plugin", fpod(map[string]string{"nvidia.com/gpu": "1"}, nil, nil), "device-plugin"},
		{"HAMi", fpod(map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}, nil, nil), "hami"},
		{"HAMi card type only", fpod(map[string]string{"nvidia.com/gpu": "1"}, map[string]string{"nvidia.com/use-gputype": "t4"}, nil), "hami"},
		{"KAI fraction", fpod(nil, map[string]string{"gpu-fraction": "0.5"}, kai), "kai"},
		{"KAI queue only", fpod(nil, nil, kai), "kai"},
		{"KAI whole GPU", fpod(map[string]string{"nvidia.com/gpu": "1"}, nil, kai), "device-plugin+kai"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := translateConfig().Translate(tc.pod, t4)
			if err != nil || tr.Pod == nil {
				t.Fatalf("%v %v", tr, err)
			}
			if got := v1alpha1.TranslatedFrom(tr.Pod.Annotations[webhook.TranslatedAnnotation]); got != tc.want {
				t.Errorf("from %q (annotation %q), want %q", got, tr.Pod.Annotations[webhook.TranslatedAnnotation], tc.want)
			}
		})
	}
	if got := v1alpha1.TranslatedFrom("nothing"); got != "" {
		t.Errorf("TranslatedFrom of a value without the prefix: %q", got)
	}
}
