package controller

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlcontroller "sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/source"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/allocation"
	"github.com/tessera-dev/tessera/pkg/control/decide"
	"github.com/tessera-dev/tessera/pkg/control/history"
	"github.com/tessera-dev/tessera/pkg/control/installcheck"
	"github.com/tessera-dev/tessera/pkg/control/sliceintern"
	"github.com/tessera-dev/tessera/pkg/control/webhook"
	featuregates "github.com/tessera-dev/tessera/pkg/featuregates"
	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
)

// NewScheme returns the scheme the controller works with.
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, nil
}

// New builds the manager: cache (labelled pods only), the admission
// controller, webhooks, metrics and health endpoints, leader election.
// Registry is where metrics go (nil: controller-runtime's registry).
func New(ctx context.Context, cfg *rest.Config, o Options) (manager.Manager, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx)
	scheme, err := NewScheme()
	if err != nil {
		return nil, err
	}
	direct, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("API client: %w", err)
	}
	queued, err := labels.NewRequirement(v1alpha1.QueueLabel, selection.Exists, nil)
	if err != nil {
		return nil, err
	}
	var (
		whServer ctrlwebhook.Server
		target   *webhook.Target
	)
	if o.WebhookPort > 0 && !o.Shadow {
		whServer, target, err = webhookServer(ctx, direct, o)
		if err != nil {
			return nil, err
		}
	}
	attrs := sliceintern.New(0, nil)
	mgrOpts := ctrl.Options{
		Scheme:                        scheme,
		Logger:                        logger,
		Metrics:                       metricsserver.Options{BindAddress: o.MetricsBindAddress},
		HealthProbeBindAddress:        o.HealthProbeBindAddress,
		LeaderElection:                o.LeaderElect,
		LeaderElectionID:              o.LeaderElectionID,
		LeaderElectionNamespace:       o.Namespace,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 ptr.To(o.LeaderElectionLease),
		RenewDeadline:                 ptr.To(o.LeaderElectionRenewTime),
		// The cache keeps no managed fields (nothing reads them) and one
		// copy of what ResourceSlices repeat (sliceintern: capacities,
		// counter consumptions, attribute values shared between devices);
		// the devices' attributes in attrs' compact form, which every
		// reader of the cached slices is given.
		Cache: cache.Options{
			DefaultTransform: cache.TransformStripManagedFields(),
			ByObject: map[client.Object]cache.ByObject{
				&corev1.Pod{}:                {Label: labels.NewSelector().Add(*queued)},
				&v1alpha1.Queue{}:            {Transform: gatedQueueFields(o)},
				&resourceapi.ResourceSlice{}: {Transform: attrs.Transform()},
			},
		},
		WebhookServer: whServer,
		BaseContext:   func() context.Context { return ctx },
	}
	if o.HealthProbeBindAddress == "0" {
		mgrOpts.HealthProbeBindAddress = ""
	}
	mgr, err := ctrl.NewManager(cfg, mgrOpts)
	if err != nil {
		return nil, fmt.Errorf("manager: %w", err)
	}
	features, err := schedulerFeatures(ctx, cfg, o)
	if err != nil {
		return nil, err
	}
	cfgEngine := decide.Config{Reclaim: o.Reclaim, MaxReclaimsPerCycle: o.MaxReclaimsPerCycle, Features: features,
		ReclaimGracePeriod: o.ReclaimGracePeriod, ReclaimPastBudgets: o.ReclaimPastBudgets}
	// DeviceTaintRules taint devices for the scheduler as published taints
	// do; the simulation applies them too, where the API serves them
	// (resource.k8s.io/v1, Kubernetes 1.37).
	watched := []client.Object{&v1alpha1.Queue{}, &corev1.Pod{}, &resourceapi.ResourceClaim{}, &resourceapi.ResourceClaimTemplate{},
		&resourceapi.ResourceSlice{}, &resourceapi.DeviceClass{}, &corev1.Node{}, &corev1.Namespace{}}
	if _, err := mgr.GetRESTMapper().RESTMapping(schema.GroupKind{Group: resourceapi.GroupName, Kind: "DeviceTaintRule"}, "v1"); err == nil && features.DeviceTaints {
		watched = append(watched, &resourceapi.DeviceTaintRule{})
		reader := mgr.GetCache()
		cfgEngine.TaintRules = func(ctx context.Context) ([]*resourceapi.DeviceTaintRule, error) {
			var l resourceapi.DeviceTaintRuleList
			if err := reader.List(ctx, &l, client.UnsafeDisableDeepCopy); err != nil {
				return nil, err
			}
			out := make([]*resourceapi.DeviceTaintRule, len(l.Items))
			for i := range l.Items {
				out[i] = &l.Items[i]
			}
			return out, nil
		}
	} else {
		logger.Info("DeviceTaintRules are not served (resource.k8s.io/v1) or device taints are off; the admission simulation sees published device taints only", "error", err)
	}
	reconciler := &Reconciler{
		Client:     mgr.GetClient(),
		Reader:     mgr.GetCache(),
		Attributes: attrs,
		Recorder:   mgr.GetEventRecorder(recorderName(o.ControllerName)),
		Engine:     decide.NewEngine(cfgEngine),
		Metrics:    NewMetrics(registry(o)),
		Opts:       o,
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("clientset: %w", err)
	}
	reconciler.Evictions = &Evictions{REST: cs.CoreV1().RESTClient()}
	if o.Shadow {
		if err := makeShadow(reconciler, direct, o); err != nil {
			return nil, err
		}
	}
	b := ctrl.NewControllerManagedBy(mgr).Named("admission").
		WithOptions(ctrlcontroller.Options{MaxConcurrentReconciles: 1, SkipNameValidation: ptr.To(true)})
	for _, obj := range watched {
		// Only changes that can admit a gated pod, move what the queues
		// hold or make a pin stale enqueue a cycle (changeTrigger).
		b = b.WatchesRawSource(source.Kind(mgr.GetCache(), obj, reconciler.Handler()))
	}
	if err := b.Complete(reconciler); err != nil {
		return nil, fmt.Errorf("admission controller: %w", err)
	}
	// A shadow writes nothing but its report: the active controller keeps
	// the history.
	if o.UsageHistoryInterval > 0 && !o.Shadow {
		keeper := &HistoryKeeper{Client: mgr.GetClient(), Reader: mgr.GetCache(), Attributes: attrs, Every: o.UsageHistoryInterval,
			Config: history.Config{HalfLife: o.UsageHalfLife, MaxGap: o.UsageMaxGap, Days: o.UsageHistoryDays}, Controller: o.ControllerName}
		if err := mgr.Add(keeper); err != nil {
			return nil, fmt.Errorf("usage history: %w", err)
		}
	}
	// Idle reclaim (queues' spec.idle): a leader-only loop of its own,
	// behind its feature gate.
	idler := NewIdleReclaimer(mgr.GetClient(), mgr.GetCache(), reconciler.Recorder, reconciler.Metrics)
	idler.Informers = mgr.GetCache()
	idler.Controller = o.ControllerName
	if !o.Enabled(featuregates.IdleReclaim) {
		idler.Off = true
		logger.Info("Idle reclaim is off: Queues' spec.idle is ignored", "featureGate", featuregates.IdleReclaim)
	}
	if err := mgr.Add(idler); err != nil {
		return nil, fmt.Errorf("idle reclaim: %w", err)
	}
	if whServer != nil {
		whServer = mgr.GetWebhookServer() // adds it to the manager's runnables
		decoder := webhook.NewDecoder(scheme)
		// Every pod creation waits for the pod webhook: it reads the
		// Namespace and the Queue (neither a tenant can change) from the
		// cache. The Namespace informer starts now, not on the first pod.
		if _, err := mgr.GetCache().GetInformer(ctx, &corev1.Namespace{}); err != nil {
			return nil, fmt.Errorf("namespace informer: %w", err)
		}
		whServer.Register(webhook.PodsPath, &ctrlwebhook.Admission{Handler: webhook.Detached(&webhook.PodGater{Decoder: decoder, Reader: webhook.CacheFirst(mgr.GetCache(), direct)})})
		whServer.Register(webhook.ClaimsPath, &ctrlwebhook.Admission{Handler: webhook.Detached(&webhook.ClaimValidator{Decoder: decoder, Reader: direct, Driver: devicemodel.DriverName, CEL: cel.NewCache(100, cel.Features{})})})
		if o.Translate {
			whServer.Register(webhook.TranslatePath, &ctrlwebhook.Admission{Handler: webhook.Detached(&webhook.PodTranslator{Decoder: decoder,
				Reader: webhook.CacheFirst(mgr.GetCache(), direct), Attributes: attrs, Client: direct, Config: o.TranslateConfig()})})
			janitor := &TemplateJanitor{Client: direct, Recorder: reconciler.Recorder, Grace: o.TranslateTemplateGrace}
			if err := mgr.Add(janitor); err != nil {
				return nil, fmt.Errorf("translation templates: %w", err)
			}
		}
		whServer.Register(webhook.QueuesPath, &ctrlwebhook.Admission{Handler: webhook.Detached(&webhook.QueueValidator{Decoder: decoder, Reader: direct})})
		if target != nil {
			t := *target
			if err := mgr.Add(&configurer{server: whServer, client: direct, target: t}); err != nil {
				return nil, err
			}
		}
		if err := mgr.AddReadyzCheck("webhook", whServer.StartedChecker()); err != nil {
			return nil, err
		}
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, err
	}
	return mgr, nil
}

// Run builds the manager and runs it until ctx ends.
func Run(ctx context.Context, cfg *rest.Config, o Options) error {
	mgr, err := New(ctx, cfg, o)
	if err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Starting the Tessera controller", "leaderElect", o.LeaderElect, "namespace", o.Namespace,
		"webhook", net.JoinHostPort(o.WebhookHost, strconv.Itoa(o.WebhookPort)), "webhookConfig", o.WebhookConfig, "reclaim", o.Reclaim, "reclaimGracePeriod", o.ReclaimGracePeriod, "reclaimPastBudgets", o.ReclaimPastBudgets, "pinNodes", o.PinNodes, "stalePinGrace", o.StalePinGrace, "replaceStalePins", o.ReplaceStalePins)
	return mgr.Start(ctx)
}

// webhookServer makes the webhook server with its certificate and says
// where the configurations must point (nil: leave them alone).
func webhookServer(ctx context.Context, c client.Client, o Options) (ctrlwebhook.Server, *webhook.Target, error) {
	opts := ctrlwebhook.Options{Host: o.WebhookHost, Port: o.WebhookPort}
	if o.WebhookConfig == WebhookNone {
		for _, f := range []string{"tls.crt", "tls.key"} {
			if _, err := os.Stat(filepath.Join(o.WebhookCertDir, f)); err != nil {
				return nil, nil, fmt.Errorf("--webhook-cert-dir: %w", err)
			}
		}
		opts.CertDir = o.WebhookCertDir
		return ctrlwebhook.NewServer(opts), nil, nil
	}
	ca, err := webhook.EnsureCA(ctx, c, o.Namespace, o.WebhookCertSecret)
	if err != nil {
		return nil, nil, fmt.Errorf("webhook CA: %w (does namespace %s exist? set --namespace)", err, o.Namespace)
	}
	hosts := append([]string{"127.0.0.1", "::1", "localhost"}, o.WebhookCertHosts...)
	if o.WebhookHost != "" && o.WebhookHost != "0.0.0.0" && o.WebhookHost != "::" {
		hosts = append(hosts, o.WebhookHost)
	}
	target := &webhook.Target{CABundle: ca.CertPEM}
	switch o.WebhookConfig {
	case WebhookPatch:
		target.Mutating, target.Validating = o.MutatingConfiguration, o.ValidatingConfiguration
	case WebhookService:
		ns, name, port, _ := parseService(o.WebhookService)
		hosts = append(hosts, name+"."+ns+".svc", name+"."+ns+".svc.cluster.local")
		target.Service = &admissionregistrationv1.ServiceReference{Namespace: ns, Name: name, Port: ptr.To(port)}
	default:
		base := o.WebhookURL
		if base == "" {
			host := o.WebhookHost
			if host == "" || host == "0.0.0.0" || host == "::" {
				host = "127.0.0.1"
			}
			base = "https://" + net.JoinHostPort(host, strconv.Itoa(o.WebhookPort))
		}
		u, err := url.Parse(base)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return nil, nil, fmt.Errorf("--webhook-url=%q is not an https URL", base)
		}
		hosts = append(hosts, u.Hostname())
		target.BaseURL = base
	}
	certs := &webhook.ServingCerts{CA: ca, Hosts: hosts}
	if _, err := certs.GetCertificate(nil); err != nil {
		return nil, nil, err
	}
	opts.TLSOpts = []func(*tls.Config){func(t *tls.Config) { t.GetCertificate = certs.GetCertificate }}
	return ctrlwebhook.NewServer(opts), target, nil
}

// configurer points the webhook configurations at the server once it
// serves. Every replica does it; they share the CA, so they agree.
type configurer struct {
	server ctrlwebhook.Server
	client client.Client
	target webhook.Target
}

func (c *configurer) NeedLeaderElection() bool { return false }

func (c *configurer) Start(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	check := c.server.StartedChecker()
	for check(nil) != nil {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(100 * time.Millisecond):
		}
	}
	for {
		var err error
		if c.target.Mutating != "" || c.target.Validating != "" {
			err = webhook.PatchCABundle(ctx, c.client, c.target.Mutating, c.target.Validating, c.target.CABundle)
		} else {
			err = webhook.EnsureConfigurations(ctx, c.client, c.target)
		}
		if err == nil {
			logger.Info("Webhook configurations point at this controller", "url", c.target.BaseURL, "service", c.target.Service,
				"mutating", c.target.Mutating, "validating", c.target.Validating)
			return nil
		}
		logger.Error(err, "Writing the webhook configurations failed; retrying")
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(2 * time.Second):
		}
	}
}

func registry(o Options) prometheus.Registerer {
	if o.Registry != nil {
		return o.Registry
	}
	return ctrlmetrics.Registry
}

// schedulerFeatures are the allocator features of the cluster's
// kube-scheduler: its version's defaults (--kubernetes-version, else the
// API server's version), then --scheduler-feature-gates.
func schedulerFeatures(ctx context.Context, cfg *rest.Config, o Options) (structured.Features, error) {
	v := o.KubernetesVersion
	if v == "" {
		dc, err := discovery.NewDiscoveryClientForConfig(cfg)
		if err != nil {
			return structured.Features{}, err
		}
		info, err := dc.ServerVersion()
		if err != nil {
			return structured.Features{}, fmt.Errorf("asking the API server for its version (set --kubernetes-version to skip): %w", err)
		}
		v = info.GitVersion
	}
	f, err := allocation.FeaturesFor(v)
	if err != nil {
		return f, err
	}
	if f, err = allocation.Override(f, o.SchedulerFeatureGates); err != nil {
		return f, fmt.Errorf("--scheduler-feature-gates: %w", err)
	}
	klog.FromContext(ctx).Info("Admission simulates the scheduler's allocator", "kubernetesVersion", v, "features", sets.List(f.Set()))
	if !f.ConsumableCapacity || !f.PartitionableDevices {
		klog.FromContext(ctx).Info("Warning: the scheduler lacks DRAConsumableCapacity or DRAPartitionableDevices: memory shares, time slices and MIG partitions cannot be allocated (see docs/compatibility.md)", "kubernetesVersion", v)
	}
	return f, nil
}

// CheckInstall runs the installation checks of package installcheck
// against the API server and reports on out (the chart's helm test).
func CheckInstall(ctx context.Context, cfg *rest.Config, opts Options, out io.Writer) error {
	scheme, err := NewScheme()
	if err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	return installcheck.Run(ctx, c, installcheck.Options{
		Driver: devicemodel.DriverName, DeviceClasses: opts.CheckInstallDeviceClasses,
		Namespace: opts.Namespace, Queue: opts.CheckInstallQueue, Image: "registry.k8s.io/pause:3.10",
		SandboxPolicy: opts.CheckInstallSandboxPolicy,
	}, out)
}

// gatedQueueFields is the Queue cache's transform: with
// TimeBasedFairShare off the controller reads every Queue as if it had no
// spec.fairSharing.usageWeighting, as the API server drops the fields of a
// disabled gate (nil: no transform).
func gatedQueueFields(o Options) toolscache.TransformFunc {
	if o.Enabled(featuregates.TimeBasedFairShare) {
		return nil
	}
	return func(obj any) (any, error) {
		if q, ok := obj.(*v1alpha1.Queue); ok && q.Spec.FairSharing != nil {
			q.Spec.FairSharing.UsageWeighting = nil
		}
		return obj, nil
	}
}
