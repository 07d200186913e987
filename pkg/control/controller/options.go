// Package controller is Tessera's queue controller: a controller-runtime
// manager with leader election that runs the admission cycle (pkg/control/decide)
// on every relevant change, applies its decisions (ungate, evict, explain),
// keeps Queue status, and serves the pod-gating and Queue-validating
// webhooks (pkg/control/webhook) with a self-signed CA it keeps in a Secret.
package controller

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/component-base/featuregate"

	"github.com/tessera-dev/tessera/api/v1alpha1"
	"github.com/tessera-dev/tessera/pkg/control/allocation"
	"github.com/tessera-dev/tessera/pkg/control/decide"
	"github.com/tessera-dev/tessera/pkg/control/webhook"
	"github.com/tessera-dev/tessera/pkg/featuregates"
	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
)

// Webhook configuration modes.
const (
	// WebhookAuto picks: patch when configuration names are given (the
	// Helm chart's self-signed mode), none when only --webhook-cert-dir is
	// (cert-manager), url otherwise (a host process).
	WebhookAuto = "auto"
	// WebhookPatch: the installer made the configurations (named by
	// --mutating-webhook-configuration and --validating-webhook-configuration);
	// the controller only sets their caBundle to its CA.
	WebhookPatch = "patch"
	// WebhookURL: the controller writes webhook configurations with a URL
	// (https://<webhook-host>:<webhook-port>) and its CA; for a controller
	// running as a host process next to the API server.
	WebhookURL = "url"
	// WebhookService: configurations name a Service (--webhook-service).
	WebhookService = "service"
	// WebhookNone: the controller serves with the certificate in
	// --webhook-cert-dir and leaves the configurations alone (Helm,
	// cert-manager).
	WebhookNone = "none"
)

// Pinning modes: which admitted pods get required node affinity on
// metadata.name for the node the admission simulation placed them on.
const (
	PinGangs = "gangs"
	PinAll   = "all"
	PinNone  = "none"
)

// Options are the controller's command-line options. The flag names are a
// contract with scripts, the e2e harness and the Helm chart.
type Options struct {
	Kubeconfig              string
	Namespace               string
	LeaderElect             bool
	LeaderElectionID        string
	MetricsBindAddress      string
	HealthProbeBindAddress  string
	WebhookHost             string
	WebhookPort             int
	WebhookConfig           string
	WebhookService          string
	WebhookURL              string
	WebhookCertDir          string
	WebhookCertSecret       string
	WebhookCertHosts        []string
	MutatingConfiguration   string
	ValidatingConfiguration string
	Reclaim                 bool
	MaxReclaimsPerCycle     int
	// ReclaimGracePeriod bounds a reclaimed pod's grace period;
	// ReclaimPastBudgets deletes a reclaim victim a PodDisruptionBudget
	// protects when no other over-quota work makes room (decide.Config).
	ReclaimGracePeriod      time.Duration
	ReclaimPastBudgets      bool
	PinNodes                string
	StalePinGrace           time.Duration
	ReplaceStalePins        bool
	CycleInterval           time.Duration
	ResyncPeriod            time.Duration
	StatusInterval          time.Duration
	KubeAPIQPS              float32
	KubeAPIBurst            int
	ApplyWorkers            int
	MaxReasonUpdates        int
	LeaderElectionLease     time.Duration
	LeaderElectionRenewTime time.Duration
	// Usage history (status.usage): see HistoryKeeper.
	UsageHalfLife        time.Duration
	UsageMaxGap          time.Duration
	UsageHistoryInterval time.Duration
	UsageHistoryDays     int
	// KubernetesVersion picks the scheduler's allocator features; empty
	// means the API server's version. SchedulerFeatureGates override them.
	KubernetesVersion     string
	SchedulerFeatureGates string
	// Registry receives the controller's metrics; nil means
	// controller-runtime's registry (served at --metrics-bind-address).
	Registry prometheus.Registerer
	// CheckInstall runs the installation checks (the chart's helm test)
	// instead of the controller: see CheckInstall.
	CheckInstall              bool
	CheckInstallQueue         string
	CheckInstallDeviceClasses []string
	CheckInstallSandboxPolicy string
	// Shadow runs the controller in shadow mode (shadow.go): it decides
	// and compares, and writes nothing but its report, the ConfigMap
	// ShadowReport in Namespace. ShadowQueues is a file of Queues that
	// replace the cluster's of the same name in its decisions.
	Shadow       bool
	ShadowReport string
	ShadowQueues string
	// ControllerName is this controller's name for canary queues: it
	// decides the pods of the queues whose root queue names it in
	// spec.controllerName (v1alpha1.DefaultControllerName: those that name
	// none) and leaves every other pod and queue alone.
	ControllerName string
	// Translation of pods written for the device plugin, HAMi or KAI
	// (pkg/control/webhook's TranslateConfig; docs/migration.md): served
	// at webhook.TranslatePath when Translate is set; the managed
	// templates no pod named for TranslateTemplateGrace are deleted.
	Translate               bool
	TranslateDevicePlugin   string
	TranslateQueueNames     map[string]string
	TranslateSchedulerNames []string
	TranslateGPUMemoryMiB   int64
	TranslateTemplateGrace  time.Duration
	// Gates are the controller's feature gates (featuregates.Controller), set
	// by --feature-gates; nil means their defaults.
	Gates featuregate.FeatureGate
}

// Enabled says whether one of the controller's feature gates is on.
func (o *Options) Enabled(f featuregate.Feature) bool {
	return featuregates.Enabled(o.Gates, featuregates.Controller(), f)
}

// DefaultNamespace is where the controller keeps its Secret and lease:
// $POD_NAMESPACE in a cluster, kube-system for a host process.
func DefaultNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	if data, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
		return strings.TrimSpace(string(data))
	}
	return "kube-system"
}

// AddFlags registers the options.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "Path to a kubeconfig; empty means in-cluster configuration.")
	fs.StringVar(&o.Namespace, "namespace", DefaultNamespace(), "Namespace of the leader-election lease and the webhook CA Secret.")
	fs.BoolVar(&o.LeaderElect, "leader-elect", false, "Elect a leader among replicas; only the leader admits and evicts (all replicas serve the webhooks).")
	fs.StringVar(&o.LeaderElectionID, "leader-election-id", "tessera-controller.tessera.dev", "Name of the leader-election lease.")
	fs.DurationVar(&o.LeaderElectionLease, "leader-election-lease-duration", 15*time.Second, "How long a leader's lease lasts without renewal.")
	fs.DurationVar(&o.LeaderElectionRenewTime, "leader-election-renew-deadline", 10*time.Second, "How long the leader keeps trying to renew before it gives up leadership.")
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", "127.0.0.1:8380", "Address of the Prometheus metrics endpoint; 0 disables it.")
	fs.StringVar(&o.HealthProbeBindAddress, "health-probe-bind-address", "127.0.0.1:8381", "Address of /healthz and /readyz; 0 disables them.")
	fs.StringVar(&o.WebhookHost, "webhook-host", "127.0.0.1", "Address the webhook server listens on (empty: all addresses); in --webhook-config=url mode also the host in the URL the API server calls. Unset, it is 127.0.0.1 in url mode and all addresses otherwise.")
	fs.IntVar(&o.WebhookPort, "webhook-port", 9443, "Port of the webhook server; 0 serves no webhooks.")
	fs.StringVar(&o.WebhookConfig, "webhook-config", WebhookAuto, "How the API server reaches the webhooks: url (the controller writes configurations with https://<webhook-host>:<webhook-port> and its CA), service (it writes configurations naming --webhook-service), patch (an installer made the configurations named by --mutating-webhook-configuration and --validating-webhook-configuration; the controller sets their caBundle), none (serve the certificate in --webhook-cert-dir, leave configurations alone), auto (patch if configuration names are given, none if only --webhook-cert-dir is, else url).")
	fs.StringVar(&o.WebhookService, "webhook-service", "", "For --webhook-config=service: <namespace>/<name>[:<port>] of the Service in front of the webhook server.")
	fs.StringVar(&o.WebhookURL, "webhook-url", "", "For --webhook-config=url: base URL the API server calls, if not https://<webhook-host>:<webhook-port>.")
	fs.StringVar(&o.WebhookCertDir, "webhook-cert-dir", "", "Directory with tls.crt and tls.key to serve (cert-manager); used by --webhook-config=none.")
	fs.StringVar(&o.WebhookCertSecret, "webhook-cert-secret", "tessera-controller-webhook-tls", "Secret (in --namespace) holding the self-signed webhook CA, shared by all replicas; created, or filled when an installer created it empty.")
	fs.StringSliceVar(&o.WebhookCertHosts, "webhook-cert-hosts", nil, "Extra host names or IP addresses the serving certificate covers (the Service's DNS names, the URL's host); 127.0.0.1, localhost and the webhook host are always covered.")
	fs.StringVar(&o.MutatingConfiguration, "mutating-webhook-configuration", "", "MutatingWebhookConfiguration made by the installer whose caBundle the controller sets (--webhook-config=patch).")
	fs.StringVar(&o.ValidatingConfiguration, "validating-webhook-configuration", "", "ValidatingWebhookConfiguration made by the installer whose caBundle the controller sets (--webhook-config=patch).")
	fs.BoolVar(&o.Reclaim, "reclaim", true, "Evict over-quota workloads of other queues (never below their quota) for a workload within its queue's quota that does not fit otherwise.")
	fs.IntVar(&o.MaxReclaimsPerCycle, "max-reclaims-per-cycle", 16, "Workloads one admission cycle tries to reclaim for; the others wait for the next cycle.")
	fs.DurationVar(&o.ReclaimGracePeriod, "reclaim-grace-period", decide.DefaultReclaimGracePeriod, "Longest grace period a pod evicted by reclaim gets (1s to 1h; 0: the default): its own terminationGracePeriodSeconds when shorter, else this, preStop hooks included; a victim already terminating with a later deadline is evicted again to cut it.")
	fs.BoolVar(&o.ReclaimPastBudgets, "reclaim-past-budgets", true, "When only over-quota workloads whose eviction a PodDisruptionBudget refused can make room for a workload within its quota, delete them (with the reclaim grace period; needs delete on pods). False: budgets are honoured and the workload waits, holding nothing.")
	fs.StringVar(&o.PinNodes, "pin-nodes", PinAll, "Which admitted pods get required node affinity (matchFields metadata.name) for the node the admission simulation placed them on, so that kube-scheduler filters that one node: all, gangs (members of a gang start where they were found to fit together), none. Stale pins are replaced (--stale-pin-grace).")
	fs.DurationVar(&o.StalePinGrace, "stale-pin-grace", 2*time.Minute, "How long a pinned pod may stay unschedulable (PodScheduled=False, reason Unschedulable) before its pin counts as stale; a pin to a node that is gone is stale at once.")
	fs.BoolVar(&o.ReplaceStalePins, "replace-stale-pins", true, "Delete a never-bound pod whose pin is stale, so that its owner recreates it and the replacement is queued again (a bare pod is deleted too: its event says to create it again); false only marks it (condition and event, reason StalePin).")
	fs.DurationVar(&o.CycleInterval, "cycle-interval", 500*time.Millisecond, "Minimum time between admission cycles; changes in between are decided together.")
	fs.DurationVar(&o.ResyncPeriod, "resync-period", 30*time.Second, "Run an admission cycle at least this often while pods are gated.")
	fs.DurationVar(&o.StatusInterval, "status-interval", 5*time.Second, "With no pod gated, refresh queue status (no admission cycle: what runs is charged, nothing is simulated) at most this often after what the queues hold changed; 0: on every change.")
	fs.DurationVar(&o.UsageHalfLife, "usage-half-life", 24*time.Hour, "Half-life of the decayed usage history in Queue status.usage (time-based fair share divides by it); 0: no decay.")
	fs.DurationVar(&o.UsageMaxGap, "usage-max-gap", 10*time.Minute, "When the usage history was not updated for longer (controller down, no leader), the last recorded rates are integrated over at most this much of the gap.")
	fs.DurationVar(&o.UsageHistoryInterval, "usage-history-interval", time.Minute, "How often the leader integrates the queues' usage history into their status; 0: no history.")
	fs.IntVar(&o.UsageHistoryDays, "usage-history-days", 14, "UTC days of daily usage buckets kept in Queue status.usage.days (kubectl tessera report --since reads them).")
	fs.Float32Var(&o.KubeAPIQPS, "kube-api-qps", 200, "Client-side limit of queries per second to the API server, per resource type. Admitting a pod costs two pod writes (ungate, condition), so this bounds admission to about half as many pods per second; the API server's priority and fairness protects it beyond that.")
	fs.IntVar(&o.KubeAPIBurst, "kube-api-burst", 400, "Burst of queries to the API server, per resource type.")
	fs.IntVar(&o.MaxReasonUpdates, "max-reason-updates-per-cycle", 256, "Waiting pods whose condition and event are updated per cycle (the rest in later cycles), so that explaining a long queue never holds up admissions.")
	fs.StringVar(&o.KubernetesVersion, "kubernetes-version", "", "Kubernetes version whose kube-scheduler defaults the admission simulation uses (e.g. v1.35.2); empty asks the API server.")
	fs.StringVar(&o.SchedulerFeatureGates, "scheduler-feature-gates", "", "DRA feature gates your kube-scheduler sets differently from its version's defaults, in its --feature-gates syntax, e.g. DRAConsumableCapacity=true,DRAPartitionableDevices=true on 1.35.")
	fs.IntVar(&o.ApplyWorkers, "apply-workers", 16, "Parallel API calls when applying a cycle's decisions (ungating a gang's members, pod conditions).")
	fs.BoolVar(&o.Shadow, "shadow", false, "Shadow mode: watch and decide every cycle with this controller's flags (and --shadow-queues), write nothing to pods, claims or queues (no ungating, evictions, conditions, events, queue status; no webhooks), and report where the decisions differ from the active controller's in the ConfigMap --shadow-report and metrics tessera_shadow_*. Its lease defaults to "+DefaultShadowLease+".")
	fs.StringVar(&o.ShadowReport, "shadow-report", "tessera-shadow-report", "ConfigMap (in --namespace) the shadow keeps its report in: the only object it writes (kubectl tessera shadow reads it).")
	fs.StringVar(&o.ShadowQueues, "shadow-queues", "", "With --shadow: a YAML file of Queues that replace the cluster's queues of the same name (or are added) in the shadow's decisions.")
	fs.StringVar(&o.ControllerName, "controller-name", v1alpha1.DefaultControllerName, "Which queues this controller decides (canary queues): those whose root queue's spec.controllerName names it; "+v1alpha1.DefaultControllerName+" (the main controller) also takes the queues that name none. Another name (a canary release) serves no webhooks and takes its own lease, tessera-controller-<name>.tessera.dev.")
	fs.BoolVar(&o.CheckInstall, "check-install", false, "Check the installation and exit (the Helm chart's `helm test`): DeviceClasses, ResourceSlices, the Queue API and, with --check-install-queue, that the pod webhook gates a queued pod (a dry run in --namespace).")
	fs.StringVar(&o.CheckInstallQueue, "check-install-queue", "", "Queue the --check-install dry-run pod names; empty skips the webhook check.")
	fs.StringVar(&o.CheckInstallSandboxPolicy, "check-install-sandbox-policy", "", "ValidatingAdmissionPolicy --check-install expects to keep device users in Tessera's sandbox (the chart's <release>-sandbox); empty skips the check.")
	fs.BoolVar(&o.Translate, "translate", false, "Serve the translating pod webhook ("+webhook.TranslatePath+"): pods written for the NVIDIA device plugin, HAMi or KAI get claims on Tessera's classes at creation (docs/migration.md); which namespaces is the webhook configuration's (the chart's translation values).")
	fs.StringVar(&o.TranslateDevicePlugin, "translate-device-plugin", webhook.DevicePluginWhole, "What nvidia.com/gpu: N meant on the old cluster: whole (N whole GPUs) or timeslice (N time slices: the device plugin time-sliced).")
	fs.StringToStringVar(&o.TranslateQueueNames, "translate-queue-names", nil, "KAI queue names (labels kai.scheduler/queue, runai/queue) mapped onto Tessera queues, <theirs>=<ours>,...; others keep their name.")
	fs.StringSliceVar(&o.TranslateSchedulerNames, "translate-scheduler-names", nil, "schedulerNames (kai-scheduler, hami-scheduler) whose pods the translation moves to the default scheduler; others are kept.")
	fs.Int64Var(&o.TranslateGPUMemoryMiB, "translate-gpu-memory-mib", 0, "GPU memory (MiB) KAI's gpu-fraction and HAMi's gpumem-percentage are of; 0: the usable memory the cluster's GPUs publish, when they all agree (else such pods are refused).")
	fs.DurationVar(&o.TranslateTemplateGrace, "translate-template-grace", 10*time.Minute, "Managed templates (label "+webhook.ManagedTemplateLabel+") no pod names and none used for this long are deleted.")
	fs.StringSliceVar(&o.CheckInstallDeviceClasses, "check-install-device-classes", []string{"gpu.tessera.dev", "mig.tessera.dev", "timeslice.tessera.dev"}, "DeviceClasses --check-install expects.")
}

// TranslateConfig is the translating webhook's configuration.
func (o *Options) TranslateConfig() webhook.TranslateConfig {
	dp := o.TranslateDevicePlugin
	if dp == "" {
		dp = webhook.DevicePluginWhole
	}
	return webhook.TranslateConfig{Driver: devicemodel.DriverName, GPUClass: "gpu.tessera.dev", TimeSliceClass: "timeslice.tessera.dev",
		DevicePlugin: dp, QueueNames: o.TranslateQueueNames, SchedulerNames: o.TranslateSchedulerNames, GPUMemoryMiB: o.TranslateGPUMemoryMiB}
}

// Complete resolves defaults that depend on other flags; changed says
// whether a flag was given on the command line.
func (o *Options) Complete(changed func(flag string) bool) {
	if o.WebhookConfig == WebhookAuto {
		switch {
		case o.MutatingConfiguration != "" || o.ValidatingConfiguration != "":
			o.WebhookConfig = WebhookPatch
		case o.WebhookCertDir != "" && !changed("webhook-cert-secret"):
			o.WebhookConfig = WebhookNone
		default:
			o.WebhookConfig = WebhookURL
		}
	}
	if o.Shadow {
		// No webhooks of its own, and never the active controller's lease.
		o.WebhookPort = 0
		if !changed("leader-election-id") {
			o.LeaderElectionID = DefaultShadowLease
		}
	}
	if o.ControllerName != "" && o.ControllerName != v1alpha1.DefaultControllerName {
		// A canary: the main controller serves the webhooks; a lease of
		// its own.
		if !changed("webhook-port") {
			o.WebhookPort = 0
		}
		if !changed("leader-election-id") && !o.Shadow {
			o.LeaderElectionID = "tessera-controller-" + o.ControllerName + ".tessera.dev"
		}
	}
	if !changed("webhook-host") && o.WebhookConfig != WebhookURL {
		o.WebhookHost = "" // reached through a Service: listen everywhere
	}
}

// Validate checks the options; messages name the flag to fix.
func (o *Options) Validate() error {
	if o.TranslateDevicePlugin != "" && o.TranslateDevicePlugin != webhook.DevicePluginWhole && o.TranslateDevicePlugin != webhook.DevicePluginTimeSlice {
		return fmt.Errorf("--translate-device-plugin=%q: want %s or %s", o.TranslateDevicePlugin, webhook.DevicePluginWhole, webhook.DevicePluginTimeSlice)
	}
	if o.Translate && o.TranslateTemplateGrace < 2*time.Minute {
		return fmt.Errorf("--translate-template-grace=%s: want 2m or more (the webhook marks a reused template at most once a minute)", o.TranslateTemplateGrace)
	}
	if o.TranslateGPUMemoryMiB < 0 {
		return fmt.Errorf("--translate-gpu-memory-mib=%d: want 0 or more", o.TranslateGPUMemoryMiB)
	}
	switch o.WebhookConfig {
	case WebhookURL, WebhookNone:
	case WebhookAuto:
		o.Complete(func(string) bool { return true })
	case WebhookPatch:
		if o.MutatingConfiguration == "" && o.ValidatingConfiguration == "" {
			return fmt.Errorf("--webhook-config=patch needs --mutating-webhook-configuration or --validating-webhook-configuration")
		}
	case WebhookService:
		if _, _, _, err := parseService(o.WebhookService); err != nil {
			return err
		}
	default:
		return fmt.Errorf("--webhook-config=%q is not valid: use auto, url, service, patch or none", o.WebhookConfig)
	}
	if o.WebhookConfig == WebhookNone && o.WebhookPort > 0 && o.WebhookCertDir == "" {
		return fmt.Errorf("--webhook-config=none needs --webhook-cert-dir with tls.crt and tls.key")
	}
	switch o.PinNodes {
	case PinGangs, PinAll, PinNone:
	default:
		return fmt.Errorf("--pin-nodes=%q is not valid: use gangs, all or none", o.PinNodes)
	}
	if o.WebhookPort > 65535 {
		return fmt.Errorf("--webhook-port=%d is not a port", o.WebhookPort)
	}
	if o.ReclaimGracePeriod != 0 && (o.ReclaimGracePeriod < time.Second || o.ReclaimGracePeriod > time.Hour) {
		return fmt.Errorf("--reclaim-grace-period=%s must be between 1s and 1h (0: the default, %s): a victim's pods get at most this long to stop, and a grace period of 0 would remove them from the API before their containers stop", o.ReclaimGracePeriod, decide.DefaultReclaimGracePeriod)
	}
	if o.StalePinGrace < 0 {
		return fmt.Errorf("--stale-pin-grace must not be negative")
	}
	if o.CycleInterval < 0 || o.ResyncPeriod <= 0 {
		return fmt.Errorf("--cycle-interval must not be negative and --resync-period must be positive")
	}
	if o.StatusInterval < 0 {
		return fmt.Errorf("--status-interval=%s must not be negative (0 refreshes queue status on every change)", o.StatusInterval)
	}
	if o.KubernetesVersion != "" {
		if _, err := allocation.FeaturesFor(o.KubernetesVersion); err != nil {
			return fmt.Errorf("--kubernetes-version: %w", err)
		}
	}
	if _, err := allocation.Override(allocation.SchedulerFeatures, o.SchedulerFeatureGates); err != nil {
		return fmt.Errorf("--scheduler-feature-gates: %w", err)
	}
	if o.UsageHalfLife < 0 || o.UsageMaxGap < 0 || o.UsageHistoryInterval < 0 || o.UsageHistoryDays < 0 || o.UsageHistoryDays > 400 {
		return fmt.Errorf("--usage-half-life, --usage-max-gap and --usage-history-interval must not be negative; --usage-history-days is 0 to 400")
	}
	if o.Shadow {
		if err := featuregates.Require(o.Gates, featuregates.Controller(), featuregates.ShadowMode, "--shadow"); err != nil {
			return err
		}
		if o.WebhookPort != 0 {
			return fmt.Errorf("--shadow serves no webhooks: leave --webhook-port unset or 0")
		}
		if o.LeaderElectionID == "tessera-controller.tessera.dev" {
			return fmt.Errorf("--shadow must not take the active controller's lease: use another --leader-election-id (default %s)", DefaultShadowLease)
		}
		if o.ShadowReport == "" {
			return fmt.Errorf("--shadow needs --shadow-report")
		}
	} else if o.ShadowQueues != "" {
		return fmt.Errorf("--shadow-queues needs --shadow")
	}
	if o.ControllerName == "" {
		o.ControllerName = v1alpha1.DefaultControllerName
	}
	if errs := validation.IsDNS1123Label(o.ControllerName); len(errs) > 0 {
		return fmt.Errorf("--controller-name=%q is not a DNS label (%s): use lower-case letters, digits and '-', at most 63", o.ControllerName, strings.Join(errs, "; "))
	}
	if o.ControllerName != v1alpha1.DefaultControllerName {
		if err := featuregates.Require(o.Gates, featuregates.Controller(), featuregates.CanaryControllers, "--controller-name="+o.ControllerName); err != nil {
			return err
		}
		if o.WebhookPort != 0 {
			return fmt.Errorf("--controller-name=%s serves no webhooks (the main controller, --controller-name=%s, serves them for every queue): leave --webhook-port unset or 0", o.ControllerName, v1alpha1.DefaultControllerName)
		}
		if o.LeaderElectionID == "tessera-controller.tessera.dev" {
			return fmt.Errorf("--controller-name=%s must not take the main controller's lease: leave --leader-election-id unset (default tessera-controller-%s.tessera.dev)", o.ControllerName, o.ControllerName)
		}
	}
	if o.ApplyWorkers < 1 {
		return fmt.Errorf("--apply-workers=%d must be at least 1", o.ApplyWorkers)
	}
	return nil
}

// parseService reads <namespace>/<name>[:<port>].
func parseService(s string) (ns, name string, port int32, err error) {
	ns, rest, ok := strings.Cut(s, "/")
	if !ok || ns == "" || rest == "" {
		return "", "", 0, fmt.Errorf("--webhook-service=%q: use <namespace>/<name>[:<port>], e.g. tessera-system/tessera-controller-webhook:443", s)
	}
	name, p, hasPort := strings.Cut(rest, ":")
	port = 443
	if hasPort {
		var n int
		if _, err := fmt.Sscanf(p, "%d", &n); err != nil || n < 1 || n > 65535 {
			return "", "", 0, fmt.Errorf("--webhook-service=%q: port %q is not a port", s, p)
		}
		port = int32(n)
	}
	return ns, name, port, nil
}
