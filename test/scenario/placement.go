package scenario

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Device is one allocated device of a claim, with what the ResourceSlice
// says of it.
type Device struct {
	Request string
	Pool    string
	Name    string
	ShareID string
	// Memory is what the claim got of the device's memory: its
	// consumedCapacity for a share, else the device's whole memory.
	Memory *resource.Quantity
	// Cores is the consumed compute percent of a share (nil if none).
	Cores *resource.Quantity
	// Capacity is the device's published memory.
	Capacity *resource.Quantity
	// Attributes of the device (uuid, type, index, productName,
	// migProfile, parentUUID, ...), as strings.
	Attributes map[string]string
	// Data is the driver's status.devices[].data for this device.
	Data map[string]any
}

// Type is the device's type attribute (gpu, timeslice, mig).
func (d Device) Type() string { return d.Attributes["type"] }

// GPU is the UUID of the physical GPU the device is part of.
func (d Device) GPU() string {
	if p := d.Attributes["parentUUID"]; p != "" {
		return p
	}
	return d.Attributes["uuid"]
}

// Claim is one ResourceClaim of a pod.
type Claim struct {
	PodClaim string // the pod's name for it
	Name     string
	UID      types.UID
	Devices  []Device
}

// Placement is where a pod landed and what its container sees.
type Placement struct {
	Pod    *corev1.Pod
	Claims []Claim
	// Log is the container's log; Env the variables it printed
	// (NAME=value lines).
	Log string
	Env map[string]string
}

// Placements reports every pod of the namespace, sorted by name. For
// running or finished pods it waits (briefly) for the container's log.
func (r *Run) Placements(ctx context.Context) ([]Placement, error) {
	pods, err := r.Client.CoreV1().Pods(r.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	slicesList, err := r.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	devs := indexDevices(slicesList.Items)
	sort.Slice(pods.Items, func(i, j int) bool { return pods.Items[i].Name < pods.Items[j].Name })
	var out []Placement
	for i := range pods.Items {
		p := &pods.Items[i]
		pl := Placement{Pod: p}
		for _, st := range p.Status.ResourceClaimStatuses {
			if st.ResourceClaimName == nil {
				continue
			}
			c, err := r.Client.ResourceV1().ResourceClaims(r.Namespace).Get(ctx, *st.ResourceClaimName, metav1.GetOptions{})
			if apierrors.IsNotFound(err) && (p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed) {
				continue // the pod ended or is leaving: the claim made for it is gone
			}
			if err != nil {
				return nil, err
			}
			r.ClaimUIDs[c.Name] = c.UID
			pl.Claims = append(pl.Claims, Claim{PodClaim: st.Name, Name: c.Name, UID: c.UID, Devices: claimDevices(c, devs)})
		}
		if p.Status.Phase == corev1.PodRunning || p.Status.Phase == corev1.PodSucceeded {
			pl.Log = r.waitLog(ctx, p.Name)
			pl.Env = ParseEnv(pl.Log)
		}
		out = append(out, pl)
	}
	return out, nil
}

// waitLog returns the pod's log once it has a line that looks like a
// variable (or after 15 s).
func (r *Run) waitLog(ctx context.Context, pod string) string {
	deadline := time.Now().Add(15 * time.Second)
	var log string
	for {
		b, err := r.Client.CoreV1().Pods(r.Namespace).GetLogs(pod, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err == nil {
			log = string(b)
			if strings.Contains(log, "=") {
				return log
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return log
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// ParseEnv reads NAME=value lines.
func ParseEnv(log string) map[string]string {
	env := map[string]string{}
	for _, l := range strings.Split(log, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(l), "=")
		if ok && k != "" && !strings.ContainsAny(k, " \t") {
			env[k] = v
		}
	}
	return env
}

type sliceDevice struct {
	dev resourceapi.Device
}

func indexDevices(slices []resourceapi.ResourceSlice) map[string]sliceDevice {
	// Only the newest generation of each pool counts.
	newest := map[string]int64{}
	for _, s := range slices {
		if s.Spec.Driver == Driver && s.Spec.Pool.Generation > newest[s.Spec.Pool.Name] {
			newest[s.Spec.Pool.Name] = s.Spec.Pool.Generation
		}
	}
	out := map[string]sliceDevice{}
	for _, s := range slices {
		if s.Spec.Driver != Driver || s.Spec.Pool.Generation != newest[s.Spec.Pool.Name] {
			continue
		}
		for _, d := range s.Spec.Devices {
			out[s.Spec.Pool.Name+"/"+d.Name] = sliceDevice{dev: d}
		}
	}
	return out
}

func attributeString(a resourceapi.DeviceAttribute) string {
	switch {
	case a.StringValue != nil:
		return *a.StringValue
	case a.IntValue != nil:
		return fmt.Sprint(*a.IntValue)
	case a.BoolValue != nil:
		return fmt.Sprint(*a.BoolValue)
	case a.VersionValue != nil:
		return *a.VersionValue
	}
	return ""
}

func claimDevices(c *resourceapi.ResourceClaim, devs map[string]sliceDevice) []Device {
	if c.Status.Allocation == nil {
		return nil
	}
	var out []Device
	for _, res := range c.Status.Allocation.Devices.Results {
		if res.Driver != Driver {
			continue
		}
		d := Device{Request: res.Request, Pool: res.Pool, Name: res.Device, Attributes: map[string]string{}}
		if res.ShareID != nil {
			d.ShareID = string(*res.ShareID)
		}
		if sd, ok := devs[res.Pool+"/"+res.Device]; ok {
			for k, a := range sd.dev.Attributes {
				name := string(k)
				if i := strings.LastIndexByte(name, '/'); i >= 0 && strings.HasPrefix(name, Driver+"/") {
					name = name[i+1:]
				}
				d.Attributes[name] = attributeString(a)
			}
			if cp, ok := sd.dev.Capacity["memory"]; ok {
				q := cp.Value.DeepCopy()
				d.Capacity = &q
			}
		}
		if q, ok := res.ConsumedCapacity["memory"]; ok {
			q := q.DeepCopy()
			d.Memory = &q
		} else if d.Capacity != nil {
			q := d.Capacity.DeepCopy()
			d.Memory = &q
		}
		if q, ok := res.ConsumedCapacity["cores"]; ok && !q.IsZero() {
			q := q.DeepCopy()
			d.Cores = &q
		}
		for _, st := range c.Status.Devices {
			if st.Driver != res.Driver || st.Pool != res.Pool || st.Device != res.Device {
				continue
			}
			if st.ShareID != nil && res.ShareID != nil && *st.ShareID != string(*res.ShareID) {
				continue
			}
			if st.Data != nil && len(st.Data.Raw) > 0 {
				_ = json.Unmarshal(st.Data.Raw, &d.Data)
			}
		}
		out = append(out, d)
	}
	return out
}
