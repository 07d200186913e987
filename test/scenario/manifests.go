package scenario

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"
)

// Manifest is what a YAML document names.
type Manifest struct {
	Kind        string
	Name        string
	Annotations map[string]string
	// Parallelism is a Job's spec.parallelism (the pods it starts).
	Parallelism int
}

// ReadManifests lists the objects of a multi-document YAML file.
func ReadManifests(path string) ([]Manifest, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []Manifest
	for _, doc := range splitYAML(string(b)) {
		var m struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name        string            `json:"name"`
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
			Spec struct {
				Parallelism *int `json:"parallelism"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if m.Kind == "" {
			continue
		}
		mf := Manifest{Kind: m.Kind, Name: m.Metadata.Name, Annotations: m.Metadata.Annotations}
		if m.Kind == "Job" {
			mf.Parallelism = 1
			if m.Spec.Parallelism != nil {
				mf.Parallelism = *m.Spec.Parallelism
			}
		}
		out = append(out, mf)
	}
	return out, nil
}

// splitYAML splits a multi-document YAML stream at its "---" lines.
func splitYAML(s string) []string {
	var docs []string
	var cur strings.Builder
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if strings.TrimRight(l, " ") == "---" {
			docs = append(docs, cur.String())
			cur.Reset()
			continue
		}
		cur.WriteString(l + "\n")
	}
	return append(docs, cur.String())
}

// Apply applies every file of the scenario in order, waiting after each
// for the pods to reach their expectations.
func (r *Run) Apply(ctx context.Context) error {
	files, err := r.Scenario.Files(r.RepoRoot)
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("demo/%s has no YAML files", r.Scenario.Name)
	}
	for _, f := range files {
		if err := r.ApplyFile(ctx, f); err != nil {
			return err
		}
	}
	return nil
}

// ApplyFile applies one file with kubectl and waits until the pods of the
// namespace reach their expectations.
func (r *Run) ApplyFile(ctx context.Context, path string) error {
	manifests, err := ReadManifests(path)
	if err != nil {
		return err
	}
	rel, _ := filepath.Rel(r.RepoRoot, path)
	r.printf("  $ kubectl apply -n %s -f %s\n", r.Namespace, rel)
	out, err := r.Kubectl(ctx, "apply", "-n", r.Namespace, "-f", path)
	if err != nil {
		return err
	}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		r.printf("    %s\n", l)
	}
	var named []string
	for _, m := range manifests {
		switch m.Kind {
		case "Pod":
			named = append(named, m.Name)
		case "Job":
			// The Job controller names its pods; wait for them to exist,
			// then hold them to their template's expectation.
			if err := r.waitJobPods(ctx, m.Name, m.Parallelism); err != nil {
				return err
			}
		}
	}
	return r.WaitPods(ctx, named)
}
