// Package installcheck verifies a Tessera installation from inside the
// cluster, as the Helm chart's `helm test` hook runs it: the DeviceClasses
// exist, nodes publish the driver's ResourceSlices, the Queue API is
// served, and the pod webhook gates a queued pod (a server-side dry run,
// so nothing is created). Each failure says what to look at.
package installcheck

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tessera-dev/tessera/api/v1alpha1"
)

// Options say what the installation should have.
type Options struct {
	// Driver is the DRA driver name (gpu.tessera.dev).
	Driver string
	// DeviceClasses must exist; empty checks none.
	DeviceClasses []string
	// Namespace is where the dry-run pod is submitted (the release's).
	Namespace string
	// Queue, when set, is a queue the dry-run pod names: the webhook must
	// add the admission gate. Empty skips the webhook check.
	Queue string
	// Image is the dry-run pod's image (never pulled: nothing runs).
	Image string
}

// Run performs every check, writes one line per check to out and returns
// an error listing those that failed.
func Run(ctx context.Context, c client.Client, o Options, out io.Writer) error {
	checks := []struct {
		name string
		run  func(context.Context, client.Client, Options) (string, error)
	}{
		{"device classes", deviceClasses},
		{"resource slices", resourceSlices},
		{"queue API", queues},
		{"pod webhook", podWebhook},
	}
	var failed []error
	for _, ch := range checks {
		detail, err := ch.run(ctx, c, o)
		if err != nil {
			fmt.Fprintf(out, "FAIL %s: %v\n", ch.name, err)
			failed = append(failed, fmt.Errorf("%s: %w", ch.name, err))
			continue
		}
		fmt.Fprintf(out, "ok   %s: %s\n", ch.name, detail)
	}
	return errors.Join(failed...)
}

func deviceClasses(ctx context.Context, c client.Client, o Options) (string, error) {
	var missing []string
	for _, name := range o.DeviceClasses {
		if name == "" {
			continue
		}
		var dc resourceapi.DeviceClass
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &dc); err != nil {
			missing = append(missing, fmt.Sprintf("%s (%v)", name, err))
		}
	}
	if len(missing) > 0 {
		return "", fmt.Errorf("DeviceClasses missing: %v; install them with the chart (deviceClasses.enabled=true) or deployments/deviceclasses.yaml", missing)
	}
	return fmt.Sprintf("%v present", o.DeviceClasses), nil
}

func resourceSlices(ctx context.Context, c client.Client, o Options) (string, error) {
	var list resourceapi.ResourceSliceList
	if err := c.List(ctx, &list, client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("spec.driver", o.Driver)}); err != nil {
		return "", fmt.Errorf("listing ResourceSlices: %w", err)
	}
	nodes, devices := map[string]bool{}, 0
	for _, s := range list.Items {
		if s.Spec.NodeName != nil {
			nodes[*s.Spec.NodeName] = true
		}
		devices += len(s.Spec.Devices)
	}
	if devices == 0 {
		return "", fmt.Errorf("no node publishes %s devices: check that the kubelet plugin DaemonSet runs on your GPU nodes (kubeletPlugin.nodeAffinity) and read its log", o.Driver)
	}
	return fmt.Sprintf("%d devices on %d nodes", devices, len(nodes)), nil
}

func queues(ctx context.Context, c client.Client, o Options) (string, error) {
	var list v1alpha1.QueueList
	if err := c.List(ctx, &list); err != nil {
		return "", fmt.Errorf("listing Queues: %w (is the CRD queues.tessera.dev installed?)", err)
	}
	if o.Queue != "" && !slices.ContainsFunc(list.Items, func(q v1alpha1.Queue) bool { return q.Name == o.Queue }) {
		return "", fmt.Errorf("queue %q does not exist (defaultQueue.enabled)", o.Queue)
	}
	return fmt.Sprintf("%d queues", len(list.Items)), nil
}

func podWebhook(ctx context.Context, c client.Client, o Options) (string, error) {
	if o.Queue == "" {
		return "skipped (no queue to submit to)", nil
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "tessera-install-check-", Namespace: o.Namespace, Labels: map[string]string{v1alpha1.QueueLabel: o.Queue}},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "check", Image: o.Image}},
		},
	}
	if err := c.Create(ctx, pod, client.DryRunAll); err != nil {
		return "", fmt.Errorf("a queued pod was refused: %w (the controller serves the pod webhook: check its pods and the MutatingWebhookConfiguration)", err)
	}
	for _, g := range pod.Spec.SchedulingGates {
		if g.Name == v1alpha1.AdmissionGate {
			return fmt.Sprintf("a pod in queue %s gets the %s gate", o.Queue, v1alpha1.AdmissionGate), nil
		}
	}
	return "", fmt.Errorf("a pod labelled %s=%s was not gated with %s: the pod webhook did not run (check the MutatingWebhookConfiguration's objectSelector and the controller's log)", v1alpha1.QueueLabel, o.Queue, v1alpha1.AdmissionGate)
}
