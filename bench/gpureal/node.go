package gpureal

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"time"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/qos"
)

// node is the bench's kubelet-style cgroup tree: its own kubelet --cgroup-root below
// the cgroup mount (so it never touches a real kubelet's pods), with kubepods and the
// Burstable and BestEffort levels, the cgroupfs driver's names.
type node struct {
	hier *cgroups.Hierarchy
	root string // the cgroup mount
	base string // kubelet's --cgroup-root, relative, without slashes
}

// newNode creates the tree below a fresh, unique kubelet root.
func newNode(cgroupRoot string) (*node, error) {
	h, err := cgroups.Open(cgroupRoot)
	if err != nil {
		return nil, err
	}
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	n := &node{hier: h, root: cgroupRoot, base: "understory-gpureal-" + hex.EncodeToString(b)}
	for _, rel := range []string{"", "kubepods", "kubepods/burstable", "kubepods/besteffort"} {
		if _, err := h.Create(path.Join(n.base, rel)); err != nil {
			return nil, errors.Join(err, n.close())
		}
	}
	return n, nil
}

// kubeletRoot is the node's kubelet --cgroup-root, as the agent's config names it.
func (n *node) kubeletRoot() string { return "/" + n.base }

// podParent is the pod's cgroup parent as kubelet hands it to the runtime
// ("/<root>/kubepods/burstable/pod<uid>").
func (n *node) podParent(p podSpec) (string, error) {
	q := cgroups.QOSBestEffort
	switch qos.KubeQOSClass(p.pod()) {
	case "Guaranteed":
		q = cgroups.QOSGuaranteed
	case "Burstable":
		q = cgroups.QOSBurstable
	}
	rel, err := cgroups.Naming{Driver: cgroups.DriverCgroupfs}.PodPath(q, string(p.UID))
	if err != nil {
		return "", err
	}
	return "/" + path.Join(n.base, rel), nil
}

// createContainer creates a container's cgroup (the runtime's cgroups path, absolute in
// the hierarchy) and its pod cgroup above it.
func (n *node) createContainer(cgroupsPath string) (string, error) {
	rel, err := cgroups.CleanPath(cgroupsPath[min(1, len(cgroupsPath)):])
	if err != nil {
		return "", fmt.Errorf("container cgroups path %q: %w", cgroupsPath, err)
	}
	if !inside(rel, n.base) {
		return "", fmt.Errorf("container cgroups path %q is outside the bench's kubelet root /%s", cgroupsPath, n.base)
	}
	if _, err := n.hier.Create(path.Dir(rel)); err != nil {
		return "", err
	}
	if _, err := n.hier.Create(rel); err != nil {
		return "", err
	}
	return rel, nil
}

func inside(rel, base string) bool {
	return len(rel) > len(base) && rel[:len(base)] == base && rel[len(base)] == '/'
}

// thaw thaws one cgroup (what a runtime does before it kills a frozen container).
func (n *node) thaw(rel string) {
	if g, err := n.hier.Load(rel); err == nil {
		_ = g.Thaw()
	}
}

// thawAll thaws every cgroup below the kubelet root: a frozen v1 task never dies.
func (n *node) thawAll() {
	var walk func(rel string, depth int)
	walk = func(rel string, depth int) {
		n.thaw(rel)
		if depth > 8 {
			return
		}
		kids, err := n.hier.ListChildren(rel)
		if err != nil {
			return
		}
		for _, k := range kids {
			walk(path.Join(rel, k), depth+1)
		}
	}
	walk(n.base, 0)
}

// close thaws and removes the whole tree, the agent's tier and freezer pin in it too,
// retrying while killed tasks leave their cgroups.
func (n *node) close() error {
	n.thawAll()
	var err error
	for range 100 {
		if err = n.hier.RemoveEmpty(n.base); err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("removing the bench's cgroups /%s: %w", n.base, err)
}
