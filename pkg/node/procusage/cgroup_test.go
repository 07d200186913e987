package procusage

import "testing"

func TestOwnerFromCgroup(t *testing.T) {
	const (
		uid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
		cid = "3b2f1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b"
	)
	us := "0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0"
	for _, tc := range []struct {
		name    string
		content string
		want    Owner
		ok      bool
	}{
		{"v2 systemd containerd", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + us + ".slice/cri-containerd-" + cid + ".scope\n", Owner{uid, cid}, true},
		{"v2 systemd guaranteed", "0::/kubepods.slice/kubepods-pod" + us + ".slice/cri-containerd-" + cid + ".scope", Owner{uid, cid}, true},
		{"v2 cgroupfs", "0::/kubepods/besteffort/pod" + uid + "/" + cid, Owner{uid, cid}, true},
		{"v2 crio", "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + us + ".slice/crio-" + cid + ".scope", Owner{uid, cid}, true},
		{"v1 several hierarchies", "12:pids:/kubepods/burstable/pod" + uid + "/" + cid + "\n11:cpu,cpuacct:/kubepods/burstable/pod" + uid + "/" + cid + "\n1:name=systemd:/kubepods/burstable/pod" + uid + "/" + cid, Owner{uid, cid}, true},
		{"v1 first line not a pod", "13:misc:/\n12:memory:/kubepods/pod" + uid + "/" + cid, Owner{uid, cid}, true},
		{"pod sandbox level", "0::/kubepods/burstable/pod" + uid, Owner{PodUID: uid}, true},
		{"host process", "0::/system.slice/containerd.service", Owner{}, false},
		{"user session", "0::/user.slice/user-0.slice/session-1.scope", Owner{}, false},
		{"empty (process gone)", "", Owner{}, false},
		{"not a UUID", "0::/kubepods/burstable/podnotauid/" + cid, Owner{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := OwnerFromCgroup(tc.content)
			if ok != tc.ok || got != tc.want {
				t.Errorf("OwnerFromCgroup = %+v, %v; want %+v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}
