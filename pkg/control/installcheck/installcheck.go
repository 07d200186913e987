// Package installcheck verifies a Tessera installation from inside the
// cluster, as the Helm chart's `helm test` hook runs it: the DeviceClasses
// exist, nodes publish the driver's ResourceSlices, the Queue API is
// served, the pod webhook gates a queued pod (a server-side dry run, so
// nothing is created), and the sandbox policy is in place; it reports the
// managed namespaces that lack Pod Security's baseline (a warning: the
// sandbox policy is what Tessera's limits rest on, Pod Security the
// administrator's own hardening). Each failure says what to look at.
package installcheck

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
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
	// SandboxPolicy is the ValidatingAdmissionPolicy that keeps device
	// users in Tessera's sandbox (<release>-sandbox); empty skips the
	// check.
	SandboxPolicy string
}

// warning is a check's finding that does not fail the installation check.
type warning struct{ msg string }

func (w warning) Error() string { return w.msg }

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
		{"sandbox policy", sandboxPolicy},
		{"tenant namespaces", podSecurity},
	}
	var failed []error
	for _, ch := range checks {
		detail, err := ch.run(ctx, c, o)
		var w warning
		if errors.As(err, &w) {
			fmt.Fprintf(out, "WARN %s: %s\n", ch.name, w.msg)
			continue
		}
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

func sandboxPolicy(ctx context.Context, c client.Client, o Options) (string, error) {
	if o.SandboxPolicy == "" {
		return "skipped (admissionPolicies.sandbox.enabled is false: nothing keeps device users off the node's files)", nil
	}
	var p admissionregistrationv1.ValidatingAdmissionPolicy
	if err := c.Get(ctx, client.ObjectKey{Name: o.SandboxPolicy}, &p); err != nil {
		return "", fmt.Errorf("ValidatingAdmissionPolicy %s: %w (the chart installs it with admissionPolicies.sandbox.enabled; without it a tenant's privileged or hostPath pod reaches every claim's CDI spec)", o.SandboxPolicy, err)
	}
	return fmt.Sprintf("ValidatingAdmissionPolicy %s present", o.SandboxPolicy), nil
}

// podSecurityLevels are the Pod Security levels that refuse privileged
// pods, host namespaces and hostPath.
var podSecurityLevels = []string{"baseline", "restricted"}

// podSecurity reports the managed namespaces (labelled with a queue)
// whose Pod Security enforce level is not baseline or restricted, unless
// an administrator exempted them from the sandbox on purpose.
func podSecurity(ctx context.Context, c client.Client, _ Options) (string, error) {
	var list corev1.NamespaceList
	if err := c.List(ctx, &list, client.HasLabels{v1alpha1.QueueLabel}); err != nil {
		return "", fmt.Errorf("listing namespaces: %w", err)
	}
	var lacking, exempt []string
	for _, ns := range list.Items {
		switch {
		case ns.Labels[v1alpha1.SandboxLabel] == v1alpha1.SandboxExempt:
			exempt = append(exempt, ns.Name)
		case !slices.Contains(podSecurityLevels, ns.Labels[podSecurityEnforce]):
			lacking = append(lacking, ns.Name)
		}
	}
	note := ""
	if len(exempt) > 0 {
		note = fmt.Sprintf("; exempt from the sandbox by %s=%s, where Tessera's limits do not hold: %v", v1alpha1.SandboxLabel, v1alpha1.SandboxExempt, exempt)
	}
	if len(lacking) > 0 {
		return "", warning{fmt.Sprintf("managed namespaces without %s=baseline (or restricted): %v; Tessera's sandbox policy still holds their device users, but label them (kubectl label namespace <ns> %s=baseline) for the rest of Pod Security%s",
			podSecurityEnforce, lacking, podSecurityEnforce, note)}
	}
	return fmt.Sprintf("%d managed namespaces enforce Pod Security baseline or restricted%s", len(list.Items)-len(exempt), note), nil
}

// podSecurityEnforce is Pod Security admission's enforce label.
const podSecurityEnforce = "pod-security.kubernetes.io/enforce"
