package prepare

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/atomicfile"
	"github.com/tessera-dev/tessera/pkg/node/checkpoint"
)

// Shared state between two plugin processes (seamless upgrades).
//
// During a rolling update of the DaemonSet the old and the new plugin pod
// serve the kubelet side by side (kubeletplugin.RollingUpdate), and a claim
// prepared by one may be unprepared by the other. Both processes then
// share one lock file (the plugin library's serialize.lock, taken around
// every kubelet call) and the checkpoint directory. The in-memory view a
// Preparer keeps of the records is then only a cache of that directory:
//
//   - SyncShared, called at the start of every kubelet call (inside the
//     library's lock), reloads the records when the other process changed
//     them since this one last looked;
//   - PublishShared, called at the end, tells the other process that this
//     one changed them;
//   - Exclusive takes the same lock for work outside kubelet calls
//     (recovery at start, repairs), which the library does not serialize.
//
// The "changed" signal is a random token in <checkpoint dir>/.generation,
// rewritten atomically by whichever process changed records under the
// lock. Comparing tokens instead of directory timestamps is exact: file
// times have the kernel's coarse clock resolution.

// generationFile holds the token of the last change; the leading dot keeps
// checkpoint.Store.Load from reading it as a record.
const generationFile = ".generation"

// Exclusive takes the lock shared with the other plugin process, for work
// outside kubelet calls, waiting while another holder has it. It returns a
// no-op when no lock is configured. The lock is the kind the plugin library
// takes on serialize.lock around kubelet calls: a whole-file write lock on
// the open file description (fcntl F_OFD_SETLKW). A flock(2) lock would not
// exclude it: Linux keeps the two kinds apart. It must not be called while
// the calling process already holds the lock (inside a kubelet call): open
// file description locks do not nest.
func (p *Preparer) Exclusive() (release func(), err error) {
	if p.opts.SharedLock == "" {
		return func() {}, nil
	}
	f, err := lockFile(p.opts.SharedLock)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", p.opts.SharedLock, err)
	}
	return func() { _ = f.Close() }, nil
}

// lockFile opens path (creating it) and waits for a write lock on the whole
// file, held until the file is closed.
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	lock := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart}
	for {
		err = unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLKW, &lock)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

// SyncShared reloads the records from the checkpoint directory when the
// other process changed them. Call it holding the shared lock; without a
// shared lock it does nothing.
func (p *Preparer) SyncShared(ctx context.Context) error {
	if p.opts.SharedLock == "" {
		return nil
	}
	token, err := p.readGeneration()
	if err != nil {
		return err
	}
	p.mu.Lock()
	seen := p.generation
	p.mu.Unlock()
	if token == seen {
		return nil
	}
	loaded, err := p.opts.Checkpoints.Load()
	if err != nil {
		return err
	}
	claims := make(map[string]*checkpoint.Claim, len(loaded.Claims))
	for _, c := range loaded.Claims {
		claims[c.UID] = c
	}
	p.mu.Lock()
	p.claims = claims
	p.generation = token
	p.dirty = false
	p.mu.Unlock()
	// The time-slice holders are derived from the records.
	p.opts.TimeSlice.Reset()
	p.setNewer(ctx, loaded.Newer)
	p.mu.Lock()
	holders := p.holdersLocked()
	p.mu.Unlock()
	for _, c := range holders {
		p.restoreTimeSlices(c)
	}
	klog.FromContext(ctx).V(2).Info("Reloaded prepared claims changed by the other plugin process", "claims", len(claims))
	return nil
}

// PublishShared tells the other process that this one changed records
// since SyncShared. Call it holding the shared lock.
func (p *Preparer) PublishShared() error {
	if p.opts.SharedLock == "" {
		return nil
	}
	p.mu.Lock()
	dirty := p.dirty
	p.mu.Unlock()
	if !dirty {
		return nil
	}
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return err
	}
	token := hex.EncodeToString(b)
	if err := atomicfile.Write(p.generationPath(), []byte(token+"\n"), 0o600); err != nil {
		return fmt.Errorf("record checkpoint generation: %w", err)
	}
	p.mu.Lock()
	p.generation, p.dirty = token, false
	p.mu.Unlock()
	return nil
}

func (p *Preparer) generationPath() string {
	return filepath.Join(p.opts.Checkpoints.Dir(), generationFile)
}

func (p *Preparer) readGeneration() (string, error) {
	data, err := os.ReadFile(p.generationPath())
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read checkpoint generation: %w", err)
	}
	return strings.TrimSpace(string(data)), nil
}

// changed marks the records as changed by this process.
func (p *Preparer) changed() {
	p.mu.Lock()
	p.dirty = true
	p.mu.Unlock()
}
