package imagebuild

import (
	"fmt"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// ManifestPath is the image's definition, relative to the repository root.
const ManifestPath = "deployments/container/image.yaml"

// Manifest is what goes into the image (deployments/container/image.yaml).
type Manifest struct {
	// Debian is the release the packages come from (bookworm).
	Debian string `json:"debian"`
	// Mirror is the Debian archive the packages' Filename is relative to,
	// used when apt on the build machine does not list a pinned version
	// (another release, Ubuntu).
	Mirror string `json:"mirror"`
	// Binaries go into BinDir.
	Binaries []Command `json:"binaries"`
	// Packages are unpacked whole into the image.
	Packages []Package `json:"packages"`
	// Users are written to /etc/passwd and /etc/group.
	Users []User `json:"users"`
	// Directories are created with their mode.
	Directories []Directory `json:"directories"`
}

// Command is one binary: Package (a Go package path, ./cmd/<name> for
// Tessera's own) built into BinDir/<Name>.
type Command struct {
	Name    string `json:"name"`
	Package string `json:"package"`
	// CGO: the command needs cgo (go-nvml's dlopen wrapper does).
	CGO bool `json:"cgo,omitempty"`
}

// Package is a pinned Debian package.
type Package struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	// SHA256 of the .deb by Debian architecture (amd64, arm64).
	SHA256 map[string]string `json:"sha256"`
	// Filename is the .deb's path in the archive for amd64 (apt-cache
	// show's Filename); the other architectures' replace _amd64.deb.
	Filename string `json:"filename"`
}

// User is an /etc/passwd entry; its group has the same name and id.
type User struct {
	Name string `json:"name"`
	UID  int    `json:"uid"`
	Home string `json:"home"`
}

// Directory is a directory with an octal mode such as "1777".
type Directory struct {
	Path string `json:"path"`
	Mode string `json:"mode"`
}

var (
	nameRE   = regexp.MustCompile(`^[a-z0-9][a-z0-9.+-]*$`)
	sha256RE = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// LoadManifest reads and checks ManifestPath under repoRoot.
func LoadManifest(repoRoot string) (*Manifest, error) {
	p := filepath.Join(repoRoot, ManifestPath)
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	m, err := ParseManifest(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	return m, nil
}

// ParseManifest parses and checks a manifest.
func ParseManifest(b []byte) (*Manifest, error) {
	var m Manifest
	if err := yaml.UnmarshalStrict(b, &m); err != nil {
		return nil, err
	}
	if err := m.validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

func (m *Manifest) validate() error {
	if !nameRE.MatchString(m.Debian) {
		return fmt.Errorf("debian: %q is not a Debian release name; set it to the release the packages come from, e.g. bookworm", m.Debian)
	}
	if len(m.Binaries) == 0 {
		return fmt.Errorf("binaries: empty; list at least one binary (name, package)")
	}
	if u, err := url.Parse(m.Mirror); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("mirror: %q is not an http(s) URL; set the Debian archive, e.g. http://deb.debian.org/debian", m.Mirror)
	}
	seen := map[string]bool{}
	for i, c := range m.Binaries {
		if !nameRE.MatchString(c.Name) || seen[c.Name] {
			return fmt.Errorf("binaries[%d].name: %q is empty, not a file name or listed twice", i, c.Name)
		}
		seen[c.Name] = true
		if c.Package == "" {
			return fmt.Errorf("binaries[%d].package: empty; set the Go package to build, e.g. ./cmd/%s", i, c.Name)
		}
	}
	for i, p := range m.Packages {
		if !nameRE.MatchString(p.Name) {
			return fmt.Errorf("packages[%d].name: %q is not a Debian package name", i, p.Name)
		}
		if p.Version == "" {
			return fmt.Errorf("packages[%d].version: empty; pin the version `apt-cache show --no-all-versions %s` lists", i, p.Name)
		}
		if !strings.HasPrefix(p.Filename, "pool/") || !strings.HasSuffix(p.Filename, "_amd64.deb") {
			return fmt.Errorf("packages[%d].filename: %q; set the Filename `apt-cache show %s:amd64=%s` lists (pool/..._amd64.deb)", i, p.Filename, p.Name, p.Version)
		}
		if len(p.SHA256) == 0 {
			return fmt.Errorf("packages[%d].sha256: empty; add <architecture>: <the SHA256 `apt-cache show %s=%s` lists>", i, p.Name, p.Version)
		}
		for arch, sum := range p.SHA256 {
			if !sha256RE.MatchString(sum) {
				return fmt.Errorf("packages[%d].sha256.%s: %q is not 64 lower-case hex digits", i, arch, sum)
			}
		}
	}
	for i, u := range m.Users {
		if !nameRE.MatchString(u.Name) || u.UID < 0 || !path.IsAbs(u.Home) {
			return fmt.Errorf("users[%d]: want a name, a uid >= 0 and an absolute home, got %+v", i, u)
		}
	}
	for i, d := range m.Directories {
		if !path.IsAbs(d.Path) || path.Clean(d.Path) != d.Path {
			return fmt.Errorf("directories[%d].path: %q is not a clean absolute path", i, d.Path)
		}
		if _, err := d.mode(); err != nil {
			return fmt.Errorf("directories[%d].mode: %q is not an octal mode such as \"1777\"", i, d.Mode)
		}
	}
	return nil
}

func (d Directory) mode() (int64, error) {
	v, err := strconv.ParseUint(d.Mode, 8, 12)
	return int64(v), err
}

// DebianArch is the Debian architecture of a GOARCH.
func DebianArch(goarch string) string {
	switch goarch {
	case "386":
		return "i386"
	case "arm":
		return "armhf"
	case "ppc64le":
		return "ppc64el"
	}
	return goarch
}
