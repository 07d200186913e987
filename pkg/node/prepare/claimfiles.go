package prepare

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/pkg/atomicfile"
	"github.com/tessera-dev/tessera/pkg/node/checkpoint"
	"github.com/tessera-dev/tessera/pkg/node/enforce"
)

// preloadFileName is the claim's preload list in its files directory.
const preloadFileName = "ld.so.preload"

// claimFilesRoot holds a directory per claim for the files its containers
// mount read-only.
func (p *Preparer) claimFilesRoot() string {
	if p.opts.ClaimFilesDir != "" {
		return p.opts.ClaimFilesDir
	}
	return filepath.Join(filepath.Dir(p.opts.Checkpoints.Dir()), "claims")
}

func (p *Preparer) claimFilesDir(uid string) string {
	return filepath.Join(p.claimFilesRoot(), uid)
}

// preloadFile is where a claim's ld.so.preload is written on the host.
func (p *Preparer) preloadFile(uid string) string {
	return filepath.Join(p.claimFilesDir(uid), preloadFileName)
}

// ensurePreloadFile writes a prepared claim's preload file again when it
// went missing, from the LD_PRELOAD of the spec it was prepared with: the
// spec mounts it, and a runtime fails a container whose mount source is
// gone.
func (p *Preparer) ensurePreloadFile(ctx context.Context, rec *checkpoint.Claim) error {
	if rec.PreloadFile == "" {
		return nil
	}
	if _, err := os.Stat(rec.PreloadFile); err == nil || !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	content, ok := enforce.PreloadListFromSpec(rec.Spec)
	if !ok {
		return fmt.Errorf("claim %s/%s: its ld.so.preload %s is missing and its spec names no library to rebuild it from", rec.Namespace, rec.Name, rec.PreloadFile)
	}
	if err := atomicfile.Write(rec.PreloadFile, content, 0o644); err != nil {
		return fmt.Errorf("rewrite the claim's ld.so.preload: %w", err)
	}
	klog.FromContext(ctx).Info("Rewrote missing ld.so.preload of prepared claim", "claim", klog.KRef(rec.Namespace, rec.Name), "path", rec.PreloadFile)
	return nil
}

// removeClaimFiles removes a claim's files directory and, when a record
// names a preload file elsewhere (another layout), that file.
func (p *Preparer) removeClaimFiles(uid, preloadFile string) error {
	if err := os.RemoveAll(p.claimFilesDir(uid)); err != nil {
		return fmt.Errorf("remove the claim's files: %w", err)
	}
	if preloadFile != "" && filepath.Dir(preloadFile) != p.claimFilesDir(uid) {
		if err := os.Remove(preloadFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove the claim's ld.so.preload: %w", err)
		}
	}
	return nil
}

// refuseNewer fails the kubelet's call for a claim whose record is in a
// newer checkpoint format: this plugin cannot tell what was done for it,
// so neither prepares it again nor undoes it; the kubelet retries, and
// the newer plugin (the other process of a seamless upgrade) serves it.
func (p *Preparer) refuseNewer(uid string) error {
	p.mu.Lock()
	newer := p.newerErr[uid]
	p.mu.Unlock()
	if newer == nil {
		return nil
	}
	e := *newer
	e.UID = uid
	return &e
}

// setNewer records the claims whose records are in a newer format, holding
// what their CDI specs say they hold. Newly seen ones are logged.
func (p *Preparer) setNewer(ctx context.Context, found []checkpoint.Newer) {
	logger := klog.FromContext(ctx)
	out := make(map[string]*checkpoint.Claim, len(found))
	versions := make(map[string]*checkpoint.NewerError, len(found))
	for _, n := range found {
		p.mu.Lock()
		known := p.newer[n.UID]
		p.mu.Unlock()
		c := p.reservationFromSpec(ctx, n.UID)
		if c == nil {
			c = &checkpoint.Claim{UID: n.UID}
		}
		out[n.UID] = c
		versions[n.UID] = n.Err
		if known == nil {
			logger.Info("Warning: checkpoint of claim was written by a newer plugin in a format this plugin does not read; keeping it untouched, holding the devices its CDI spec names, and refusing to prepare or unprepare the claim (the newer plugin must)",
				"uid", n.UID, "claim", klog.KRef(c.Namespace, c.Name), "path", n.Path, "formatVersion", n.Err.FormatVersion, "needsReader", n.Err.Version, "reads", checkpoint.Version, "devices", len(c.Devices))
		}
	}
	p.mu.Lock()
	p.newer = out
	p.newerErr = versions
	p.mu.Unlock()
	for _, c := range out {
		p.restoreTimeSlices(c)
	}
}
