package commands

import (
	"bytes"
	"strings"
	"testing"
)

func TestCommandTree(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		wantErr string // "" = success
		wantOut string
	}{
		{args: []string{"--help"}, wantOut: "Available Commands"},
		{args: []string{"top", "--help"}, wantOut: "kubectl tessera top [claims]"},
		{args: []string{"help", "top"}, wantOut: "Lists Tessera's claims"},
		{args: []string{"bogus"}, wantErr: `unknown command "bogus"`},
		{args: []string{"bogus", "--help"}, wantErr: `unknown command "bogus"`},
		{args: []string{"top", "bogus"}, wantErr: `invalid argument "bogus"`},
		{args: []string{"top", "--nope"}, wantErr: "unknown flag: --nope"},
		{args: nil, wantErr: "no command given"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errOut bytes.Buffer
			cmd := NewRootCommand(Streams{Out: &out, Err: &errOut})
			cmd.SetArgs(tc.args)
			err := cmd.Execute()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("error %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
			if tc.wantOut != "" && !strings.Contains(out.String(), tc.wantOut) {
				t.Errorf("output does not contain %q:\n%s", tc.wantOut, out.String())
			}
		})
	}
}
