package plugin

import (
	"context"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
)

func devStatus(driver, device string) resourceapi.AllocatedDeviceStatus {
	return resourceapi.AllocatedDeviceStatus{Driver: driver, Pool: "node", Device: device,
		Data: &runtime.RawExtension{Raw: []byte(`{"uuid":"` + device + `"}`)}}
}

func TestMergeDeviceStatus(t *testing.T) {
	const us, other = "gpu.tessera.dev", "net.example.com"
	for _, tc := range []struct {
		name          string
		current, ours []resourceapi.AllocatedDeviceStatus
		want          []string
	}{
		{name: "first write", ours: []resourceapi.AllocatedDeviceStatus{devStatus(us, "gpu-0")}, want: []string{us + "/gpu-0"}},
		{name: "other driver kept", current: []resourceapi.AllocatedDeviceStatus{devStatus(other, "eth0")},
			ours: []resourceapi.AllocatedDeviceStatus{devStatus(us, "gpu-0")}, want: []string{other + "/eth0", us + "/gpu-0"}},
		{name: "ours replaced", current: []resourceapi.AllocatedDeviceStatus{devStatus(us, "gpu-1"), devStatus(other, "eth0")},
			ours: []resourceapi.AllocatedDeviceStatus{devStatus(us, "gpu-0")}, want: []string{other + "/eth0", us + "/gpu-0"}},
		{name: "clear keeps others", current: []resourceapi.AllocatedDeviceStatus{devStatus(us, "gpu-1"), devStatus(other, "eth0")},
			want: []string{other + "/eth0"}},
		{name: "clear of nothing", want: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, d := range mergeDeviceStatus(tc.current, us, tc.ours) {
				got = append(got, d.Driver+"/"+d.Device)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("got %v, want %v", got, tc.want)
				}
			}
		})
	}
}

// The writer updates only this driver's entries, and never writes into a
// claim that replaced the one it prepared (same name, other UID).
func TestStatusWriterWrite(t *testing.T) {
	ctx := context.Background()
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c", UID: "uid-1"},
		Status: resourceapi.ResourceClaimStatus{
			Allocation: &resourceapi.AllocationResult{},
			Devices:    []resourceapi.AllocatedDeviceStatus{devStatus("net.example.com", "eth0")},
		},
	}
	client := fake.NewSimpleClientset(claim) // no field management needed
	w := newStatusWriter(client, "gpu.tessera.dev")
	name := types.NamespacedName{Namespace: "ns", Name: "c"}

	if err := w.write(ctx, "uid-1", statusEntry{claim: name, devices: []resourceapi.AllocatedDeviceStatus{devStatus("gpu.tessera.dev", "gpu-0")}}); err != nil {
		t.Fatal(err)
	}
	got, _ := client.ResourceV1().ResourceClaims("ns").Get(ctx, "c", metav1.GetOptions{})
	if len(got.Status.Devices) != 2 || got.Status.Devices[0].Device != "eth0" || got.Status.Devices[1].Device != "gpu-0" {
		t.Fatalf("status.devices = %+v, want eth0 kept and gpu-0 added", got.Status.Devices)
	}

	if err := w.write(ctx, "uid-1", statusEntry{claim: name}); err != nil {
		t.Fatal(err)
	}
	got, _ = client.ResourceV1().ResourceClaims("ns").Get(ctx, "c", metav1.GetOptions{})
	if len(got.Status.Devices) != 1 || got.Status.Devices[0].Device != "eth0" {
		t.Fatalf("after clear status.devices = %+v, want only eth0", got.Status.Devices)
	}

	err := w.write(ctx, "uid-other", statusEntry{claim: name, devices: []resourceapi.AllocatedDeviceStatus{devStatus("gpu.tessera.dev", "gpu-0")}})
	if !apierrors.IsNotFound(err) {
		t.Fatalf("write for another UID: err = %v, want NotFound", err)
	}
	got, _ = client.ResourceV1().ResourceClaims("ns").Get(ctx, "c", metav1.GetOptions{})
	if len(got.Status.Devices) != 1 {
		t.Fatalf("a claim of another UID was written: %+v", got.Status.Devices)
	}
}
