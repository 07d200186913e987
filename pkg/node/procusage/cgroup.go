package procusage

import (
	"regexp"
	"strings"
)

var (
	// podRE finds the pod UID in a kubelet cgroup path: cgroupfs
	// (/kubepods/burstable/pod<uid>/...) or systemd
	// (kubepods-burstable-pod<uid with _>.slice).
	podRE = regexp.MustCompile(`pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?(?:/|$)`)
	// containerRE finds the container ID at the end of the path:
	// cri-containerd-<id>.scope (systemd), <id> (cgroupfs), and the
	// docker-/crio- variants.
	containerRE = regexp.MustCompile(`(?:^|/|-)([0-9a-f]{64})(?:\.scope)?$`)
)

// Owner is the pod and container a process runs in.
type Owner struct {
	PodUID      string
	ContainerID string
}

// OwnerFromCgroup reads the pod UID and container ID from the content of
// /proc/<pid>/cgroup: cgroup v2 ("0::/path") or v1 (one line per
// hierarchy; the first that names a pod wins), with the kubelet's cgroupfs
// or systemd driver and containerd's, CRI-O's or Docker's container
// scopes. A process outside any pod (a host process, the kubelet) has no
// owner.
func OwnerFromCgroup(content string) (Owner, bool) {
	for _, line := range strings.Split(strings.TrimSpace(content), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		path := strings.TrimSuffix(parts[2], "/")
		m := podRE.FindStringSubmatch(path)
		if m == nil {
			continue
		}
		o := Owner{PodUID: strings.ReplaceAll(m[1], "_", "-")}
		if c := containerRE.FindStringSubmatch(path); c != nil {
			o.ContainerID = c[1]
		}
		return o, true
	}
	return Owner{}, false
}
