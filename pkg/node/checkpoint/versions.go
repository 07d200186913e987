package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"

	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// Format versions of a claim's record.
//
// A file is an envelope ({version, formatVersion, bootID, checksum,
// claim}) around the claim's record in the writer's format:
//
//   - formatVersion is the format the writer used (absent in files of
//     format-1 plugins, which wrote only "version");
//   - version is the oldest format whose readers may read the file: a
//     reader refuses a file whose version is newer than its own format. A
//     format that only adds optional fields keeps version at the format it
//     extends (format 2 writes version 1, so a format-1 plugin, which
//     requires version 1 and ignores unknown fields, reads it); a format
//     that changes or removes fields, or adds one an older plugin must not
//     drop, raises it.
//
// The envelope's version, formatVersion and bootID fields keep their
// meaning in every format, so that any reader can tell a record it cannot
// read from a corrupt one, and a stale one (an earlier boot) from a live
// one.
//
// A reader accepts every format from 1 to its own, converting older ones
// (ConvertV1), and files of a newer format whose version it satisfies
// (reading the fields it knows). A file whose version is newer than the
// reader's format is a *NewerError: kept untouched, never moved aside as
// corrupt, never overwritten or removed (Store.Put and Store.Delete refuse).
//
// Format history:
//
//	1  the record as ClaimV1 describes it.
//	2  adds preparedBy (the plugin build that prepared the claim) and
//	   preloadFile (the claim's ld.so.preload on the host); written with
//	   version 1.
//
// One envelope with one record, not one record per format side by side
// (NVIDIA's driver writes a V1 and a V2 copy into one file): while formats
// only add fields a single copy serves both readers, and records carry the
// whole CDI spec, which two copies would double. When a format has to
// raise version, it writes the previous format's record beside its own.

// NewerError says a record is in a format newer than this plugin reads.
type NewerError struct {
	UID string
	// Version is the oldest format that may read the record;
	// FormatVersion is the format it was written in.
	Version, FormatVersion int
	// BootID is the boot it was written in: the envelope's version,
	// formatVersion and bootID are kept by every format.
	BootID string
}

func (e *NewerError) Error() string {
	who := "record"
	if e.UID != "" {
		who = "record of claim " + e.UID
	}
	return fmt.Sprintf("checkpoint %s is in format %d and needs a reader of format %d or later; this plugin reads formats 1 to %d: it was written by a newer plugin, which must prepare or unprepare the claim; the record is left untouched",
		who, e.FormatVersion, e.Version, Version)
}

// IsNewer says whether err is (or wraps) a *NewerError.
func IsNewer(err error) bool {
	var n *NewerError
	return errors.As(err, &n)
}

// ClaimV1 is the record of format 1, frozen: never change it. The nested
// types are shared with the current format while they are unchanged; a
// format that changes one copies the old one here first.
type ClaimV1 struct {
	UID           string        `json:"uid"`
	Namespace     string        `json:"namespace"`
	Name          string        `json:"name"`
	State         State         `json:"state"`
	Fingerprint   string        `json:"fingerprint"`
	SpecName      string        `json:"specName"`
	AccountingDir string        `json:"accountingDir,omitempty"`
	MPS           *MPS          `json:"mps,omitempty"`
	Devices       []Device      `json:"devices"`
	Pods          []Pod         `json:"pods,omitempty"`
	Spec          *cdispec.Spec `json:"spec,omitempty"`
}

// ClaimV2 is the record of format 2, the current one.
type ClaimV2 = Claim

// ConvertV1 converts a format-1 record to the current format. What format
// 2 added is unknown for it and stays empty: PreparedBy (prepared by a
// format-1 plugin) and PreloadFile (format-1 plugins wrote none).
func ConvertV1(in *ClaimV1) *Claim {
	return &Claim{
		UID: in.UID, Namespace: in.Namespace, Name: in.Name, State: in.State,
		Fingerprint: in.Fingerprint, SpecName: in.SpecName, AccountingDir: in.AccountingDir,
		MPS: in.MPS, Devices: in.Devices, Pods: in.Pods, Spec: in.Spec,
	}
}

// V1 is the record as a format-1 plugin reads it: everything but the
// fields format 2 added.
func (c *Claim) V1() *ClaimV1 {
	return &ClaimV1{
		UID: c.UID, Namespace: c.Namespace, Name: c.Name, State: c.State,
		Fingerprint: c.Fingerprint, SpecName: c.SpecName, AccountingDir: c.AccountingDir,
		MPS: c.MPS, Devices: c.Devices, Pods: c.Pods, Spec: c.Spec,
	}
}

// decodeClaim decodes a record written in format formatVersion into the
// current format. Formats newer than Version reach it only when their
// file's version allows this reader: it reads the fields it knows.
func decodeClaim(formatVersion int, raw []byte) (*Claim, error) {
	switch formatVersion {
	case 1:
		var v1 ClaimV1
		if err := json.Unmarshal(raw, &v1); err != nil {
			return nil, err
		}
		return ConvertV1(&v1), nil
	default:
		c := &Claim{}
		if err := json.Unmarshal(raw, c); err != nil {
			return nil, err
		}
		return c, nil
	}
}

// Build names this plugin's build for Claim.PreparedBy: the main module's
// path and version, and the VCS revision it was built from when known.
var Build = build()

func build() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	out := info.Main.Path + "@" + info.Main.Version
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			out += "+" + s.Value[:12]
		}
		if s.Key == "vcs.modified" && s.Value == "true" {
			out += "-dirty"
		}
	}
	return out
}
