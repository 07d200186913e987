package controller

import (
	"fmt"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tessera-dev/tessera/pkg/control/shadow"
	"github.com/tessera-dev/tessera/pkg/control/whatif"
)

// DefaultShadowLease is the shadow's leader-election lease: never the
// active controller's.
const DefaultShadowLease = "tessera-shadow.tessera.dev"

// ShadowSettings describe a shadow controller in its report.
func ShadowSettings(o Options) string {
	image := os.Getenv("TESSERA_IMAGE")
	parts := []string{fmt.Sprintf("reclaim=%v", o.Reclaim), fmt.Sprintf("max-reclaims-per-cycle=%d", o.MaxReclaimsPerCycle)}
	if o.KubernetesVersion != "" {
		parts = append(parts, "kubernetes-version="+o.KubernetesVersion)
	}
	if o.SchedulerFeatureGates != "" {
		parts = append(parts, "scheduler-feature-gates="+o.SchedulerFeatureGates)
	}
	if o.ShadowQueues != "" {
		parts = append(parts, "queues from "+o.ShadowQueues)
	}
	if image != "" {
		parts = append([]string{"image " + image}, parts...)
	}
	return strings.Join(parts, ", ")
}

// noEvents is the shadow's event recorder: it records nothing.
type noEvents struct{}

func (noEvents) Eventf(runtime.Object, runtime.Object, string, string, string, string, ...any) {}
func (noEvents) AnnotatedEventf(runtime.Object, runtime.Object, map[string]string, string, string, string, string, ...any) {
}

// makeShadow makes the reconciler a shadow: its client writes nothing
// but the report (reads go to the API directly), no events.
func makeShadow(a *Reconciler, direct client.Client, o Options) error {
	s := shadow.NewTracker(registry(o), direct, o.Namespace, o.ShadowReport)
	s.Settings = ShadowSettings(o)
	if o.ShadowQueues != "" {
		f, err := os.Open(o.ShadowQueues)
		if err != nil {
			return fmt.Errorf("--shadow-queues: %w", err)
		}
		defer f.Close()
		if s.Queues, err = whatif.ReadQueues(f); err != nil {
			return fmt.Errorf("--shadow-queues %s: %w", o.ShadowQueues, err)
		}
	}
	a.Shadow = s
	a.Client = s.Client
	a.Recorder = noEvents{}
	return nil
}
