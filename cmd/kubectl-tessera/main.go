// Command kubectl-tessera is Tessera's kubectl plugin (`kubectl tessera
// <command>`; package kubectltessera has the commands). Install it on your
// PATH as kubectl-tessera.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/tessera-dev/tessera/pkg/kubectl/commands"
)

func main() {
	cmd := commands.NewRootCommand(commands.Streams{Out: os.Stdout, Err: os.Stderr})
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		fmt.Fprintf(os.Stderr, "kubectl tessera: %v\n", err)
		os.Exit(1)
	}
}
