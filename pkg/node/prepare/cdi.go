package prepare

import (
	"context"
	"encoding/json"
	"fmt"

	"k8s.io/klog/v2"
	cdispecs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-dev/tessera/pkg/atomicfile"
	"github.com/tessera-dev/tessera/pkg/node/cdispec"
	"github.com/tessera-dev/tessera/pkg/node/driverfiles"
	"github.com/tessera-dev/tessera/pkg/node/enforce"
	"github.com/tessera-dev/tessera/pkg/node/mig"
	"github.com/tessera-dev/tessera/pkg/node/mps"
)

// buildSpec plans the enforcement of the claim's limits (package
// enforce), sets up what it needs on the node (the accounting directory,
// the ld.so.preload file, the claim's MPS daemon), records that in the
// record, and returns the claim's CDI spec: the device nodes per device,
// the claim-wide edits (environment, mounts, control nodes, driver files)
// and annotations with the claim's name, its reservation and the MIG
// instances it created, from which Recover rebuilds a lost record.
func (p *Preparer) buildSpec(ctx context.Context, pl *plan) (*cdispecs.Spec, error) {
	rec := pl.record
	res, err := enforce.Plan(p.enforceClaim(pl), p.allocations(pl), p.opts.Enforce, p.accountingDir(rec.UID))
	if err != nil {
		return nil, withReason(ReasonEnforcement, err)
	}
	for i := range rec.Devices {
		for _, v := range res.Visible {
			if v.UUID == rec.Devices[i].UUID {
				rec.Devices[i].Mode, rec.Devices[i].Enforced = string(v.Mode), string(v.Enforced)
				if v.Note != "" {
					klog.FromContext(ctx).Info("Limits of a device are not enforced by the node", "claim", klog.KRef(rec.Namespace, rec.Name), "device", rec.Devices[i].Device, "reason", v.Note)
				}
			}
		}
	}
	if res.AccountingDir != "" {
		// Fresh for every preparation: a stale accounting file would keep
		// the limits of an earlier allocation. A size-limited tmpfs.
		dir, err := p.accounting().Create(ctx, rec.UID)
		if err != nil {
			return nil, err
		}
		rec.AccountingDir = dir
	}
	if res.PreloadFile != "" {
		// Before the spec that mounts it: a runtime that finds the spec
		// finds the file.
		if err := atomicfile.Write(res.PreloadFile, res.PreloadContent, 0o644); err != nil {
			return nil, fmt.Errorf("write the claim's ld.so.preload: %w", err)
		}
		rec.PreloadFile = res.PreloadFile
	}
	if res.MPS != nil {
		// The claim's own daemon, with its limits set on the daemon side,
		// before any container can connect.
		pipe, err := p.opts.MPS.Start(ctx, rec.UID, *res.MPS)
		if err != nil {
			return nil, err
		}
		rec.MPS = mpsRecord(pipe, *res.MPS)
		if l, ok := p.opts.MPS.(mps.Located); ok {
			rec.MPS.Pod = l.Where(rec.UID)
		}
	}
	control, err := p.opts.Nodes.Control()
	if err != nil {
		return nil, err
	}
	claimEdits := cdispecs.ContainerEdits{Env: res.Env, DeviceNodes: control, Mounts: res.Mounts}
	if p.opts.DriverFiles != nil {
		driver, err := p.opts.DriverFiles.Edits(ctx)
		if err != nil {
			return nil, err
		}
		driverfiles.Merge(&claimEdits, driver)
	}
	var devices []cdispecs.Device
	var created []mig.Instance
	for i, d := range pl.devices {
		var nodes []*cdispecs.DeviceNode
		gpuNodes, err := p.opts.Nodes.GPU(d.gpu.Minor)
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, gpuNodes...)
		if d.mig != nil {
			caps, err := p.opts.Nodes.MIG(d.gpu.Minor, d.mig.GIID, d.mig.CIID)
			if err != nil {
				return nil, err
			}
			nodes = append(nodes, caps...)
			if d.mig.Created {
				created = append(created, *d.mig)
			}
		}
		rd := rec.Devices[i]
		devices = append(devices, cdispecs.Device{
			Name:           cdispec.DeviceName(rec.UID, rd.Device, rd.ShareID),
			ContainerEdits: cdispecs.ContainerEdits{DeviceNodes: nodes},
		})
	}
	annotations := map[string]string{cdispec.AnnotationClaim: rec.Namespace + "/" + rec.Name}
	reservation, err := json.Marshal(rec.Devices)
	if err != nil {
		return nil, err
	}
	annotations[cdispec.AnnotationReservation] = string(reservation)
	if len(created) > 0 {
		data, _ := json.Marshal(created)
		annotations[cdispec.AnnotationMIGInstances] = string(data)
	}
	return cdispec.NewSpec(claimEdits, devices, annotations)
}
