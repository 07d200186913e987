// Command image builds Tessera's container image without Docker and writes
// it as an OCI image archive, ready for
//
//	ctr -n k8s.io images import --snapshotter overlayfs bin/tessera-image.tar
//
// Usage:
//
//	go run ./hack/image [-o bin/tessera-image.tar] [-tag tessera.dev/tessera:dev] [-cmd kubelet-plugin,controller]
//
// See package imagebuild for what goes into the image.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/tessera-dev/tessera/test/imagebuild"
)

func main() {
	out := flag.String("o", "bin/tessera-image.tar", "OCI image archive to write")
	tag := flag.String("tag", imagebuild.DefaultTag, "image name (containerd's io.containerd.image.name)")
	cmds := flag.String("cmd", "", "comma-separated commands to include (default: every ./cmd/{kubelet-plugin,controller} that has sources)")
	version := flag.String("version", "dev", "version label of the image")
	root := flag.String("repo", ".", "repository root")
	quiet := flag.Bool("q", false, "print only the archive path")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	o := imagebuild.Options{RepoRoot: *root, Tag: *tag, Output: *out, Version: *version}
	if !*quiet {
		o.Logf = func(f string, a ...any) { fmt.Fprintf(os.Stderr, "image: "+f+"\n", a...) }
	}
	if *cmds != "" {
		known := map[string]imagebuild.Command{}
		for _, c := range imagebuild.Commands {
			known[c.Name] = c
		}
		for _, name := range strings.Split(*cmds, ",") {
			c, ok := known[name]
			if !ok {
				fmt.Fprintf(os.Stderr, "image: -cmd %s: unknown command; known: kubelet-plugin, controller, nvidia-cdi-hook\n", name)
				os.Exit(2)
			}
			o.Commands = append(o.Commands, c)
		}
	}
	res, err := imagebuild.Build(ctx, o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "image: %v\n", err)
		os.Exit(1)
	}
	abs, _ := filepath.Abs(*out)
	if *quiet {
		fmt.Println(abs)
		return
	}
	fmt.Fprintf(os.Stderr, "image: %s (%s) with %s written to %s\n", res.Tag, res.Digest, strings.Join(res.Commands, ", "), abs)
	fmt.Fprintf(os.Stderr, "image: import with: ctr -n k8s.io images import --snapshotter overlayfs %s\n", abs)
}
