// Command image builds Tessera's container image from
// deployments/container/image.yaml without Docker, and writes it as an OCI
// image archive, ready for
//
//	ctr -n k8s.io images import --snapshotter overlayfs bin/tessera-image.tar
//
// and/or as a directory holding the image's file system (what
// deployments/container/Dockerfile's build stage does, for its FROM scratch
// stage to copy).
//
// Usage:
//
//	go run ./hack/image [-o bin/tessera-image.tar] [-rootfs DIR] [-tag tessera.dev/tessera:dev] [-cmd kubelet-plugin,controller]
//
// It needs apt-get and dpkg-deb (a Debian or Ubuntu machine) to fetch and
// unpack the pinned Debian packages; they are kept in ~/.cache/tessera/debs.
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
	out := flag.String("o", "bin/tessera-image.tar", "OCI image archive to write (empty: none)")
	rootfs := flag.String("rootfs", "", "directory to write the image's file system into (empty: none)")
	debCache := flag.String("deb-cache", imagebuild.DefaultDebCache(), "where fetched .deb files are kept")
	tag := flag.String("tag", imagebuild.DefaultTag, "image name (containerd's io.containerd.image.name)")
	cmds := flag.String("cmd", "", "comma-separated binaries of deployments/container/image.yaml to include (default: all)")
	version := flag.String("version", "dev", "version label of the image")
	root := flag.String("repo", ".", "repository root")
	quiet := flag.Bool("q", false, "print only the archive path")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	o := imagebuild.Options{RepoRoot: *root, Tag: *tag, Output: *out, Rootfs: *rootfs, Version: *version, DebCache: *debCache}
	if !*quiet {
		o.Logf = func(f string, a ...any) { fmt.Fprintf(os.Stderr, "image: "+f+"\n", a...) }
	}
	if *cmds != "" {
		o.Only = strings.Split(*cmds, ",")
	}
	res, err := imagebuild.Build(ctx, o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "image: %v\n", err)
		os.Exit(1)
	}
	if *out == "" {
		fmt.Fprintf(os.Stderr, "image: %s (%s) with %s written to %s\n", res.Tag, res.Digest, strings.Join(res.Commands, ", "), *rootfs)
		return
	}
	abs, _ := filepath.Abs(*out)
	if *quiet {
		fmt.Println(abs)
		return
	}
	fmt.Fprintf(os.Stderr, "image: %s (%s) with %s written to %s\n", res.Tag, res.Digest, strings.Join(res.Commands, ", "), abs)
	fmt.Fprintf(os.Stderr, "image: import with: ctr -n k8s.io images import --snapshotter overlayfs %s\n", abs)
}
