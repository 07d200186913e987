// Package whatif runs the admission engine (pkg/control/decide) on the state of
// a live cluster, or on a saved copy of it, with and without a change
// (new queues, added or removed nodes, other decision flags), and says per
// queue what would start, wait and be reclaimed before and after. It also
// holds the shadow controller's report format, which the controller writes
// and `kubectl tessera shadow` reads.
package whatif

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"sort"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/decide"
)

// State is what one admission cycle reads: the same lists the controller
// takes its snapshot from (pkg/control/controller's snapshot), all namespaces.
type State struct {
	Queues     []*v1alpha1.Queue
	Pods       []*corev1.Pod
	Claims     []*resourceapi.ResourceClaim
	Templates  []*resourceapi.ResourceClaimTemplate
	Slices     []*resourceapi.ResourceSlice
	Classes    []*resourceapi.DeviceClass
	Nodes      []*corev1.Node
	Namespaces []*corev1.Namespace
	TaintRules []*resourceapi.DeviceTaintRule
}

// Scheme knows every kind a State holds.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}

// Read lists the state from the API (a controller-runtime client or
// reader; a fake one in tests). DeviceTaintRules are optional: an API
// server that does not serve them gives none.
func Read(ctx context.Context, r client.Reader) (*State, error) {
	var (
		queues     v1alpha1.QueueList
		pods       corev1.PodList
		claims     resourceapi.ResourceClaimList
		templates  resourceapi.ResourceClaimTemplateList
		slices     resourceapi.ResourceSliceList
		classes    resourceapi.DeviceClassList
		nodes      corev1.NodeList
		namespaces corev1.NamespaceList
		rules      resourceapi.DeviceTaintRuleList
	)
	for _, l := range []client.ObjectList{&queues, &claims, &templates, &slices, &classes, &nodes} {
		if err := r.List(ctx, l); err != nil {
			return nil, fmt.Errorf("listing %T: %w", l, err)
		}
	}
	if err := r.List(ctx, &pods, client.HasLabels{v1alpha1.QueueLabel}); err != nil {
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	if err := r.List(ctx, &namespaces); err != nil {
		return nil, fmt.Errorf("listing namespaces: %w", err)
	}
	s := &State{}
	if err := r.List(ctx, &rules); err == nil {
		s.TaintRules = ptrs(rules.Items)
	} else if !meta.IsNoMatchError(err) && !isNotServed(err) {
		return nil, fmt.Errorf("listing DeviceTaintRules: %w", err)
	}
	s.Queues, s.Pods, s.Claims, s.Templates = ptrs(queues.Items), ptrs(pods.Items), ptrs(claims.Items), ptrs(templates.Items)
	s.Slices, s.Classes, s.Nodes, s.Namespaces = ptrs(slices.Items), ptrs(classes.Items), ptrs(nodes.Items), ptrs(namespaces.Items)
	return s, nil
}

func isNotServed(err error) bool {
	var d *meta.NoKindMatchError
	return errors.As(err, &d) || runtime.IsNotRegisteredError(err) || client.IgnoreNotFound(err) == nil
}

func ptrs[T any](items []T) []*T {
	out := make([]*T, len(items))
	for i := range items {
		out[i] = &items[i]
	}
	return out
}

// Snapshot is the admission engine's view of the state (shared objects:
// the engine does not modify them).
func (s *State) Snapshot() *decide.Snapshot {
	snap := &decide.Snapshot{Queues: s.Queues, Pods: s.Pods, Claims: s.Claims, Templates: s.Templates,
		Slices: s.Slices, Classes: s.Classes, Nodes: s.Nodes, Namespaces: s.Namespaces, TaintRules: s.TaintRules}
	if snap.TaintRules == nil {
		snap.TaintRules = []*resourceapi.DeviceTaintRule{}
	}
	return snap
}

// Objects lists every object of the state, kinds in a fixed order.
func (s *State) Objects() []client.Object {
	var out []client.Object
	out = appendObjects(out, s.Namespaces)
	out = appendObjects(out, s.Queues)
	out = appendObjects(out, s.Nodes)
	out = appendObjects(out, s.Classes)
	out = appendObjects(out, s.Slices)
	out = appendObjects(out, s.TaintRules)
	out = appendObjects(out, s.Templates)
	out = appendObjects(out, s.Claims)
	return appendObjects(out, s.Pods)
}

func appendObjects[T client.Object](out []client.Object, items []T) []client.Object {
	for _, o := range items {
		out = append(out, o)
	}
	return out
}

// Write saves the state as a multi-document YAML stream (apiVersion and
// kind set, managedFields dropped), which Load reads back.
func (s *State) Write(w io.Writer) error {
	scheme := Scheme()
	for i, o := range s.Objects() {
		c := o.DeepCopyObject().(client.Object)
		gvks, _, err := scheme.ObjectKinds(c)
		if err != nil {
			return err
		}
		c.GetObjectKind().SetGroupVersionKind(gvks[0])
		c.SetManagedFields(nil)
		data, err := yaml.Marshal(c)
		if err != nil {
			return err
		}
		if i > 0 {
			if _, err := io.WriteString(w, "---\n"); err != nil {
				return err
			}
		}
		if _, err := w.Write(data); err != nil {
			return err
		}
	}
	return nil
}

// Load reads a state Write saved (or any YAML stream or List of those
// kinds; other kinds are an error naming them).
func Load(r io.Reader) (*State, error) {
	objs, err := Decode(r)
	if err != nil {
		return nil, err
	}
	s := &State{}
	for _, o := range objs {
		if err := s.add(o); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (s *State) add(o runtime.Object) error {
	switch o := o.(type) {
	case *v1alpha1.Queue:
		s.Queues = append(s.Queues, o)
	case *corev1.Pod:
		s.Pods = append(s.Pods, o)
	case *resourceapi.ResourceClaim:
		s.Claims = append(s.Claims, o)
	case *resourceapi.ResourceClaimTemplate:
		s.Templates = append(s.Templates, o)
	case *resourceapi.ResourceSlice:
		s.Slices = append(s.Slices, o)
	case *resourceapi.DeviceClass:
		s.Classes = append(s.Classes, o)
	case *corev1.Node:
		s.Nodes = append(s.Nodes, o)
	case *corev1.Namespace:
		s.Namespaces = append(s.Namespaces, o)
	case *resourceapi.DeviceTaintRule:
		s.TaintRules = append(s.TaintRules, o)
	default:
		return fmt.Errorf("%s is not part of an admission snapshot", o.GetObjectKind().GroupVersionKind().Kind)
	}
	return nil
}

// Decode reads typed objects from a YAML (or JSON) stream; a List is
// expanded into its items.
func Decode(r io.Reader) ([]runtime.Object, error) {
	codecs := serializer.NewCodecFactory(Scheme())
	dec := codecs.UniversalDeserializer()
	rd := utilyaml.NewYAMLReader(bufio.NewReader(r))
	var out []runtime.Object
	for n := 1; ; n++ {
		doc, err := rd.Read()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", n, err)
		}
		if len(trimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := dec.Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", n, err)
		}
		if meta.IsListType(obj) {
			items, err := meta.ExtractList(obj)
			if err != nil {
				return nil, fmt.Errorf("document %d: %w", n, err)
			}
			for _, it := range items {
				if u, ok := it.(*runtime.Unknown); ok {
					o, _, err := dec.Decode(u.Raw, nil, nil)
					if err != nil {
						return nil, fmt.Errorf("document %d: %w", n, err)
					}
					it = o
				}
				out = append(out, it)
			}
			continue
		}
		out = append(out, obj)
	}
}

func trimSpace(b []byte) []byte {
	i := 0
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\t' || b[i] == '\r') {
		i++
	}
	// A document of comments only is empty too.
	rest := b[i:]
	for len(rest) > 0 && rest[0] == '#' {
		j := 0
		for j < len(rest) && rest[j] != '\n' {
			j++
		}
		rest = trimSpace(rest[min(j, len(rest)):])
	}
	return rest
}

// ReadQueues reads Queue objects (a YAML stream or List) for a change.
func ReadQueues(r io.Reader) ([]*v1alpha1.Queue, error) {
	objs, err := Decode(r)
	if err != nil {
		return nil, err
	}
	var out []*v1alpha1.Queue
	for _, o := range objs {
		q, ok := o.(*v1alpha1.Queue)
		if !ok {
			return nil, fmt.Errorf("%s is not a Queue", o.GetObjectKind().GroupVersionKind().Kind)
		}
		out = append(out, q)
	}
	return out, nil
}

// WithQueues returns the queues with the given ones replacing those of the
// same name, and added where new; sorted by name.
func WithQueues(current, changed []*v1alpha1.Queue) []*v1alpha1.Queue {
	byName := map[string]*v1alpha1.Queue{}
	for _, q := range current {
		byName[q.Name] = q
	}
	for _, q := range changed {
		c := q.DeepCopy()
		if old, ok := byName[q.Name]; ok {
			// The status (what the queue holds) stays the cluster's.
			c.Status = *old.Status.DeepCopy()
			c.UID = old.UID
		}
		byName[q.Name] = c
	}
	out := make([]*v1alpha1.Queue, 0, len(byName))
	for _, q := range byName {
		out = append(out, q)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
