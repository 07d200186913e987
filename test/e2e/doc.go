// Package e2e holds Tessera's end-to-end tests. They are built only with the
// `e2e` build tag and run against a real local cluster (test/localcluster)
// that TestMain brings up once for all tests and tears down afterwards:
//
//	go test -tags e2e -count=1 ./test/e2e/... -v -timeout 40m   (as root; or: make e2e)
//
// Tessera is installed with its Helm chart (deployments/helm/tessera with
// values/localcluster.yaml) from an image built without Docker and imported
// into containerd; each plugin configuration a test needs is a `helm
// upgrade`. TESSERA_INSTALL=host runs the plugin and controller as host
// processes instead, which is faster when debugging the plugin:
//
//	TESSERA_INSTALL=host go test -tags e2e -count=1 ./test/e2e/... -v -run TestPluginCrash
//
// Environment: TESSERA_INSTALL (chart, the default, or host),
// TESSERA_PROFILE (mock GPU profile the kubelet plugin starts with, default
// t4:2; tests that need the DRA driver switch it to the configuration they
// assert on), TESSERA_PLUGIN (auto|on|off), TESSERA_START_CONTROLLER=1,
// TESSERA_E2E_KEEP=1 (leave the cluster running after the tests),
// TESSERA_E2E_RESULTS=<dir> (TestPodStartLatency writes
// pod-start-latency.json there).
//
// What is covered:
//   - demo_test.go: each scenario of demo/ (the same YAML `make demo` runs,
//     through test/scenario): placement read from the claims'
//     allocation, and the containers' environment (limits equal to the
//     allocation, visible device UUIDs, enforcement mode) and the claim's
//     status.devices data;
//   - lifecycle_test.go: a pod that cannot fit stays Pending with the
//     scheduler's reason and starts when capacity frees; SIGKILL of the
//     plugin while pods hold claims (chart mode: the kubelet restarts the
//     container in the same pod); invalid opaque configuration; claim
//     status for configurations in any key order;
//   - upgrade_test.go (chart mode): `helm upgrade` to a changed value while
//     a pod holds a share claim: the plugin's pod is replaced, the pod keeps
//     running, new claims prepare, the old claim unprepares cleanly;
//   - rollback_test.go (chart mode): `helm rollback` of an upgrade of the
//     plugin and the controller while a claim pod runs and a queued pod
//     waits: the pod and its claim are untouched, the queued pod stays
//     gated, admission and prepare resume, the claim the later plugin
//     prepared unprepares with the earlier one; logs how long it took;
//   - canary_test.go (chart mode): kubeletPlugin.canary; labelling the node
//     moves it to the canary plugin DaemonSet (which prepares a claim),
//     removing the label moves it back (the main plugin unprepares it);
//   - latency_test.go: pod start latency with and without a share claim;
//   - canaryqueues_test.go (chart mode): a canary controller release
//     (controller.canary.enabled) next to the main one; a queue tree moves
//     to it and back with one field, each pod is admitted by the tree's
//     controller of the moment, running pods are untouched;
//   - shadow_test.go (chart mode): a shadow release with its own queue
//     limit reports the pod the active controller holds as would-admit
//     (`kubectl tessera shadow`) and its client makes no PATCH or DELETE;
//   - whatif_test.go: `kubectl tessera what-if -f` names exactly the
//     pending pods that start when the queues are applied;
//   - every test that prepares claims checks that deleting the pods
//     unprepares them: no CDI spec, checkpoint or accounting directory of
//     theirs is left on the node.
//
// Adding a scenario: write a TestXxx in a new file with the e2e build tag,
// call usePlugin(t, cfg) with the kubelet plugin configuration it needs
// (or requirePlugin(t) when any will do), take a fresh namespace with
// newNamespace(t), build pods with busyboxPod / claimPod (the only image
// there is; never pull), and use the clientset `cluster.Client`.
//
// One cluster, one node, one plugin configuration at a time: the tests run
// one after another, except the parallel group. A test that calls
// inParallel(t) instead of usePlugin and startController runs after all
// the others, at the same time as the rest of the group (`make e2e` passes
// -parallel 4), on the default configuration. It may join only when it
// changes nothing shared and asks no more than its share of the default
// profile's two T4s: inParallel's comment lists the conditions and the
// group's sum. The group's tests are those that spend most of their time
// waiting (an idle window, a pod's run, admission cycles).
package e2e
