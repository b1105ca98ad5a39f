package cgroups

import (
	"fmt"
	"path/filepath"
	"strings"
)

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
// cgroup lives under. The zero value is invalid on purpose.
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
	podPrefix     = "pod"
	burstableName = "burstable"
	besteffort    = "besteffort"
)

// qosComponent returns kubelet's internal name component of q ("" for
// Guaranteed, whose pods live directly under kubepods) and ok=false for an
// invalid class.
func qosComponent(q KubeQOS) (string, bool) {
	switch q {
	case QOSGuaranteed:
		return "", true
	case QOSBurstable:
		return burstableName, true
	case QOSBestEffort:
		return besteffort, true
	}
	return "", false
}

// QOSPath returns the relative path of kubelet's QoS-level cgroup:
// cgroupfs "kubepods", "kubepods/burstable", "kubepods/besteffort";
// systemd "kubepods.slice", "kubepods.slice/kubepods-burstable.slice",
// "kubepods.slice/kubepods-besteffort.slice". It returns "" for an invalid
// driver or class. These cgroups are kubelet's: never write their files.
func QOSPath(d Driver, q KubeQOS) string {
	c, ok := qosComponent(q)
	if !ok {
		return ""
	}
	switch d {
	case DriverCgroupfs:
		if c == "" {
			return kubepodsName
		}
		return kubepodsName + "/" + c
	case DriverSystemd:
		if c == "" {
			return kubepodsName + sliceSuffix
		}
		return kubepodsName + sliceSuffix + "/" + kubepodsName + "-" + c + sliceSuffix
	}
	return ""
}

// childPath names a child component of the QoS-level cgroup the way kubelet
// names its own children: cgroupfs appends the component; systemd builds a
// slice whose name is the '-'-joined chain of (escaped) ancestor components,
// where escaping replaces '-' by '_' exactly as kubelet does.
func childPath(d Driver, q KubeQOS, component string) (string, error) {
	c, ok := qosComponent(q)
	if !ok {
		return "", fmt.Errorf("naming cgroup under QoS class %v: %w", q, ErrInvalidValue)
	}
	parent := QOSPath(d, q)
	switch d {
	case DriverCgroupfs:
		return parent + "/" + component, nil
	case DriverSystemd:
		prefix := kubepodsName + "-"
		if c != "" {
			prefix += c + "-"
		}
		return parent + "/" + prefix + strings.ReplaceAll(component, "-", "_") + sliceSuffix, nil
	}
	return "", fmt.Errorf("naming cgroup with driver %q: %w", d, ErrInvalidDriver)
}

// PodPath returns the relative path kubelet gives the pod cgroup of a pod
// with the given UID and QoS class, e.g. cgroupfs "kubepods/burstable/pod<uid>"
// or systemd "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice"
// (uid_ has '-' replaced by '_'). The UID must be a single safe name
// (see validName); anything else is ErrInvalidPath, so a UID can never
// escape the cgroup root.
func PodPath(d Driver, q KubeQOS, uid string) (string, error) {
	if err := validName(uid); err != nil {
		return "", fmt.Errorf("pod uid %q: %w", uid, err)
	}
	return childPath(d, q, podPrefix+uid)
}

// TierPath returns the relative path of the agent-owned batch tier below
// kubelet's BestEffort cgroup: cgroupfs "kubepods/besteffort/<name>",
// systemd "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-<name_>.slice".
// It is TierPathIn(d, QOSBestEffort, name).
func TierPath(d Driver, name string) (string, error) {
	return TierPathIn(d, QOSBestEffort, name)
}

// TierPathIn returns the relative path of the agent-owned batch tier as a child
// of kubelet's QoS-level cgroup for q: QOSGuaranteed means kubepods itself
// (cgroupfs "kubepods/<name>", systemd "kubepods.slice/kubepods-<name_>.slice"),
// QOSBestEffort "kubepods/besteffort/<name>". name_ is escaped like kubelet
// escapes its components ('-' -> '_'), so that kubelet parses the slice back
// to exactly one component <name>.
//
// name must be a single safe component without '_' (kubelet forbids '_' in
// its internal names because systemd escaping maps '-' to '_'; a name with
// '_' would not round-trip), and must not contain "pod" in any case:
// kubelet's orphan cleanup takes every child of a QoS cgroup (kubepods
// included) whose name contains "pod" for a pod cgroup, splits the name on
// "pod" to find a UID, and deletes it when no such pod exists.
func TierPathIn(d Driver, q KubeQOS, name string) (string, error) {
	if err := validName(name); err != nil {
		return "", fmt.Errorf("tier name %q: %w", name, err)
	}
	if strings.Contains(name, "_") {
		return "", fmt.Errorf("tier name %q: '_' does not survive kubelet's systemd name escaping: %w", name, ErrInvalidPath)
	}
	if strings.Contains(strings.ToLower(name), podPrefix) {
		return "", fmt.Errorf("tier name %q: kubelet would take a child of a QoS cgroup whose name contains %q for an orphaned pod and delete it: %w", name, podPrefix, ErrInvalidPath)
	}
	return childPath(d, q, name)
}

// validName checks a single path component taken from outside input (pod
// UID, tier name): 1..MaxNameLen bytes of [A-Za-z0-9._-], not starting with
// '.', no "..".
func validName(s string) error {
	if s == "" {
		return fmt.Errorf("empty name: %w", ErrInvalidPath)
	}
	if len(s) > MaxNameLen {
		return fmt.Errorf("name longer than %d bytes: %w", MaxNameLen, ErrInvalidPath)
	}
	if s[0] == '.' || strings.Contains(s, "..") {
		return fmt.Errorf("name starts with '.' or contains \"..\": %w", ErrInvalidPath)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.':
		default:
			return fmt.Errorf("byte %q at %d is outside [A-Za-z0-9._-]: %w", c, i, ErrInvalidPath)
		}
	}
	return nil
}

// maxPathLen is PATH_MAX minus room for the root and a control-file name.
const maxPathLen = 3072

// nameMax is the kernel's NAME_MAX for one component.
const nameMax = 255

// CleanPath validates a relative cgroup path taken from outside input and
// returns it unchanged: it must be non-empty, relative, made of non-empty
// components that are neither "." nor "..", free of NUL and control bytes,
// each component at most 255 bytes, and equal to its filepath.Clean form (so
// it stays inside the root it is joined to). Anything else is ErrInvalidPath.
func CleanPath(rel string) (string, error) {
	if rel == "" {
		return "", fmt.Errorf("empty cgroup path: %w", ErrInvalidPath)
	}
	if len(rel) > maxPathLen {
		return "", fmt.Errorf("cgroup path longer than %d bytes: %w", maxPathLen, ErrInvalidPath)
	}
	if filepath.IsAbs(rel) {
		return "", fmt.Errorf("cgroup path %q is absolute: %w", rel, ErrInvalidPath)
	}
	for i := 0; i < len(rel); i++ {
		if c := rel[i]; c < 0x20 || c == 0x7f {
			return "", fmt.Errorf("cgroup path %q has control byte %#x at %d: %w", rel, c, i, ErrInvalidPath)
		}
	}
	for _, comp := range strings.Split(rel, "/") {
		switch {
		case comp == "":
			return "", fmt.Errorf("cgroup path %q has an empty component: %w", rel, ErrInvalidPath)
		case comp == "." || comp == "..":
			return "", fmt.Errorf("cgroup path %q has a %q component: %w", rel, comp, ErrInvalidPath)
		case len(comp) > nameMax:
			return "", fmt.Errorf("cgroup path %q has a component longer than %d bytes: %w", rel, nameMax, ErrInvalidPath)
		}
	}
	clean := filepath.Clean(rel)
	if clean != rel || !filepath.IsLocal(clean) {
		return "", fmt.Errorf("cgroup path %q is not clean: %w", rel, ErrInvalidPath)
	}
	return clean, nil
}

// PodUIDFromDir returns the pod UID in the name of a pod cgroup kubelet made below the
// QoS-level cgroup of q (the last path component, as PodPath builds it): cgroupfs
// "pod<uid>", systemd "kubepods[-<qos>]-pod<uid_>.slice" with '_' turned back into
// '-'. ok is false for any other name (the agent's tier, a runtime's own groups).
func PodUIDFromDir(d Driver, q KubeQOS, name string) (uid string, ok bool) {
	c, valid := qosComponent(q)
	if !valid {
		return "", false
	}
	switch d {
	case DriverCgroupfs:
		uid, ok = strings.CutPrefix(name, podPrefix)
	case DriverSystemd:
		prefix := kubepodsName + "-"
		if c != "" {
			prefix += c + "-"
		}
		var rest string
		if rest, ok = strings.CutPrefix(name, prefix+podPrefix); ok {
			rest, ok = strings.CutSuffix(rest, sliceSuffix)
			uid = strings.ReplaceAll(rest, "_", "-")
		}
	}
	if !ok || validName(uid) != nil {
		return "", false
	}
	return uid, true
}
