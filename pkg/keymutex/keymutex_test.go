package keymutex

import (
	"sync"
	"testing"
	"time"
)

func TestMutex(t *testing.T) {
	var k Mutex
	a := k.Lock("a")
	// Another key does not wait; several keys may be held at once.
	done := make(chan struct{})
	go func() {
		b := k.Lock("b")
		c := k.Lock("c")
		c()
		b()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("key b waited for key a")
	}
	// The same key waits for its holder.
	got := make(chan struct{})
	go func() {
		k.Lock("a")()
		close(got)
	}()
	select {
	case <-got:
		t.Fatal("key a taken twice")
	case <-time.After(50 * time.Millisecond):
	}
	a()
	<-got
	if n := k.held(); n != 0 {
		t.Errorf("%d entries left after every holder left", n)
	}
}

func TestMutexSerializes(t *testing.T) {
	var (
		k       Mutex
		wg      sync.WaitGroup
		in, max int
		mu      sync.Mutex
	)
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer k.Lock("gpu-0")()
			mu.Lock()
			in++
			max = maxInt(max, in)
			mu.Unlock()
			time.Sleep(time.Millisecond)
			mu.Lock()
			in--
			mu.Unlock()
		}()
	}
	wg.Wait()
	if max != 1 {
		t.Errorf("%d holders of one key at once", max)
	}
}

func maxInt(a, b int) int {
	if a > b {
		return a
	}
	return b
}
