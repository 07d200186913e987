// Package checkpoint keeps what the kubelet plugin prepared, durably: one
// file per claim under the plugin data directory, written atomically (temp
// file, fsync, rename, fsync of the directory) with a checksum and the
// node's boot ID. A claim's file records its state (PrepareStarted while
// prepare makes changes that cannot be found again by name, such as MIG
// instances or a GPU's time slice; PrepareCompleted once the kubelet may
// use the result) and everything needed to undo it.
//
// One file per claim keeps writes small and independent, so claims prepare
// in parallel, and confines damage: a corrupt file costs one claim's
// record, which the plugin rebuilds from the API server and the CDI spec on
// disk, instead of the whole node's.
//
// The format is versioned (see versions.go): every older format is read
// and converted, what this plugin writes stays readable by a plugin one
// format older, and a record in a newer format than this plugin reads is
// kept untouched, never taken for corrupt.
package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-dev/tessera/pkg/atomicfile"
	"github.com/tessera-dev/tessera/pkg/node/mig"
)

// Format versions (see versions.go).
const (
	// Version is the format this plugin writes (formatVersion in the
	// file) and the newest it reads.
	Version = 2
	// ReadableBy is the oldest format whose readers read what this plugin
	// writes without losing anything they need: the file's "version",
	// which a reader of an older format refuses. Format 2 only adds
	// optional fields to format 1, so a format-1 plugin (which requires
	// version 1 and ignores fields it does not know) reads it.
	ReadableBy = 1
)

// State of a claim.
type State string

// States.
const (
	// PrepareStarted: prepare is changing the node; on restart the claim
	// is rolled back, since the kubelet never saw a result.
	PrepareStarted State = "PrepareStarted"
	// PrepareCompleted: the result was (or may have been) returned to the
	// kubelet; it stays until unprepare.
	PrepareCompleted State = "PrepareCompleted"
)

// Claim is what is recorded per claim: the current format (2). Format 1
// is ClaimV1; ConvertV1 and (*Claim).V1 convert between them.
type Claim struct {
	UID       string `json:"uid"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	State     State  `json:"state"`
	// Fingerprint identifies the allocation and configuration that were
	// prepared; a different one means the claim was reallocated.
	Fingerprint string `json:"fingerprint"`
	// SpecName is the CDI spec file in the CDI directory.
	SpecName string `json:"specName"`
	// AccountingDir is the host directory for the interposer's shared
	// cache; empty when none was made.
	AccountingDir string `json:"accountingDir,omitempty"`
	// MPS is the claim's own MPS control daemon, when one was started:
	// its pipe directory and the daemon-side limits, to start it again if
	// it is gone after a plugin restart.
	MPS     *MPS     `json:"mps,omitempty"`
	Devices []Device `json:"devices"`
	// Pods are the claim's consumers when it was prepared (and those the
	// kubelet prepared it for since): usage is attributed to the claim
	// through them.
	Pods []Pod `json:"pods,omitempty"`
	// Spec is the CDI spec that was written, to rewrite it if it goes
	// missing.
	Spec *cdispec.Spec `json:"spec,omitempty"`

	// Added in format 2; a format-1 plugin ignores them, and one that
	// rewrites the record drops them, so nothing may depend on them being
	// present (a record converted from format 1 has them empty).

	// PreparedBy is the build of the plugin that prepared the claim
	// (Build): which code made what the record describes, during a
	// seamless upgrade when two builds share the directory, and for a
	// later format's conversion.
	PreparedBy string `json:"preparedBy,omitempty"`
	// PreloadFile is the host path of the claim's ld.so.preload file,
	// mounted at /etc/ld.so.preload in interposer mode; empty when none
	// was written. Undo removes the claim's file directory by UID even
	// when it is empty.
	PreloadFile string `json:"preloadFile,omitempty"`
}

// Pod is a consumer of a claim.
type Pod struct {
	UID  string `json:"uid"`
	Name string `json:"name"`
}

// MPS records a claim's MPS control daemon.
type MPS struct {
	PipeDir string `json:"pipeDir"`
	// Devices and ThreadPercent are its daemon-side limits.
	Devices       []MPSDevice `json:"devices"`
	ThreadPercent int         `json:"threadPercent,omitempty"`
	// Pod is the daemon's Pod (namespace/name) when the daemon runs in a
	// Pod of its own; empty when it runs in the plugin's process.
	Pod string `json:"pod,omitempty"`
}

// MPSDevice is a GPU an MPS daemon serves with its memory limit.
type MPSDevice struct {
	UUID   string `json:"uuid"`
	MemMiB uint64 `json:"memMiB"`
}

// Device is one prepared device (allocation result).
type Device struct {
	Request     string `json:"request"`
	Pool        string `json:"pool"`
	Device      string `json:"device"`
	ShareID     string `json:"shareID,omitempty"`
	CDIDeviceID string `json:"cdiDeviceID"`
	Type        string `json:"type"`
	GPUUUID     string `json:"gpuUUID"`
	// UUID is what the container addresses (GPU or MIG UUID).
	UUID     string `json:"uuid"`
	Memory   uint64 `json:"memory"`
	Cores    int    `json:"cores,omitempty"`
	Mode     string `json:"mode"`
	Enforced string `json:"enforced"`
	// TimeSliceInterval is the interval this claim requires of the GPU.
	TimeSliceInterval string `json:"timeSliceInterval,omitempty"`
	// MIG is the MIG device; Created says this plugin created it for the
	// claim and destroys it at unprepare.
	MIG *mig.Instance `json:"mig,omitempty"`
}

// file is the envelope of every format.
type file struct {
	// Version is the oldest format whose readers may read the record
	// (ReadableBy of its writer); a format-1 reader requires exactly 1.
	Version int `json:"version"`
	// FormatVersion is the format the writer used; absent (0) in files
	// written by format-1 plugins, whose format is Version.
	FormatVersion int             `json:"formatVersion,omitempty"`
	BootID        string          `json:"bootID"`
	Checksum      string          `json:"checksum"`
	Claim         json.RawMessage `json:"claim"`
}

// Store is the checkpoint directory.
type Store struct {
	dir    string
	bootID string
}

// Open opens (creating) the checkpoint directory. bootID identifies the
// current boot of the node.
func Open(dir, bootID string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("checkpoint directory: %w", err)
	}
	return &Store{dir: dir, bootID: bootID}, nil
}

// ReadBootID reads the kernel's boot ID (/proc/sys/kernel/random/boot_id).
// An unreadable one yields "unknown" rather than an error: without it the
// plugin still works, it only cannot detect reboots.
func ReadBootID(path string) string {
	data, err := os.ReadFile(path)
	if err != nil || len(strings.TrimSpace(string(data))) == 0 {
		return "unknown"
	}
	return strings.TrimSpace(string(data))
}

// BootID is the boot the store writes.
func (s *Store) BootID() string { return s.bootID }

// Dir is the checkpoint directory.
func (s *Store) Dir() string { return s.dir }

func (s *Store) path(uid string) string { return filepath.Join(s.dir, uid+".json") }

// Put records a claim. It refuses to replace a record in a newer format
// than this plugin reads (a *NewerError): that record belongs to a newer
// plugin, and writing over it would drop what this one cannot see.
func (s *Store) Put(c *Claim) error {
	if err := s.checkNotNewer(c.UID); err != nil {
		return err
	}
	raw, err := json.Marshal(c)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(raw)
	data, err := json.Marshal(file{Version: ReadableBy, FormatVersion: Version, BootID: s.bootID, Checksum: hex.EncodeToString(sum[:]), Claim: raw})
	if err != nil {
		return err
	}
	if err := atomicfile.Write(s.path(c.UID), data, 0o600); err != nil {
		return fmt.Errorf("write checkpoint of claim %s: %w", c.UID, err)
	}
	return nil
}

// Delete forgets a claim; a missing record is not an error.
//
// The directory is not fsynced: a deletion only has to outlive a crash of
// the plugin, and a record that reappears after a crash of the node
// carries the old boot ID and is dropped as stale. Like Put, it refuses to
// remove a record in a newer format (a *NewerError).
func (s *Store) Delete(uid string) error {
	if err := s.checkNotNewer(uid); err != nil {
		return err
	}
	err := os.Remove(s.path(uid))
	if err == nil || errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return fmt.Errorf("delete checkpoint of claim %s: %w", uid, err)
}

// DeleteStale removes a record of an earlier boot whatever its format (the
// envelope's bootID is kept by every format): MIG instances and time
// slices do not survive a reboot, so there is nothing left that only a
// newer plugin could undo. A record of this boot is refused like Delete.
func (s *Store) DeleteStale(uid string) error {
	data, err := os.ReadFile(s.path(uid))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var f file
	if err := json.Unmarshal(data, &f); err != nil || f.BootID == s.bootID {
		return fmt.Errorf("checkpoint of claim %s is not from an earlier boot", uid)
	}
	if err := os.Remove(s.path(uid)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete checkpoint of claim %s: %w", uid, err)
	}
	return nil
}

// Corrupt is a record that could not be used.
type Corrupt struct {
	UID  string
	Path string
	Err  error
}

// Loaded is what Load found.
type Loaded struct {
	// Claims were recorded in this boot.
	Claims []*Claim
	// Stale were recorded before the node rebooted.
	Stale []*Claim
	// Corrupt could not be read, parsed or verified.
	Corrupt []Corrupt
	// Newer are records in a format newer than this plugin reads, written
	// by a newer plugin (a seamless upgrade, or a downgrade): kept as they
	// are, neither read nor moved aside.
	Newer []Newer
}

// Newer is a record this plugin cannot read because a newer plugin wrote
// it in a newer format.
type Newer struct {
	UID  string
	Path string
	Err  *NewerError
	// Stale: it was written before the node rebooted (the envelope's
	// bootID, which every format keeps, differs): nothing it describes
	// survived, and DeleteStale may remove it.
	Stale bool
}

// Load reads every record. Only an unusable directory is an error;
// individual bad files are reported in Corrupt. Leftover temporary files
// of interrupted writes are removed.
func (s *Store) Load() (*Loaded, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("read checkpoint directory: %w", err)
	}
	out := &Loaded{}
	for _, e := range entries {
		name := e.Name()
		p := filepath.Join(s.dir, name)
		if strings.HasPrefix(name, ".") && strings.Contains(name, ".tmp-") {
			_ = os.Remove(p)
			continue
		}
		uid, ok := strings.CutSuffix(name, ".json")
		if !ok || uid == "" {
			continue
		}
		c, boot, err := s.read(p)
		if err == nil && c.UID != uid {
			err = fmt.Errorf("records claim %s, not %s", c.UID, uid)
		}
		var newer *NewerError
		switch {
		case errors.As(err, &newer):
			out.Newer = append(out.Newer, Newer{UID: uid, Path: p, Err: newer, Stale: newer.BootID != s.bootID})
		case err != nil:
			out.Corrupt = append(out.Corrupt, Corrupt{UID: uid, Path: p, Err: err})
		case boot != s.bootID:
			out.Stale = append(out.Stale, c)
		default:
			out.Claims = append(out.Claims, c)
		}
	}
	return out, nil
}

// Get reads one record; (nil, nil) when there is none, a *NewerError when
// it is in a newer format.
func (s *Store) Get(uid string) (*Claim, error) {
	c, boot, err := s.read(s.path(uid))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	var newer *NewerError
	if errors.As(err, &newer) {
		newer.UID = uid
	}
	if err != nil {
		return nil, err
	}
	if boot != s.bootID {
		return nil, fmt.Errorf("checkpoint of claim %s is from boot %s, not this one", uid, boot)
	}
	return c, nil
}

func (s *Store) read(p string) (*Claim, string, error) {
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, "", err
	}
	f, err := parseFile(data)
	if err != nil {
		return nil, "", err
	}
	sum := sha256.Sum256(f.Claim)
	if hex.EncodeToString(sum[:]) != f.Checksum {
		return nil, "", errors.New("checksum mismatch")
	}
	c, err := decodeClaim(f.FormatVersion, f.Claim)
	if err != nil {
		return nil, "", fmt.Errorf("parse claim (format %d): %w", f.FormatVersion, err)
	}
	if c.UID == "" || (c.State != PrepareStarted && c.State != PrepareCompleted) {
		return nil, "", fmt.Errorf("claim record without UID or with unknown state %q", c.State)
	}
	return c, f.BootID, nil
}

// parseFile parses the envelope and checks its versions: a *NewerError
// when a reader of a newer format is needed, any other error when the
// file is corrupt. FormatVersion is filled in for format-1 files.
func parseFile(data []byte) (*file, error) {
	var f file
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	if f.FormatVersion == 0 {
		f.FormatVersion = f.Version
	}
	switch {
	case f.Version < 1 || f.FormatVersion < f.Version:
		return nil, fmt.Errorf("invalid format versions: version %d, formatVersion %d", f.Version, f.FormatVersion)
	case f.Version > Version:
		return nil, &NewerError{Version: f.Version, FormatVersion: f.FormatVersion, BootID: f.BootID}
	}
	return &f, nil
}

// checkNotNewer returns a *NewerError when the record of uid on disk is in
// a format this plugin does not read. A missing, unreadable or corrupt
// file is not its concern. During a seamless upgrade it runs under the
// lock both plugin processes share, so the file cannot change between the
// check and the write.
func (s *Store) checkNotNewer(uid string) error {
	data, err := os.ReadFile(s.path(uid))
	if err != nil {
		return nil
	}
	var newer *NewerError
	if _, err := parseFile(data); errors.As(err, &newer) {
		newer.UID = uid
		return newer
	}
	return nil
}

// Quarantine moves a corrupt record aside (kept for inspection, never read
// again) so that the claim can be recorded anew.
func (s *Store) Quarantine(uid string) (string, error) {
	aside := fmt.Sprintf("%s.corrupt-%d", s.path(uid), time.Now().UnixNano())
	if err := os.Rename(s.path(uid), aside); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	return aside, atomicfile.SyncDir(s.dir)
}
