package checkpoint

// The format-1 plugin's reading and writing code, kept verbatim (only
// renamed) from the last format-1 release as a fixture: what a plugin one
// format older does with the files this one writes.

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tessera-dev/tessera/pkg/atomicfile"
)

const v1Version = 1

type v1File struct {
	Version  int             `json:"version"`
	BootID   string          `json:"bootID"`
	Checksum string          `json:"checksum"`
	Claim    json.RawMessage `json:"claim"`
}

// v1Store is the format-1 plugin's store over a directory.
type v1Store struct{ dir, bootID string }

func (s *v1Store) path(uid string) string { return filepath.Join(s.dir, uid+".json") }

// Put as format 1 wrote it.
func (s *v1Store) Put(c *ClaimV1) error {
	raw, err := json.Marshal(c)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(raw)
	data, err := json.Marshal(v1File{Version: v1Version, BootID: s.bootID, Checksum: hex.EncodeToString(sum[:]), Claim: raw})
	if err != nil {
		return err
	}
	if err := atomicfile.Write(s.path(c.UID), data, 0o600); err != nil {
		return fmt.Errorf("write checkpoint of claim %s: %w", c.UID, err)
	}
	return nil
}

// read as format 1 read it.
func (s *v1Store) read(p string) (*ClaimV1, string, error) {
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, "", err
	}
	var f v1File
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, "", fmt.Errorf("parse: %w", err)
	}
	if f.Version != v1Version {
		return nil, "", fmt.Errorf("format version %d, want %d", f.Version, v1Version)
	}
	sum := sha256.Sum256(f.Claim)
	if hex.EncodeToString(sum[:]) != f.Checksum {
		return nil, "", errors.New("checksum mismatch")
	}
	c := &ClaimV1{}
	if err := json.Unmarshal(f.Claim, c); err != nil {
		return nil, "", fmt.Errorf("parse claim: %w", err)
	}
	if c.UID == "" || (c.State != PrepareStarted && c.State != PrepareCompleted) {
		return nil, "", fmt.Errorf("claim record without UID or with unknown state %q", c.State)
	}
	return c, f.BootID, nil
}

func (s *v1Store) Get(uid string) (*ClaimV1, error) {
	c, _, err := s.read(s.path(uid))
	return c, err
}
