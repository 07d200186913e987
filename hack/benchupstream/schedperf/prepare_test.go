package schedperf

import (
	"reflect"
	"strings"
	"testing"
)

func TestReplaceArgs(t *testing.T) {
	tests := []struct {
		name    string
		json    string
		version string
		want    []string
		wantErr string
	}{
		{
			name: "staging directories become published modules, other replaces stay",
			json: `{"Module":{"Path":"k8s.io/kubernetes"},"Replace":[
				{"Old":{"Path":"k8s.io/api"},"New":{"Path":"./staging/src/k8s.io/api"}},
				{"Old":{"Path":"github.com/foo/bar","Version":"v1.0.0"},"New":{"Path":"github.com/foo/bar","Version":"v1.0.1"}},
				{"Old":{"Path":"k8s.io/dynamic-resource-allocation"},"New":{"Path":"./staging/src/k8s.io/dynamic-resource-allocation"}}]}`,
			version: "v0.37.2",
			want:    []string{"-replace=k8s.io/api=k8s.io/api@v0.37.2", "-replace=k8s.io/dynamic-resource-allocation=k8s.io/dynamic-resource-allocation@v0.37.2"},
		},
		{
			name:    "an already rewritten go.mod",
			json:    `{"Replace":[{"Old":{"Path":"k8s.io/api"},"New":{"Path":"k8s.io/api","Version":"v0.37.2"}}]}`,
			version: "v0.37.2",
			wantErr: "replaces no module by a ./staging/src/ directory",
		},
		{
			name:    "a staging directory of another module",
			json:    `{"Replace":[{"Old":{"Path":"k8s.io/api"},"New":{"Path":"./staging/src/k8s.io/client-go"}}]}`,
			version: "v0.37.2",
			wantErr: "expected k8s.io/api => ./staging/src/k8s.io/api",
		},
		{
			name:    "no version",
			json:    `{"Replace":[{"Old":{"Path":"k8s.io/api"},"New":{"Path":"./staging/src/k8s.io/api"}}]}`,
			wantErr: "staging version is empty",
		},
		{
			name:    "not JSON",
			json:    `module k8s.io/kubernetes`,
			version: "v0.37.2",
			wantErr: "go mod edit -json",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ReplaceArgs([]byte(tc.json), tc.version)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ReplaceArgs() error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ReplaceArgs() = %q, want %q", got, tc.want)
			}
		})
	}
}
