package cgroups

import (
	"errors"
	"fmt"
	"path"
	"strings"
)

// This file is the one place that knows how kubelet, and the container runtime
// below it, name pod cgroups under both cgroup drivers: it builds the paths of
// kubelet's QoS and pod cgroups, of the agent's batch tier and of a pod below
// the tier, and the cgroups path a runtime hands to runc; and it reads a cgroup
// path back into QoS class, pod UID and container ID. Paths are relative to
// the hierarchy root. kubelet's internal name of a cgroup is a list of
// components: those of its --cgroup-root, then "kubepods", the QoS class
// (none for Guaranteed) and "pod<uid>" (pkg/kubelet/cm: ParseCgroupfsToCgroupName,
// NewCgroupName). The driver turns that list into a path:
//
//	cgroupfs  <root>/kubepods[/burstable|/besteffort]/pod<uid>/<id>
//	systemd   every level a slice named by the '-'-joined chain of all the
//	          components down to it, each with '-' escaped to '_' (ToSystemd):
//	          kubepods.slice[/kubepods-<qos>.slice]/kubepods[-<qos>]-pod<uid_>.slice/<runtime>-<id>.scope
//	          and below --cgroup-root /kubelet (kind's):
//	          kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/
//	          kubelet-kubepods-besteffort-pod<uid_>.slice
//
// Naming builds the names that depend on the root; the functions of a Driver
// work on a path already built (TierPodPath, ContainerCgroupsPath) or read one
// back (the parsers), whatever the root.

// ErrNotPodCgroup: a cgroup path that names no pod cgroup kubelet (or the
// agent's tier) made: a system service, a QoS cgroup, a foreign tree.
var ErrNotPodCgroup = errors.New("cgroups: not a kubelet pod cgroup")

// Driver is kubelet's cgroup driver; it decides how cgroup directories are
// named (the agent always writes cgroupfs directly, the driver is naming only).
type Driver string

// Kubelet cgroup drivers.
const (
	DriverCgroupfs Driver = "cgroupfs"
	DriverSystemd  Driver = "systemd"
)

// ParseDriver accepts exactly "cgroupfs" or "systemd" (kubelet's spelling).
func ParseDriver(s string) (Driver, error) {
	switch d := Driver(s); d {
	case DriverCgroupfs, DriverSystemd:
		return d, nil
	}
	return "", fmt.Errorf("parsing cgroup driver %q (want %q or %q): %w", s, DriverCgroupfs, DriverSystemd, ErrInvalidDriver)
}

// KubeQOS is kubelet's pod QoS class, which picks the QoS-level cgroup a pod
// cgroup lives under. The zero value is invalid on purpose (and means
// "unknown" in a parsed PodCgroup).
type KubeQOS int

// Kubelet QoS classes.
const (
	QOSGuaranteed KubeQOS = iota + 1
	QOSBurstable
	QOSBestEffort
)

// String returns kubelet's name of the class.
func (q KubeQOS) String() string {
	switch q {
	case QOSGuaranteed:
		return "Guaranteed"
	case QOSBurstable:
		return "Burstable"
	case QOSBestEffort:
		return "BestEffort"
	default:
		return fmt.Sprintf("KubeQOS(%d)", int(q))
	}
}

// DefaultTierName is the name of the agent-owned batch tier below BestEffort.
const DefaultTierName = "understory-batch"

// MaxNameLen bounds a pod UID or tier name (a Kubernetes UID is 36 bytes; a
// static pod's is a 32-byte hash). It keeps names far below NAME_MAX even
// after the systemd prefixes are added.
const MaxNameLen = 128

const (
	kubepodsName  = "kubepods"
	sliceSuffix   = ".slice"
	scopeSuffix   = ".scope"
	podPrefix     = "pod"
	burstableName = "burstable"
	besteffort    = "besteffort"
)

// runtimeScopePrefixes are the container runtimes' prefixes of a container's
// cgroup name: systemd "<prefix>-<id>.scope" (the prefix is the middle field of
// the runtime's "<slice>:<prefix>:<id>"); cri-o's cgroupfs "crio-<id>".
var runtimeScopePrefixes = [...]string{"cri-containerd", "crio", "docker"}

// qosName returns kubelet's name of q's QoS-level cgroup below its root:
// "kubepods" and the class, none for Guaranteed (whose pods live directly under
// kubepods); ok=false for an invalid class.
func qosName(q KubeQOS) ([]string, bool) {
	switch q {
	case QOSGuaranteed:
		return []string{kubepodsName}, true
	case QOSBurstable:
		return []string{kubepodsName, burstableName}, true
	case QOSBestEffort:
		return []string{kubepodsName, besteffort}, true
	}
	return nil, false
}

// Naming is kubelet's cgroup naming on one node: its cgroup driver and its
// --cgroup-root (KubeletConfiguration cgroupRoot). The zero Root is "/", so
// Naming{Driver: DriverCgroupfs} is kubelet's default naming. The methods
// check the root on every call (Validate says why one is refused).
type Naming struct {
	// Driver is kubelet's cgroup driver.
	Driver Driver
	// Root is kubelet's --cgroup-root as kubelet takes it, a cgroupfs-style
	// path: "/" (kubelet's default; "" is the same) or e.g. kind's "/kubelet".
	// Its components lead every name kubelet builds: under systemd "/kubelet"
	// is the slice kubelet.slice, and "/kubelet.slice" would be
	// kubelet.slice.slice, as kubelet names it.
	Root string
}

// Validate checks the driver and the root. A root must be a clean relative
// path once its leading and trailing '/' are trimmed (see CleanPath); under
// systemd each of its components becomes part of a slice unit name, so it
// must also be a safe name (1..MaxNameLen bytes of [A-Za-z0-9._-], not
// starting with '.', no "..") and the root's own slice name at most NAME_MAX
// bytes. A bad driver is ErrInvalidDriver, a bad root ErrInvalidPath.
func (n Naming) Validate() error {
	_, err := n.rootComponents()
	return err
}

// rootComponents returns the components of the root (none for "/"), checked
// as Validate says.
func (n Naming) rootComponents() ([]string, error) {
	switch n.Driver {
	case DriverCgroupfs, DriverSystemd:
	default:
		return nil, fmt.Errorf("naming cgroups with driver %q: %w", n.Driver, ErrInvalidDriver)
	}
	r := strings.Trim(n.Root, "/")
	if r == "" {
		return nil, nil
	}
	if _, err := CleanPath(r); err != nil {
		return nil, fmt.Errorf("kubelet cgroup root %q: %w", clip(n.Root), err)
	}
	comps := strings.Split(r, "/")
	if n.Driver == DriverSystemd {
		for _, c := range comps {
			if err := validName(c); err != nil {
				return nil, fmt.Errorf("kubelet cgroup root %q: component %q cannot be part of a systemd slice name: %w",
					clip(n.Root), clip(c), err)
			}
		}
		if unit := sliceChain(comps); !validUnit(unit) {
			return nil, fmt.Errorf("kubelet cgroup root %q: slice name %q is longer than %d bytes: %w",
				clip(n.Root), clip(unit), nameMax, ErrInvalidPath)
		}
	}
	return comps, nil
}

// sliceChain is the systemd unit name of the cgroup whose kubelet name is comps:
// the components escaped and joined by '-', plus ".slice".
func sliceChain(comps []string) string {
	esc := make([]string, len(comps))
	for i, c := range comps {
		esc[i] = escapeUnit(c)
	}
	return strings.Join(esc, "-") + sliceSuffix
}

// cgroupPath returns the path of the cgroup kubelet names by its root's
// components followed by comps: cgroupfs joins them; systemd makes every level
// a slice named by the chain of all the components down to it. A systemd unit
// name longer than NAME_MAX is ErrInvalidPath.
func (n Naming) cgroupPath(comps ...string) (string, error) {
	root, err := n.rootComponents()
	if err != nil {
		return "", err
	}
	all := append(append(make([]string, 0, len(root)+len(comps)), root...), comps...)
	if n.Driver == DriverCgroupfs || len(all) == 0 {
		return strings.Join(all, "/"), nil
	}
	dirs := make([]string, len(all))
	for i := range all {
		dirs[i] = sliceChain(all[:i+1])
	}
	if last := dirs[len(dirs)-1]; !validUnit(last) {
		return "", fmt.Errorf("slice name %q is longer than %d bytes: %w", clip(last), nameMax, ErrInvalidPath)
	}
	return strings.Join(dirs, "/"), nil
}

// RootPath returns the path of kubelet's --cgroup-root, the parent of
// kubepods: "" for "/", cgroupfs "kubelet", systemd "kubelet.slice" (and for
// "/a/b": "a/b", "a.slice/a-b.slice").
func (n Naming) RootPath() (string, error) {
	return n.cgroupPath()
}

// QOSPath returns the relative path of kubelet's QoS-level cgroup:
// cgroupfs "kubepods", "kubepods/burstable", "kubepods/besteffort";
// systemd "kubepods.slice", "kubepods.slice/kubepods-burstable.slice",
// "kubepods.slice/kubepods-besteffort.slice"; below a root as the type's
// doc says ("kubelet.slice/kubelet-kubepods.slice" for Guaranteed below
// /kubelet under systemd). It returns "" for an invalid driver, root or class.
// These cgroups are kubelet's: never write their files.
func (n Naming) QOSPath(q KubeQOS) string {
	comps, ok := qosName(q)
	if !ok {
		return ""
	}
	p, err := n.cgroupPath(comps...)
	if err != nil {
		return ""
	}
	return p
}

// childPath names a child component of the QoS-level cgroup the way kubelet
// names its own children: cgroupfs appends the component; systemd builds a
// slice whose name is the '-'-joined chain of (escaped) ancestor components,
// where escaping replaces '-' by '_' exactly as kubelet does.
func (n Naming) childPath(q KubeQOS, component string) (string, error) {
	comps, ok := qosName(q)
	if !ok {
		return "", fmt.Errorf("naming cgroup under QoS class %v: %w", q, ErrInvalidValue)
	}
	return n.cgroupPath(append(comps, component)...)
}

// childUnit is the slice unit of component below the slice path parent:
// "<parent's unit without .slice>-<component_>.slice".
func childUnit(parent, component string) string {
	return strings.TrimSuffix(path.Base(parent), sliceSuffix) + "-" + escapeUnit(component) + sliceSuffix
}

// escapeUnit is kubelet's escaping of one name component inside a systemd
// unit name: '-' separates ancestors there, so a '-' of the name becomes '_'.
func escapeUnit(s string) string { return strings.ReplaceAll(s, "-", "_") }

// PodPath returns the relative path kubelet gives the pod cgroup of a pod
// with the given UID and QoS class, e.g. cgroupfs "kubepods/burstable/pod<uid>"
// or systemd "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice"
// (uid_ has '-' replaced by '_'), below the root as the type's doc says. The
// UID must be a single safe name (see validName); anything else is
// ErrInvalidPath, so a UID can never escape the cgroup root.
func (n Naming) PodPath(q KubeQOS, uid string) (string, error) {
	if err := validName(uid); err != nil {
		return "", fmt.Errorf("pod uid %q: %w", uid, err)
	}
	return n.childPath(q, podPrefix+uid)
}

// TierPathIn returns the relative path of the agent-owned batch tier as a child
// of kubelet's QoS-level cgroup for q, named as kubelet would name a child
// component <name> there: QOSGuaranteed means kubepods itself (cgroupfs
// "kubepods/<name>", systemd "kubepods.slice/kubepods-<name_>.slice"),
// QOSBestEffort "kubepods/besteffort/<name>" (systemd
// "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-<name_>.slice").
// Below a root the slices carry the root's chain: systemd with /kubelet gives
// "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-<name_>.slice".
// name_ is escaped like kubelet escapes its components ('-' -> '_'), so that
// kubelet parses the slice back to exactly one component <name>. Under
// systemd, SliceUnit of the result is the tier's unit name
// ("kubepods-understory_batch.slice", "kubelet-kubepods-understory_batch.slice").
//
// name must be a valid tier name (see validTierName): a single safe component
// without '_', without "pod" in any case, and none of kubelet's own names.
func (n Naming) TierPathIn(q KubeQOS, name string) (string, error) {
	if err := validTierName(name); err != nil {
		return "", err
	}
	return n.childPath(q, name)
}

// validTierName checks a tier name. '_' is refused because kubelet's systemd
// escaping maps '-' to '_' and the slice would not parse back to the name.
// "pod" in any case is refused because kubelet's orphan cleanup takes every
// child of a QoS cgroup (kubepods included) whose name contains "pod" for a
// pod cgroup, splits the name on "pod" to find a UID, and deletes it when no
// such pod exists. kubelet's own component names are refused because a tier
// named "besteffort" below kubepods would be kubelet's BestEffort cgroup.
func validTierName(name string) error {
	if err := validName(name); err != nil {
		return fmt.Errorf("tier name %q: %w", name, err)
	}
	if strings.Contains(name, "_") {
		return fmt.Errorf("tier name %q: '_' does not survive kubelet's systemd name escaping: %w", name, ErrInvalidPath)
	}
	if strings.Contains(strings.ToLower(name), podPrefix) {
		return fmt.Errorf("tier name %q: kubelet would take a child of a QoS cgroup whose name contains %q for an orphaned pod and delete it: %w", name, podPrefix, ErrInvalidPath)
	}
	switch name {
	case kubepodsName, burstableName, besteffort:
		return fmt.Errorf("tier name %q is one of kubelet's own cgroups: %w", name, ErrInvalidPath)
	}
	return nil
}

// TierPodPath returns the cgroup of a batch pod below the tier, where the NRI
// plugin has the runtime create the pod's containers. tier is the tier's path
// as Naming.TierPathIn returns it, kubelet's --cgroup-root included: cgroupfs
// "<tier>/pod<uid>", systemd "<tier>/<tier unit>-pod<uid_>.slice" (e.g.
// ".../kubepods-besteffort-understory_batch.slice/kubepods-besteffort-understory_batch-pod<uid_>.slice",
// or "kubelet-kubepods-understory_batch-pod<uid_>.slice" below kind's root: the
// name runc expands the runtime's slice to). The UID is checked as PodPath
// checks it; a systemd tier that is no slice, or a pod unit name longer than
// NAME_MAX, is ErrInvalidPath.
func TierPodPath(d Driver, tier, uid string) (string, error) {
	if err := validName(uid); err != nil {
		return "", fmt.Errorf("pod uid %q: %w", uid, err)
	}
	if _, err := CleanPath(tier); err != nil {
		return "", fmt.Errorf("tier: %w", err)
	}
	switch d {
	case DriverCgroupfs:
		return tier + "/" + podPrefix + uid, nil
	case DriverSystemd:
		if _, err := SliceUnit(tier); err != nil {
			return "", fmt.Errorf("tier: %w", err)
		}
		unit := childUnit(tier, podPrefix+uid)
		if !validUnit(unit) {
			return "", fmt.Errorf("slice name %q is longer than %d bytes: %w", clip(unit), nameMax, ErrInvalidPath)
		}
		return tier + "/" + unit, nil
	}
	return "", fmt.Errorf("naming cgroup with driver %q: %w", d, ErrInvalidDriver)
}

// SliceUnit returns the systemd unit name of a slice path (its last
// component), e.g. "kubepods-besteffort-understory_batch.slice" for the tier
// Naming{Driver: DriverSystemd}.TierPathIn(QOSBestEffort, DefaultTierName)
// returns, and
// "kubepods-besteffort-understory_batch-pod<uid_>.slice" for a pod below it
// (TierPodPath). SlicePath is its inverse. A path that is not clean or whose
// last component is no slice unit is ErrInvalidPath.
func SliceUnit(rel string) (string, error) {
	if _, err := CleanPath(rel); err != nil {
		return "", err
	}
	unit := path.Base(rel)
	if _, err := SlicePath(unit); err != nil {
		return "", err
	}
	return unit, nil
}

// SlicePath returns the path systemd (and runc) give slice unit "a-b-c.slice":
// "a.slice/a-b.slice/a-b-c.slice"; "-.slice" is the root slice ("" here). The
// name must be a safe name ending in ".slice" whose '-'-separated parts are not
// empty; anything else is ErrInvalidPath.
func SlicePath(unit string) (string, error) {
	if unit == "-"+sliceSuffix {
		return "", nil
	}
	base, ok := strings.CutSuffix(unit, sliceSuffix)
	if !ok || !validUnit(unit) || base == "" {
		return "", fmt.Errorf("%q is no slice unit name: %w", clip(unit), ErrInvalidPath)
	}
	parts := strings.Split(base, "-")
	dirs := make([]string, len(parts))
	for i, p := range parts {
		if p == "" {
			return "", fmt.Errorf("slice unit %q has an empty part: %w", clip(unit), ErrInvalidPath)
		}
		dirs[i] = strings.Join(parts[:i+1], "-") + sliceSuffix
	}
	return strings.Join(dirs, "/"), nil
}

// ContainerCgroupsPath returns the cgroups path a container runtime hands to
// runc (OCI linux.cgroupsPath) for container id in the pod cgroup podCgroup (as
// PodPath or TierPodPath return it, relative to the hierarchy root): cgroupfs
// "/<podCgroup>/<id>" ("/kubepods/besteffort/pod<uid>/<id>"); systemd
// "<pod slice unit>:<prefix>:<id>" ("kubepods-besteffort-pod<uid_>.slice:cri-containerd:<id>",
// as containerd with SystemdCgroup=true gives it; runc makes
// "<prefix>-<id>.scope" in the slice). prefix is unused under cgroupfs.
func ContainerCgroupsPath(d Driver, podCgroup, prefix, id string) (string, error) {
	if _, err := CleanPath(podCgroup); err != nil {
		return "", fmt.Errorf("pod cgroup: %w", err)
	}
	if err := validName(id); err != nil {
		return "", fmt.Errorf("container id %q: %w", id, err)
	}
	switch d {
	case DriverCgroupfs:
		return "/" + podCgroup + "/" + id, nil
	case DriverSystemd:
		unit, err := SliceUnit(podCgroup)
		if err != nil {
			return "", fmt.Errorf("pod cgroup: %w", err)
		}
		if err := validName(prefix); err != nil {
			return "", fmt.Errorf("runtime prefix %q: %w", prefix, ErrInvalidPath)
		}
		return unit + ":" + prefix + ":" + id, nil
	}
	return "", fmt.Errorf("naming cgroup with driver %q: %w", d, ErrInvalidDriver)
}

// RuntimeCgroupsPath is a container's cgroups path as the runtime hands it to
// runc, split (see ContainerCgroupsPath).
type RuntimeCgroupsPath struct {
	// Parent is the pod cgroup: cgroupfs its path relative to the hierarchy root,
	// systemd its slice unit name.
	Parent string
	// Prefix is the runtime's scope prefix (systemd; "" under cgroupfs).
	Prefix string
	// ID is the container's cgroup name below the pod (its ID).
	ID string
}

// ParseContainerCgroupsPath splits a runtime's container cgroups path for
// driver d: cgroupfs an absolute clean path "/<pod cgroup>/<id>", systemd
// "<slice unit>:<prefix>:<id>". Every part must be a safe name; anything else
// is ErrInvalidPath.
func ParseContainerCgroupsPath(d Driver, s string) (RuntimeCgroupsPath, error) {
	switch d {
	case DriverCgroupfs:
		rel, ok := strings.CutPrefix(s, "/")
		if !ok {
			return RuntimeCgroupsPath{}, fmt.Errorf("cgroupfs cgroups path %q is not absolute: %w", clip(s), ErrInvalidPath)
		}
		if _, err := CleanPath(rel); err != nil {
			return RuntimeCgroupsPath{}, err
		}
		parent, id := path.Split(rel)
		if parent == "" || validName(id) != nil {
			return RuntimeCgroupsPath{}, fmt.Errorf("cgroupfs cgroups path %q has no pod cgroup and container: %w", clip(s), ErrInvalidPath)
		}
		return RuntimeCgroupsPath{Parent: strings.TrimSuffix(parent, "/"), ID: id}, nil
	case DriverSystemd:
		parts := strings.Split(s, ":")
		if len(parts) != 3 {
			return RuntimeCgroupsPath{}, fmt.Errorf("systemd cgroups path %q is not <slice>:<prefix>:<name>: %w", clip(s), ErrInvalidPath)
		}
		if _, err := SlicePath(parts[0]); err != nil {
			return RuntimeCgroupsPath{}, err
		}
		for _, p := range parts[1:] {
			if validName(p) != nil {
				return RuntimeCgroupsPath{}, fmt.Errorf("systemd cgroups path %q has an unsafe part %q: %w", clip(s), clip(p), ErrInvalidPath)
			}
		}
		return RuntimeCgroupsPath{Parent: parts[0], Prefix: parts[1], ID: parts[2]}, nil
	}
	return RuntimeCgroupsPath{}, fmt.Errorf("parsing cgroups path with driver %q: %w", d, ErrInvalidDriver)
}

// PodCgroup is what a cgroup path says of a pod: where kubelet (or the agent's
// tier) put its cgroup, its UID and, below it, the container.
type PodCgroup struct {
	// Driver is the naming the path uses.
	Driver Driver
	// QOS is kubelet's QoS cgroup the pod cgroup (or the tier holding it) sits
	// in; 0 when the path hides it (a path relative to another cgroup namespace).
	QOS KubeQOS
	// Tier is the name of the agent's tier the pod cgroup sits in; "" when the
	// pod cgroup is kubelet's own.
	Tier string
	// UID is the pod's UID ('-' restored under systemd).
	UID string
	// ContainerID is the runtime's container ID, without the runtime's prefix,
	// when the path goes on into a container's cgroup ("" when it stops at the
	// pod, or goes on into another group such as cri-o's conmon).
	ContainerID string
}

// maxCgroupPathLen is PATH_MAX: the kernel shows no longer cgroup path.
const maxCgroupPathLen = 4096

// ParseCgroupPath finds the pod cgroup in an absolute cgroup path, as one line of
// /proc/<pid>/cgroup shows it (its " (deleted)" suffix already removed). It
// searches from the root down for the first, outermost pod cgroup (a nested one
// belongs to a kubelet running inside a pod):
//
//	cgroupfs  .../kubepods[/<burstable|besteffort>][/<tier>]/pod<uid>
//	systemd   <chain>-pod<uid_>.slice inside <chain>.slice, where the chain is
//	          [<root>-]kubepods[-<burstable|besteffort>][-<tier_>]
//
// where <tier> is any valid tier name (see TierPathIn). The component after it
// is the container when named as the driver's runtimes name one: cgroupfs
// "<id>" or "crio-<id>", systemd "<prefix>-<id>.scope", with a hex ID.
//
// A path shown relative to the reader's cgroup namespace ("/../../besteffort/...")
// has its leading ".." dropped: the hidden ancestors are taken to be the ones a
// valid path would have. A path without a pod cgroup is ErrNotPodCgroup; one that
// is not absolute, has "." or ".." inside, control bytes or is longer than
// PATH_MAX is ErrInvalidPath.
func ParseCgroupPath(p string) (PodCgroup, error) {
	comps, hidden, err := splitCgroupPath(p)
	if err != nil {
		return PodCgroup{}, err
	}
	for i := range comps {
		pc, ok := podAt(comps, i, hidden)
		if !ok {
			continue
		}
		if i+1 < len(comps) {
			pc.ContainerID = containerIDOf(pc.Driver, comps[i+1])
		}
		return pc, nil
	}
	return PodCgroup{}, fmt.Errorf("cgroup path %q: %w", clip(p), ErrNotPodCgroup)
}

// splitCgroupPath checks an absolute cgroup path from outside input and splits it
// into its components; hidden reports leading ".." (ancestors outside the
// reader's cgroup namespace), which are dropped.
func splitCgroupPath(p string) (comps []string, hidden bool, err error) {
	if len(p) > maxCgroupPathLen {
		return nil, false, fmt.Errorf("cgroup path longer than %d bytes: %w", maxCgroupPathLen, ErrInvalidPath)
	}
	if !strings.HasPrefix(p, "/") {
		return nil, false, fmt.Errorf("cgroup path %q is not absolute: %w", clip(p), ErrInvalidPath)
	}
	for i := 0; i < len(p); i++ {
		if c := p[i]; c < 0x20 || c == 0x7f {
			return nil, false, fmt.Errorf("cgroup path has control byte %#x at %d: %w", c, i, ErrInvalidPath)
		}
	}
	comps = make([]string, 0, 8)
	for c := range strings.SplitSeq(p, "/") {
		switch {
		case c == "":
		case c == ".." && len(comps) == 0:
			hidden = true
		case c == "." || c == "..":
			return nil, false, fmt.Errorf("cgroup path %q has a %q component: %w", clip(p), c, ErrInvalidPath)
		default:
			comps = append(comps, c)
		}
	}
	return comps, hidden, nil
}

// ParsePodCgroupParent reads the cgroup parent kubelet gives a pod sandbox
// through the CRI: cgroupfs the pod cgroup's absolute path
// ("/kubepods/burstable/pod<uid>"), systemd its slice unit name
// ("kubepods-burstable-pod<uid_>.slice"). The pod cgroup must be the parent's
// last component. Anything else is ErrNotPodCgroup or ErrInvalidPath.
func ParsePodCgroupParent(parent string) (PodCgroup, error) {
	if strings.HasPrefix(parent, "/") {
		comps, hidden, err := splitCgroupPath(parent)
		if err != nil {
			return PodCgroup{}, err
		}
		if hidden || len(comps) == 0 {
			return PodCgroup{}, fmt.Errorf("cgroup parent %q: %w", clip(parent), ErrNotPodCgroup)
		}
		pc, ok := podAt(comps, len(comps)-1, false)
		if !ok || pc.Driver != DriverCgroupfs {
			return PodCgroup{}, fmt.Errorf("cgroup parent %q does not end in a cgroupfs pod cgroup: %w", clip(parent), ErrNotPodCgroup)
		}
		return pc, nil
	}
	if _, err := SlicePath(parent); err != nil {
		return PodCgroup{}, err
	}
	pc, ok := systemdPod(parent)
	if !ok {
		return PodCgroup{}, fmt.Errorf("cgroup parent %q: %w", clip(parent), ErrNotPodCgroup)
	}
	return pc, nil
}

// PodUIDFromDir returns the pod UID in the name of a pod cgroup kubelet made below the
// QoS-level cgroup of q (the last path component, as PodPath builds it): cgroupfs
// "pod<uid>", systemd "<chain of q>-pod<uid_>.slice" (e.g.
// "kubelet-kubepods-besteffort-pod<uid_>.slice" below kind's root) with '_' turned
// back into '-'. ok is false for any other name (the agent's tier, a runtime's own
// groups) and for an invalid driver or root.
func (n Naming) PodUIDFromDir(q KubeQOS, name string) (uid string, ok bool) {
	parent := n.QOSPath(q)
	if parent == "" {
		return "", false
	}
	comps := append(strings.Split(parent, "/"), name)
	pc, ok := podAt(comps, len(comps)-1, false)
	if !ok || pc.Driver != n.Driver || pc.QOS != q || pc.Tier != "" {
		return "", false
	}
	return pc.UID, true
}

// podAt reports whether comps[i] is a pod cgroup, with what it says of the pod.
// hidden: comps[0]'s ancestors are outside the reader's cgroup namespace.
func podAt(comps []string, i int, hidden bool) (PodCgroup, bool) {
	c := comps[i]
	if strings.HasSuffix(c, sliceSuffix) {
		pc, ok := systemdPod(c)
		if !ok {
			return PodCgroup{}, false
		}
		// kubelet's chain: the pod's slice sits in its parent's slice.
		if i > 0 {
			parent, _ := strings.CutSuffix(c, "-"+podPrefix+escapeUnit(pc.UID)+sliceSuffix)
			if comps[i-1] != parent+sliceSuffix {
				return PodCgroup{}, false
			}
		} else if !hidden {
			return PodCgroup{}, false
		}
		return pc, true
	}
	uid, ok := strings.CutPrefix(c, podPrefix)
	if !ok || !validUID(uid, '-') {
		return PodCgroup{}, false
	}
	pc := PodCgroup{Driver: DriverCgroupfs, UID: uid}
	// anc(k) is the k-th ancestor of comps[i], "" when hidden, and ok=false when
	// the path has no such component.
	anc := func(k int) (string, bool) {
		if i-k >= 0 {
			return comps[i-k], true
		}
		return "", hidden
	}
	parent, ok := anc(1)
	switch {
	case !ok:
		return PodCgroup{}, false
	case parent == "":
		return pc, true // everything above the pod is hidden
	case parent == kubepodsName:
		pc.QOS = QOSGuaranteed
		return pc, true
	case parent == burstableName || parent == besteffort:
		if g, ok := anc(2); !ok || (g != "" && g != kubepodsName) {
			return PodCgroup{}, false
		}
		pc.QOS = QOSBurstable
		if parent == besteffort {
			pc.QOS = QOSBestEffort
		}
		return pc, true
	case validTierName(parent) == nil:
		pc.Tier = parent
		g, ok := anc(2)
		switch {
		case !ok:
			return PodCgroup{}, false
		case g == kubepodsName:
			pc.QOS = QOSGuaranteed
		case g == burstableName || g == besteffort:
			if gg, ok := anc(3); !ok || (gg != "" && gg != kubepodsName) {
				return PodCgroup{}, false
			}
			pc.QOS = QOSBurstable
			if g == besteffort {
				pc.QOS = QOSBestEffort
			}
		case g != "":
			return PodCgroup{}, false
		}
		return pc, true
	}
	return PodCgroup{}, false
}

// systemdPod reads a pod's slice unit name, "<chain>-pod<uid_>.slice", whose
// chain is [<root parts>-]kubepods[-<burstable|besteffort>][-<tier_>].
// The caller has checked unit's bytes (SlicePath or a path's components).
func systemdPod(unit string) (PodCgroup, bool) {
	base, ok := strings.CutSuffix(unit, sliceSuffix)
	if !ok {
		return PodCgroup{}, false
	}
	// The escaped UID has no '-', so the last "-pod" ends the chain.
	j := strings.LastIndex(base, "-"+podPrefix)
	if j <= 0 {
		return PodCgroup{}, false
	}
	chain, escaped := base[:j], base[j+len("-"+podPrefix):]
	if !validUID(escaped, '_') {
		return PodCgroup{}, false
	}
	parts := strings.Split(chain, "-")
	k := -1
	for n, part := range parts {
		if part == "" {
			return PodCgroup{}, false
		}
		if part == kubepodsName {
			k = n
		}
	}
	if k < 0 {
		return PodCgroup{}, false
	}
	pc := PodCgroup{Driver: DriverSystemd, QOS: QOSGuaranteed, UID: strings.ReplaceAll(escaped, "_", "-")}
	tail := parts[k+1:]
	if len(tail) > 0 {
		switch tail[0] {
		case burstableName:
			pc.QOS, tail = QOSBurstable, tail[1:]
		case besteffort:
			pc.QOS, tail = QOSBestEffort, tail[1:]
		}
	}
	switch len(tail) {
	case 0:
	case 1:
		name := strings.ReplaceAll(tail[0], "_", "-")
		if validTierName(name) != nil {
			return PodCgroup{}, false
		}
		pc.Tier = name
	default:
		return PodCgroup{}, false
	}
	return pc, true
}

// containerIDOf returns the container ID in the name c of a pod cgroup's child,
// or "" when c is not a container's cgroup (conmon's "crio-conmon-<id>.scope",
// a runtime's own group).
func containerIDOf(d Driver, c string) string {
	id := c
	if d == DriverSystemd {
		scope, ok := strings.CutSuffix(c, scopeSuffix)
		if !ok {
			return ""
		}
		id = ""
		for _, p := range runtimeScopePrefixes {
			if rest, ok := strings.CutPrefix(scope, p+"-"); ok {
				id = rest
				break
			}
		}
	} else if rest, ok := strings.CutPrefix(c, "crio-"); ok {
		id = rest
	}
	if !validContainerID(id) {
		return ""
	}
	return id
}

// validUnit: a systemd unit name of 1..NAME_MAX bytes of [A-Za-z0-9._-], not
// starting with '.', no "..": kubelet's and runc's slices, never a path.
func validUnit(s string) bool {
	if s == "" || len(s) > nameMax || s[0] == '.' || strings.Contains(s, "..") {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.':
		default:
			return false
		}
	}
	return true
}

// validContainerID: 1..MaxNameLen lowercase hex digits (runtimes use 64).
func validContainerID(id string) bool {
	if id == "" || len(id) > MaxNameLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if b := id[i]; !(b >= '0' && b <= '9' || b >= 'a' && b <= 'f') {
			return false
		}
	}
	return true
}

// validUID: 1..MaxNameLen bytes of [A-Za-z0-9] and sep, the form a pod UID takes
// in a cgroup name ('-' for cgroupfs, '_' for systemd). Kubernetes UIDs are
// lowercase UUIDs; static pods' are hex hashes.
func validUID(s string, sep byte) bool {
	if s == "" || len(s) > MaxNameLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == sep:
		default:
			return false
		}
	}
	return true
}

// clip shortens outside input quoted in an error.
func clip(s string) string {
	const most = 80
	if len(s) > most {
		return s[:most] + "..."
	}
	return s
}
