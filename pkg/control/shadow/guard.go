package shadow

import (
	corev1 "k8s.io/api/core/v1"

	"context"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ErrWrite is what the shadow's client answers to any write but its
// report.
var ErrWrite = errors.New("shadow mode: the shadow controller writes nothing but its report")

// guardClient is the shadow's client: it reads everything and refuses
// every write except to its report ConfigMap, loudly (an error, a log
// line and tessera_shadow_refused_writes_total).
type guardClient struct {
	client.Client
	namespace, name string
	refused         func()
}

// NewGuardClient wraps c so that it writes only the ConfigMap
// namespace/name. refused (may be nil) is called on every refused write.
func NewGuardClient(c client.Client, namespace, name string, refused func()) client.Client {
	return &guardClient{Client: c, namespace: namespace, name: name, refused: refused}
}

func (g *guardClient) allowed(obj any) error {
	if cm, ok := obj.(*corev1.ConfigMap); ok && cm.Namespace == g.namespace && cm.Name == g.name {
		return nil
	}
	if r, ok := obj.(refuseAll); ok {
		obj = r.Object
	}
	what := "an apply configuration"
	if o, ok := obj.(client.Object); ok {
		what = fmt.Sprintf("%T %s/%s", obj, o.GetNamespace(), o.GetName())
	}
	if g.refused != nil {
		g.refused()
	}
	klog.Background().Error(ErrWrite, "Refused a write", "object", what, "report", g.namespace+"/"+g.name)
	return fmt.Errorf("%w: refused to write %s", ErrWrite, what)
}

func (g *guardClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if err := g.allowed(obj); err != nil {
		return err
	}
	return g.Client.Create(ctx, obj, opts...)
}

func (g *guardClient) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	if err := g.allowed(obj); err != nil {
		return err
	}
	return g.Client.Update(ctx, obj, opts...)
}

func (g *guardClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	if err := g.allowed(obj); err != nil {
		return err
	}
	return g.Client.Patch(ctx, obj, patch, opts...)
}

func (g *guardClient) Delete(ctx context.Context, obj client.Object, _ ...client.DeleteOption) error {
	return g.allowed(refuseAll{obj})
}

func (g *guardClient) DeleteAllOf(ctx context.Context, obj client.Object, _ ...client.DeleteAllOfOption) error {
	return g.allowed(refuseAll{obj})
}

func (g *guardClient) Apply(ctx context.Context, obj runtime.ApplyConfiguration, _ ...client.ApplyOption) error {
	return g.allowed(nil)
}

func (g *guardClient) Status() client.SubResourceWriter { return guardSub{g, "status"} }

func (g *guardClient) SubResource(sub string) client.SubResourceClient {
	return guardSub{g, sub}
}

// refuseAll is an object no write of which is allowed (deletes: the report
// is never deleted).
type refuseAll struct{ client.Object }

// guardSub refuses every subresource write (status, eviction, binding...).
type guardSub struct {
	g   *guardClient
	sub string
}

func (s guardSub) Get(ctx context.Context, obj client.Object, subResource client.Object, opts ...client.SubResourceGetOption) error {
	return s.g.Client.SubResource(s.sub).Get(ctx, obj, subResource, opts...)
}

func (s guardSub) Create(_ context.Context, obj client.Object, _ client.Object, _ ...client.SubResourceCreateOption) error {
	return s.g.allowed(refuseAll{obj})
}

func (s guardSub) Update(_ context.Context, obj client.Object, _ ...client.SubResourceUpdateOption) error {
	return s.g.allowed(refuseAll{obj})
}

func (s guardSub) Patch(_ context.Context, obj client.Object, _ client.Patch, _ ...client.SubResourcePatchOption) error {
	return s.g.allowed(refuseAll{obj})
}

func (s guardSub) Apply(_ context.Context, _ runtime.ApplyConfiguration, _ ...client.SubResourceApplyOption) error {
	return s.g.allowed(nil)
}
