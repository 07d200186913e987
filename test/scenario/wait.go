package scenario

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// JobPods returns the pods of a Job, by the label the Job controller sets.
func (r *Run) JobPods(ctx context.Context, job string) ([]corev1.Pod, error) {
	pods, err := r.Client.CoreV1().Pods(r.Namespace).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + job})
	if err != nil {
		return nil, err
	}
	return pods.Items, nil
}

// waitJobPods waits up to a minute until a Job has created n pods.
func (r *Run) waitJobPods(ctx context.Context, job string, n int) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		pods, err := r.JobPods(ctx, job)
		if err == nil && len(pods) >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("job %s: %d of %d pods created after a minute (%v)\n%s", job, len(pods), n, err, r.Events(context.Background(), ""))
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Expectation of a pod: Run.Expect, else its annotation: Running (default),
// Succeeded or Pending.
func (r *Run) Expectation(p *corev1.Pod) corev1.PodPhase {
	if e, ok := r.Expect[p.Name]; ok {
		return e
	}
	switch strings.ToLower(p.Annotations[ExpectAnnotation]) {
	case "pending":
		return corev1.PodPending
	case "succeeded":
		return corev1.PodSucceeded
	}
	return corev1.PodRunning
}

// PendingReason is the scheduler's verdict on a pod it could not place
// (reason: message), or "" while it has none.
func PendingReason(p *corev1.Pod) string {
	if len(p.Spec.SchedulingGates) > 0 {
		var gates []string
		for _, g := range p.Spec.SchedulingGates {
			gates = append(gates, g.Name)
		}
		return "SchedulingGated: " + strings.Join(gates, ", ")
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason != "" {
			return c.Reason + ": " + c.Message
		}
	}
	return ""
}

// met tells whether a pod reached its expectation; a pod that ended in a
// phase it was not expected to reach is an error.
func (r *Run) met(p *corev1.Pod) (bool, error) {
	want := r.Expectation(p)
	switch {
	case p.Status.Phase == want && want != corev1.PodPending:
		return true, nil
	case want == corev1.PodPending:
		if p.Status.Phase != corev1.PodPending || p.Spec.NodeName != "" {
			return false, fmt.Errorf("pod %s was expected to stay Pending but is %s on %q", p.Name, p.Status.Phase, p.Spec.NodeName)
		}
		return PendingReason(p) != "", nil
	case p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded:
		return false, fmt.Errorf("pod %s ended %s, want %s: %s", p.Name, p.Status.Phase, want, containerStates(p))
	}
	return false, nil
}

// containerStates says why a pod's containers ended or wait, for errors.
func containerStates(p *corev1.Pod) string {
	var parts []string
	for _, cs := range p.Status.ContainerStatuses {
		switch {
		case cs.State.Terminated != nil:
			parts = append(parts, fmt.Sprintf("%s terminated %s (exit %d) %s", cs.Name, cs.State.Terminated.Reason, cs.State.Terminated.ExitCode, cs.State.Terminated.Message))
		case cs.State.Waiting != nil:
			parts = append(parts, fmt.Sprintf("%s waiting %s %s", cs.Name, cs.State.Waiting.Reason, cs.State.Waiting.Message))
		}
	}
	return strings.Join(parts, "; ")
}

// WaitPods waits until the named pods exist and every pod of the namespace
// meets its expectation. A pod that is being deleted (evicted by the
// controller's reclaim, say) and is not named is no longer held to its
// expectation: it is leaving. On timeout the error says what each pod waits for,
// with the namespace's warning events.
func (r *Run) WaitPods(ctx context.Context, named []string) error {
	timeout := r.StepTimeout
	if timeout == 0 {
		timeout = 2 * time.Minute
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	lastReport := start
	for {
		pods, err := r.Client.CoreV1().Pods(r.Namespace).List(ctx, metav1.ListOptions{})
		if err == nil {
			done := true
			var waiting []string
			have := map[string]bool{}
			pods.Items = slices.DeleteFunc(pods.Items, func(p corev1.Pod) bool {
				return p.DeletionTimestamp != nil && !slices.Contains(named, p.Name)
			})
			for i := range pods.Items {
				p := &pods.Items[i]
				have[p.Name] = true
				ok, err := r.met(p)
				if err != nil {
					return fmt.Errorf("%w\n%s", err, r.Events(context.Background(), p.Name))
				}
				if !ok {
					done = false
					waiting = append(waiting, fmt.Sprintf("%s (%s, want %s)", p.Name, p.Status.Phase, r.Expectation(p)))
				}
			}
			for _, n := range named {
				if !have[n] {
					done = false
					waiting = append(waiting, n+" (not created yet)")
				}
			}
			if done {
				var running, pending int
				for i := range pods.Items {
					if r.Expectation(&pods.Items[i]) == corev1.PodPending {
						pending++
					} else {
						running++
					}
				}
				msg := fmt.Sprintf("%d pod(s) as expected", len(pods.Items))
				if pending > 0 {
					msg = fmt.Sprintf("%d pod(s) started, %d Pending as expected", running, pending)
				}
				r.printf("    %s (%.1fs)\n", msg, time.Since(start).Seconds())
				return nil
			}
			if time.Since(lastReport) > 15*time.Second {
				r.printf("    still waiting for %s (%s)\n", strings.Join(waiting, ", "), time.Since(start).Round(time.Second))
				if ev := r.Events(ctx, ""); ev != "" {
					r.printf("    warnings so far:\n%s", indent(lastLines(ev, 5), "    "))
				}
				lastReport = time.Now()
			}
			if ctx.Err() != nil {
				return fmt.Errorf("after %s still waiting for %s\n%s", timeout, strings.Join(waiting, ", "), r.Events(context.Background(), ""))
			}
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return fmt.Errorf("listing pods: %w", err)
			}
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Events returns the namespace's warning events (of one object when name
// is set), one a line, for error messages.
func (r *Run) Events(ctx context.Context, name string) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	evs, err := r.Client.CoreV1().Events(r.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "(events: " + err.Error() + ")"
	}
	when := func(e corev1.Event) time.Time {
		switch {
		case !e.LastTimestamp.IsZero():
			return e.LastTimestamp.Time
		case !e.EventTime.IsZero():
			return e.EventTime.Time
		}
		return e.CreationTimestamp.Time
	}
	sort.SliceStable(evs.Items, func(i, j int) bool { return when(evs.Items[i]).Before(when(evs.Items[j])) })
	var sb strings.Builder
	for _, e := range evs.Items {
		if e.Type != corev1.EventTypeWarning || (name != "" && e.InvolvedObject.Name != name) {
			continue
		}
		fmt.Fprintf(&sb, "  event %s/%s %s: %s\n", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
	}
	return sb.String()
}
