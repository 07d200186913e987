package scenario

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-dev/tessera/test/localcluster"
)

// ClaimFiles lists the files and directories on this node that belong to a
// claim: the plugin's CDI spec in localcluster.CDIRoot and anything under
// the plugin data directory (checkpoint, accounting directory) whose path
// names the claim's UID.
func ClaimFiles(uid types.UID) []string {
	var out []string
	for _, root := range []string{localcluster.CDIRoot, PluginDataDir} {
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			if strings.Contains(d.Name(), string(uid)) {
				out = append(out, p)
				if d.IsDir() {
					return filepath.SkipDir
				}
			}
			return nil
		})
	}
	return out
}

// PluginDataDir is the kubelet plugin's data directory in the local cluster.
var PluginDataDir = filepath.Join(localcluster.KubeletRootDir, "plugins", Driver)

// Cleanup deletes the namespace's pods and waits until they are gone and
// every claim the run saw is unprepared: its ResourceClaim deleted (claims
// made from templates go with their pod) or deallocated, and no file of it
// left (ClaimFiles). It reports what it checked.
func (r *Run) Cleanup(ctx context.Context, timeout time.Duration) error {
	// Claims the run has not looked at yet count too.
	if claims, err := r.Client.ResourceV1().ResourceClaims(r.Namespace).List(ctx, metav1.ListOptions{}); err == nil {
		for _, c := range claims.Items {
			r.ClaimUIDs[c.Name] = c.UID
		}
	}
	pods, err := r.Client.CoreV1().Pods(r.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	start := time.Now()
	r.printf("  deleting %d pod(s) in %s\n", len(pods.Items), r.Namespace)
	grace := int64(1)
	for _, p := range pods.Items {
		if err := r.Client.CoreV1().Pods(r.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var left []string
	for {
		left = left[:0]
		pods, err := r.Client.CoreV1().Pods(r.Namespace).List(ctx, metav1.ListOptions{})
		if err == nil {
			for _, p := range pods.Items {
				left = append(left, "pod "+p.Name)
			}
		}
		claims, err := r.Client.ResourceV1().ResourceClaims(r.Namespace).List(ctx, metav1.ListOptions{})
		if err == nil {
			for _, c := range claims.Items {
				if c.Status.Allocation != nil || len(c.Status.ReservedFor) > 0 {
					left = append(left, "claim "+c.Name+" (allocated)")
				}
			}
		}
		names := make([]string, 0, len(r.ClaimUIDs))
		for n := range r.ClaimUIDs {
			names = append(names, n)
		}
		slices.Sort(names)
		for _, n := range names {
			for _, f := range ClaimFiles(r.ClaimUIDs[n]) {
				left = append(left, "file "+f)
			}
		}
		if len(left) == 0 {
			r.printf("    pods gone, %d claim(s) unprepared: no CDI spec or plugin file of theirs left on the node (%.1fs)\n",
				len(r.ClaimUIDs), time.Since(start).Seconds())
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("after %s still left: %s", timeout, strings.Join(left, ", "))
		case <-time.After(250 * time.Millisecond):
		}
	}
}
