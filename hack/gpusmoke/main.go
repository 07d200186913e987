// Command gpusmoke is `make gpu-smoke`: on a machine with a real NVIDIA GPU
// and driver, and no cluster, it discovers the GPUs through NVML (read-only:
// it never changes MIG mode or resets anything), prints the ResourceSlices
// the node would publish, prepares a share, a whole GPU and (only where MIG
// is already enabled) a MIG partition through the plugin's real prepare
// path into a temporary CDI root, applies each claim's CDI spec to an OCI
// bundle with the CDI library, runs the CUDA probe in it with runc, reports
// what the probe saw, unprepares, and checks that nothing is left.
// --gpu-backend=mock --no-run exercises the same path without a GPU.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/tessera-dev/tessera/hack/gpusmoke/internal/gpusmoke"
	"github.com/tessera-dev/tessera/pkg/gpu/devicemodel"
	"github.com/tessera-dev/tessera/pkg/node/enforce"
	"github.com/tessera-dev/tessera/pkg/node/plugin"
)

const shareMemory = 1 << 30

type smokeCase struct {
	name   string
	device string
	share  bool
}

func main() {
	var o plugin.Options
	fs := pflag.NewFlagSet("gpusmoke", pflag.ContinueOnError)
	o.AddFlags(fs)
	work := fs.String("work-dir", "", "Temporary directory for the CDI root, checkpoint and bundles (default: a new one, removed at the end).")
	cc := fs.String("cc", "cc", "C compiler for the probe.")
	probe := fs.String("probe-binary", "", "A probe built before (--build-probe); empty: build it with --cc.")
	buildProbe := fs.String("build-probe", "", "Only build the probe with --cc into this path and exit (make gpu-smoke-kit, for a GPU machine without a C compiler).")
	runc := fs.String("runc", "runc", "runc binary that runs the probe.")
	noRun := fs.Bool("no-run", false, "Prepare, apply the specs and unprepare, but do not run the probe (no GPU needed with --gpu-backend=mock).")
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	fs.AddGoFlagSet(klogFlags)
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	ctx := context.Background()
	if *buildProbe != "" {
		if err := gpusmoke.BuildProbeTo(ctx, *cc, *buildProbe); err != nil {
			fmt.Fprintln(os.Stderr, "gpu-smoke:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(ctx, &o, *work, *cc, *probe, *runc, *noRun); err != nil {
		fmt.Fprintln(os.Stderr, "gpu-smoke FAILED:", err)
		os.Exit(1)
	}
	fmt.Println("gpu-smoke: PASS")
}

func run(ctx context.Context, o *plugin.Options, work, cc, probe, runc string, noRun bool) error {
	if work == "" {
		dir, err := os.MkdirTemp("", "tessera-gpu-smoke")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		work = dir
	}
	if o.NodeName == "" {
		o.NodeName, _ = os.Hostname()
	}
	o.CDIRoot = filepath.Join(work, "cdi")
	o.PluginDataDir = filepath.Join(work, "plugin")
	o.BootIDPath = ""
	fmt.Println("== ResourceSlices this node would publish (--print-slices)")
	if err := plugin.PrintSlices(ctx, o, os.Stdout); err != nil {
		return fmt.Errorf("print slices: %w", err)
	}
	s, err := plugin.NewStandalone(ctx, o)
	if err != nil {
		return err
	}
	defer s.Close()
	inv := s.Inventory()
	before := map[string]int{}
	var cases []smokeCase
	for _, g := range inv.GPUs {
		fmt.Printf("== GPU %d: %s %s, %d MiB, MIG enabled: %v, driver %s\n", g.Index, g.UUID, g.ProductName, g.MemoryBytes>>20, g.MIGEnabled, inv.DriverVersion)
		if g.MIGEnabled {
			all, err := s.MIG.List(ctx, g.UUID)
			if err != nil {
				return err
			}
			before[g.UUID] = len(all)
			if !hasCase(cases, "mig") && len(g.MIGProfiles) > 0 {
				p := g.MIGProfiles[0]
				for _, q := range g.MIGProfiles {
					if q.MemoryBytes < p.MemoryBytes {
						p = q
					}
				}
				// The last placement no existing instance overlaps.
			placements:
				for j := len(p.Placements) - 1; j >= 0; j-- {
					pl := p.Placements[j]
					for _, inst := range g.MIGInstances {
						if pl.Start < inst.Placement.Start+inst.Placement.Size && inst.Placement.Start < pl.Start+pl.Size {
							continue placements
						}
					}
					cases = append(cases, smokeCase{name: "mig", device: devicemodel.MIGDeviceName(g.Index, p.Name, pl.Start)})
					break
				}
			}
			continue
		}
		if !hasCase(cases, "share") {
			cases = append(cases,
				smokeCase{name: "share", device: devicemodel.GPUDeviceName(g.Index), share: true},
				smokeCase{name: "whole", device: devicemodel.GPUDeviceName(g.Index)})
		}
	}
	if len(cases) == 0 {
		return fmt.Errorf("no GPU to test")
	}
	if !noRun && probe == "" {
		if probe, err = gpusmoke.BuildProbe(ctx, cc, work); err != nil {
			return err
		}
	}
	var failed []string
	for i, c := range cases {
		claim := newClaim(o.NodeName, c, i)
		devs, err := s.Preparer.Prepare(ctx, claim)
		if err != nil {
			return fmt.Errorf("%s: prepare %s: %w", c.name, c.device, err)
		}
		var ids []string
		for _, d := range devs {
			ids = append(ids, d.CDIDeviceIDs...)
		}
		fmt.Printf("== %s: prepared %s, CDI devices %v\n", c.name, c.device, ids)
		bundleDir := filepath.Join(work, "bundle-"+c.name)
		if !noRun {
			b, err := gpusmoke.NewBundle(ctx, bundleDir, probe)
			if err != nil {
				return err
			}
			if err := b.ApplyCDI(o.CDIRoot, ids...); err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			if err := b.Write(); err != nil {
				return err
			}
			var out bytes.Buffer
			cmd := exec.CommandContext(ctx, runc, "run", "--bundle", bundleDir, fmt.Sprintf("tessera-smoke-%d-%s", os.Getpid(), c.name))
			cmd.Stdout, cmd.Stderr = &out, &out
			runErr := cmd.Run()
			fmt.Printf("-- probe output (%v):\n%s", runErr, out.String())
			r, err := gpusmoke.ParseReport(out.String())
			switch {
			case err != nil:
				failed = append(failed, fmt.Sprintf("%s: %v", c.name, err))
			case r.Libcuda != "ok" || r.Init != 0 || r.Devices != 1:
				failed = append(failed, fmt.Sprintf("%s: probe saw libcuda=%s init=%d devices=%d", c.name, r.Libcuda, r.Init, r.Devices))
			case c.share:
				mode, enforced := b.Env(enforce.EnvTesseraMode), b.Env(enforce.EnvTesseraEnforced)
				held := r.LimitHeld(shareMemory, 64<<20)
				fmt.Printf("== share: mode %s (enforced by %s): %d MiB limit held: %v (allocated %d MiB in 256 MiB steps; cuMemGetInfo at start: %d MiB free of %d MiB)\n",
					mode, enforced, shareMemory>>20, held, r.Allocated>>20, r.Free>>20, r.Total>>20)
				switch {
				case held:
				case enforced == "" || enforced == string(enforce.Advisory):
					fmt.Println("== share: expected: nothing enforces a share's memory without an interposer (--interposer-library) or MPS (--mps-control)")
				default:
					failed = append(failed, fmt.Sprintf("share: enforced by %s, yet the probe allocated %d MiB over a %d MiB limit", enforced, r.Allocated>>20, shareMemory>>20))
				}
			default:
				fmt.Printf("== %s: probe saw %d device, %d MiB total, allocated %d MiB\n", c.name, r.Devices, r.Total>>20, r.Allocated>>20)
			}
		}
		if err := s.Preparer.Unprepare(ctx, types.NamespacedName{Namespace: claim.Namespace, Name: claim.Name}, claim.UID); err != nil {
			return fmt.Errorf("%s: unprepare: %w", c.name, err)
		}
	}
	// Nothing left: no CDI spec, no checkpoint record, no MIG instance
	// beyond those that existed before.
	if left, _ := filepath.Glob(filepath.Join(o.CDIRoot, "*")); len(left) > 0 {
		failed = append(failed, fmt.Sprintf("CDI specs left after unprepare: %v", left))
	}
	if p := s.Preparer.Prepared(); len(p) > 0 {
		failed = append(failed, fmt.Sprintf("claims still recorded after unprepare: %v", p))
	}
	for uuid, n := range before {
		all, err := s.MIG.List(ctx, uuid)
		if err != nil {
			return err
		}
		if len(all) != n {
			failed = append(failed, fmt.Sprintf("GPU %s has %d MIG devices, %d before", uuid, len(all), n))
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%s", strings.Join(failed, "; "))
	}
	return nil
}

func hasCase(cases []smokeCase, name string) bool {
	for _, c := range cases {
		if c.name == name {
			return true
		}
	}
	return false
}

func newClaim(node string, c smokeCase, i int) *resourceapi.ResourceClaim {
	r := resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: devicemodel.DriverName, Pool: node, Device: c.device}
	if c.share {
		id := types.UID(fmt.Sprintf("share-%d", i))
		r.ShareID = &id
		r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{
			devicemodel.CapMemory: *resource.NewQuantity(shareMemory, resource.BinarySI),
			devicemodel.CapCores:  *resource.NewQuantity(0, resource.DecimalSI),
		}
	}
	name := "gpu-smoke-" + c.name
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID(name + "-uid")},
		Status: resourceapi.ResourceClaimStatus{
			Allocation:  &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{r}}},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: name, UID: types.UID(name + "-pod")}},
		},
	}
}
