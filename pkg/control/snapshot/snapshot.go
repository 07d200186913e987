// Package snapshot reads, writes and loads what one admission cycle
// decides on (decide.Snapshot): the controller takes it from its informer
// cache every cycle, kubectl-tessera from the API server (`kubectl tessera
// snapshot`, `what-if`), what-if and the simulator load it from a file.
package snapshot

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"

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
	"github.com/tessera-dev/tessera/pkg/control/sliceintern"
)

// Scheme knows every kind a snapshot holds.
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

// Options tune Read.
type Options struct {
	// List apply to every list (client.UnsafeDisableDeepCopy for a
	// reader over an informer cache whose objects nobody modifies).
	List []client.ListOption
	// NoTaintRules leaves DeviceTaintRules out (TaintRules nil): the
	// engine's Config.TaintRules lists them (the controller).
	NoTaintRules bool
	// Attributes reads the devices' attributes where the reader is the
	// controller's cache (Snapshot.Attributes).
	Attributes *sliceintern.Interner
}

// Read lists a snapshot from the API (a controller-runtime client, or a
// reader over an informer cache; a fake one in tests): the queues, the
// pods labelled with a queue, every claim, template, slice, class, node
// and namespace, and the DeviceTaintRules (none where the API server does
// not serve them).
func Read(ctx context.Context, r client.Reader, o Options) (*decide.Snapshot, error) {
	var (
		queues     v1alpha1.QueueList
		pods       corev1.PodList
		claims     resourceapi.ResourceClaimList
		templates  resourceapi.ResourceClaimTemplateList
		slices     resourceapi.ResourceSliceList
		classes    resourceapi.DeviceClassList
		nodes      corev1.NodeList
		namespaces corev1.NamespaceList
	)
	for _, l := range []client.ObjectList{&queues, &claims, &templates, &slices, &classes, &nodes, &namespaces} {
		if err := r.List(ctx, l, o.List...); err != nil {
			return nil, fmt.Errorf("listing %T: %w", l, err)
		}
	}
	if err := r.List(ctx, &pods, append([]client.ListOption{client.HasLabels{v1alpha1.QueueLabel}}, o.List...)...); err != nil {
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	s := &decide.Snapshot{
		Queues: ptrs(queues.Items), Pods: ptrs(pods.Items), Claims: ptrs(claims.Items), Templates: ptrs(templates.Items),
		Slices: ptrs(slices.Items), Classes: ptrs(classes.Items), Nodes: ptrs(nodes.Items), Namespaces: ptrs(namespaces.Items),
		Attributes: o.Attributes,
	}
	if o.NoTaintRules {
		return s, nil
	}
	var rules resourceapi.DeviceTaintRuleList
	switch err := r.List(ctx, &rules, o.List...); {
	case err == nil:
		s.TaintRules = ptrs(rules.Items)
	case meta.IsNoMatchError(err) || isNotServed(err):
		s.TaintRules = []*resourceapi.DeviceTaintRule{}
	default:
		return nil, fmt.Errorf("listing DeviceTaintRules: %w", err)
	}
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

// Objects lists every object of the snapshot, kinds in a fixed order.
func Objects(s *decide.Snapshot) []client.Object {
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

// Write saves the snapshot as a multi-document YAML stream (apiVersion and
// kind set, managedFields dropped), which Load reads back.
func Write(w io.Writer, s *decide.Snapshot) error {
	scheme := Scheme()
	for i, o := range Objects(s) {
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

// Load reads a snapshot Write saved (or any YAML stream or List of those
// kinds; other kinds are an error naming them).
func Load(r io.Reader) (*decide.Snapshot, error) {
	objs, err := Decode(r)
	if err != nil {
		return nil, err
	}
	s := &decide.Snapshot{TaintRules: []*resourceapi.DeviceTaintRule{}}
	for _, o := range objs {
		if err := add(s, o); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func add(s *decide.Snapshot, o runtime.Object) error {
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
