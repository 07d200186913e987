// Package e2e holds Tessera's end-to-end tests. They are built only with the
// `e2e` build tag and run against a real local cluster (test/localcluster)
// that TestMain brings up once for all tests and tears down afterwards:
//
//	go test -tags e2e -count=1 ./test/e2e/... -v -timeout 40m   (as root; or: make e2e)
//
// Environment: TESSERA_PROFILE (mock GPU profile of the kubelet plugin,
// default t4:2), TESSERA_PLUGIN (auto|on|off), TESSERA_START_CONTROLLER=1,
// TESSERA_E2E_KEEP=1 (leave the cluster running after the tests).
//
// Adding a scenario: write a TestXxx in a new file with the e2e build tag, take
// a fresh namespace with newNamespace(t), build pods with busyboxPod (the only
// image there is; never pull), and use the clientset `cluster.Client`. Call
// requirePlugin(t) first when the test needs the DRA driver.
package e2e
