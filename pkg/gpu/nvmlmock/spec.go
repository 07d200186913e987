package nvmlmock

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// GPUGroup is a number of identical mock GPUs.
type GPUGroup struct {
	Model string `json:"model"`
	Count int    `json:"count"`
}

// NodeSpec describes the GPUs of one mock node, in index order.
type NodeSpec struct {
	GPUs []GPUGroup `json:"gpus"`
}

// maxGPUs bounds a mock node; real nodes carry at most 16 GPUs.
const maxGPUs = 64

// ParseProfile parses the --mock-profile syntax: a comma-separated list of
// `<model>[:<count>]` or a node shorthand such as `dgxh100`, e.g. `t4:2`,
// `t4:2,a10`, `dgxa100`.
func ParseProfile(s string) (NodeSpec, error) {
	var spec NodeSpec
	s = strings.TrimSpace(s)
	if s == "" {
		return spec, fmt.Errorf("--mock-profile is empty: %s", profileHelp())
	}
	for _, part := range strings.Split(s, ",") {
		part = strings.ToLower(strings.TrimSpace(part))
		if node, ok := Nodes[part]; ok {
			sub, err := ParseProfile(node)
			if err != nil {
				return spec, err
			}
			spec.GPUs = append(spec.GPUs, sub.GPUs...)
			continue
		}
		name, countStr, hasCount := strings.Cut(part, ":")
		count := 1
		if hasCount {
			n, err := strconv.Atoi(countStr)
			if err != nil || n < 1 {
				return spec, fmt.Errorf("--mock-profile %q: count %q must be a positive integer, e.g. t4:2", part, countStr)
			}
			count = n
		}
		spec.GPUs = append(spec.GPUs, GPUGroup{Model: name, Count: count})
	}
	return spec, spec.Validate()
}

// LoadNodeSpec reads a YAML node description:
//
//	gpus:
//	- {model: t4, count: 2}
//	- {model: h100-80gb, count: 1}
func LoadNodeSpec(path string) (NodeSpec, error) {
	var spec NodeSpec
	data, err := os.ReadFile(path)
	if err != nil {
		return spec, fmt.Errorf("--mock-config: %w", err)
	}
	if err := yaml.UnmarshalStrict(data, &spec); err != nil {
		return spec, fmt.Errorf("--mock-config %s: %w (expected `gpus: [{model: t4, count: 2}]`)", path, err)
	}
	return spec, spec.Validate()
}

// Validate checks model names and counts.
func (s NodeSpec) Validate() error {
	total := 0
	for _, g := range s.GPUs {
		if _, ok := Models[g.Model]; !ok {
			return fmt.Errorf("unknown mock GPU model %q: %s", g.Model, profileHelp())
		}
		if g.Count < 1 {
			return fmt.Errorf("mock GPU model %q: count %d must be at least 1", g.Model, g.Count)
		}
		total += g.Count
	}
	if total == 0 {
		return fmt.Errorf("mock node has no GPUs: %s", profileHelp())
	}
	if total > maxGPUs {
		return fmt.Errorf("mock node has %d GPUs; at most %d are supported", total, maxGPUs)
	}
	return nil
}

// Models returns the model of every GPU in index order.
func (s NodeSpec) Models() []string {
	var out []string
	for _, g := range s.GPUs {
		for range g.Count {
			out = append(out, g.Model)
		}
	}
	return out
}

func profileHelp() string {
	var models, nodes []string
	for m := range Models {
		models = append(models, m)
	}
	for n := range Nodes {
		nodes = append(nodes, n)
	}
	slices.Sort(models)
	slices.Sort(nodes)
	return fmt.Sprintf("use <model>[:<count>][,...] with models %s, or one of %s",
		strings.Join(models, ", "), strings.Join(nodes, ", "))
}
