package scale

import (
	"context"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
)

// Tessera's controller Deployment of the chart on the local cluster.
const (
	controllerNamespace  = "tessera-system"
	controllerDeployment = "tessera-controller"
)

// withFlags returns args with each flag of flags ("--name" → value) set:
// an existing "--name=..." is replaced, a missing one appended.
func withFlags(args []string, flags map[string]string) []string {
	out := slices.Clone(args)
	names := make([]string, 0, len(flags))
	for name := range flags {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		arg := name + "=" + flags[name]
		if i := slices.IndexFunc(out, func(a string) bool { return a == name || strings.HasPrefix(a, name+"=") }); i >= 0 {
			out[i] = arg
		} else {
			out = append(out, arg)
		}
	}
	return out
}

// configureController runs Tessera's controller with its chart's
// arguments and flags set on top (nil: the chart's own). The controller
// listens on the host's network: a rolling update would start the new pod
// next to the old one on the same ports, so the Deployment goes to zero
// replicas first. It returns when the new controller leads and serves its
// metrics; no pod is created meanwhile.
func (h *harness) configureController(ctx context.Context, flags map[string]string) error {
	deps := h.cs.AppsV1().Deployments(controllerNamespace)
	d, err := deps.Get(ctx, controllerDeployment, metav1.GetOptions{})
	if err != nil {
		return err
	}
	c := &d.Spec.Template.Spec.Containers[0]
	if h.chartArgs == nil {
		h.chartArgs = slices.Clone(c.Args)
	}
	want := withFlags(h.chartArgs, flags)
	if slices.Equal(c.Args, want) {
		return nil
	}
	h.logf("controller: restarting with %s", strings.Join(want, " "))
	replicas := d.Spec.Replicas
	sel := metav1.FormatLabelSelector(d.Spec.Selector)
	// Each update reads the Deployment afresh: its controller writes it too.
	update := func(change func(*appsv1.Deployment)) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			d, err := deps.Get(ctx, controllerDeployment, metav1.GetOptions{})
			if err != nil {
				return err
			}
			change(d)
			_, err = deps.Update(ctx, d, metav1.UpdateOptions{})
			return err
		})
	}
	if err := update(func(d *appsv1.Deployment) { d.Spec.Replicas = ptr.To[int32](0) }); err != nil {
		return err
	}
	if err := waitUntil(ctx, 2*time.Minute, "the controller's pods gone", func() (bool, error) {
		pods, err := h.cs.CoreV1().Pods(controllerNamespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
		return err == nil && len(pods.Items) == 0, err
	}); err != nil {
		return err
	}
	if err := update(func(d *appsv1.Deployment) {
		d.Spec.Template.Spec.Containers[0].Args = want
		d.Spec.Replicas = replicas
	}); err != nil {
		return err
	}
	var ep endpoint
	for _, e := range h.endpoints {
		if e.name == "controller" {
			ep = e
		}
	}
	return waitUntil(ctx, 3*time.Minute, "the restarted controller leading", func() (bool, error) {
		f, err := scrape(ctx, ep)
		if err != nil {
			return false, nil // not serving yet
		}
		for _, m := range f["leader_election_master_status"].GetMetric() {
			if m.GetGauge().GetValue() == 1 {
				return true, nil
			}
		}
		return false, nil
	})
}

// describeFlags is flags as they appear on the command line.
func describeFlags(flags map[string]string) string {
	return strings.Join(withFlags(nil, flags), " ")
}
