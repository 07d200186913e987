// Package keymutex serializes work per key (a claim, a GPU): callers with
// different keys never wait for each other, and a key's entry is freed
// when its last holder or waiter leaves.
//
// k8s.io/utils/keymutex hashes keys onto a fixed set of mutexes, so two
// keys may share one; a caller that holds several keys at once (prepare
// holds the MIG lock of every GPU a claim's instances are on) could then
// wait for itself.
package keymutex

import "sync"

// Mutex is a mutex per key; the zero value is ready to use.
type Mutex struct {
	mu sync.Mutex
	m  map[string]*entry
}

type entry struct {
	mu   sync.Mutex
	refs int
}

// Lock takes key's lock and returns its release.
func (k *Mutex) Lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*entry{}
	}
	e, ok := k.m[key]
	if !ok {
		e = &entry{}
		k.m[key] = e
	}
	e.refs++
	k.mu.Unlock()
	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		k.mu.Lock()
		e.refs--
		if e.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
}

// held counts the keys held or waited for (tests).
func (k *Mutex) held() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.m)
}
