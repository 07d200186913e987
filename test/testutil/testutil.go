// Package testutil holds the helpers tests across the repository share:
// the repository's root, a free loopback port, and waiting for a condition.
// Product code (pkg/, cmd/) never imports it; tests of any package may.
package testutil

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Module is the repository's Go module path.
const Module = "github.com/tessera-dev/tessera"

// RepoRoot walks up from the working directory to the directory whose
// go.mod declares Module.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.HasPrefix(string(data), "module "+Module+"\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod of " + Module + " above the working directory")
		}
		dir = parent
	}
}

// Root is RepoRoot for a test: it fails the test when there is none.
func Root(t testing.TB) string {
	t.Helper()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// Path joins elements to the repository's root.
func Path(t testing.TB, elem ...string) string {
	t.Helper()
	return filepath.Join(append([]string{Root(t)}, elem...)...)
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Eventually calls f until it returns nil and fails the test with f's last
// error when timeout passes first. It polls every 20ms for a second, then
// every 100ms.
func Eventually(t testing.TB, timeout time.Duration, what string, f func() error) {
	t.Helper()
	start := time.Now()
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Since(start) > timeout {
			t.Fatalf("%s: still %v after %s", what, err, timeout)
		}
		if time.Since(start) < time.Second {
			time.Sleep(20 * time.Millisecond)
		} else {
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// EventuallyTrue is Eventually for a condition without an error to report.
func EventuallyTrue(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	Eventually(t, timeout, what, func() error {
		if cond() {
			return nil
		}
		return errors.New("not yet")
	})
}

// LiveHeap is the heap in use after two collections: what is reachable,
// for tests and benchmarks that measure what a structure keeps.
func LiveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
