package koordlet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"strings"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/understory/understory/cgroups"
	"github.com/understory/understory/qos"
)

// NRIPlugin is the agent's NRI plugin (mode nri): at container creation it moves the
// containers of batch pods below the agent's tier, so that the tier's single quota,
// weight and SCHED_IDLE bound all batch work at once. Other containers are untouched.
type NRIPlugin struct {
	layout layout
	log    *slog.Logger
}

var _ stub.CreateContainerInterface = (*NRIPlugin)(nil)

// NewNRIPlugin returns the plugin for cfg's driver, kubelet root and tier.
func NewNRIPlugin(cfg Config, log *slog.Logger) (*NRIPlugin, error) {
	l, err := newLayout(cfg)
	if err != nil {
		return nil, err
	}
	return &NRIPlugin{layout: l, log: log}, nil
}

// CreateContainer rewrites the cgroups path of batch containers.
func (p *NRIPlugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	orig := ctr.GetLinux().GetCgroupsPath()
	kpod := podFromNRI(pod)
	class, err := qos.Classify(kpod)
	if err != nil {
		p.log.Warn("invalid QoS annotation; container left where kubelet put it", "pod", pod.GetNamespace()+"/"+pod.GetName(), "err", err)
	}
	if class != qos.ClassBatch || orig == "" {
		return nil, nil, nil
	}
	newPath, err := tierContainerPath(p.layout.driver, p.layout.tier, pod.GetUid(), orig)
	if err != nil {
		// Fail open: a container that cannot be moved still runs, under kubelet's limits.
		p.log.Error("cannot place batch container below the tier", "pod", pod.GetNamespace()+"/"+pod.GetName(), "container", ctr.GetName(), "err", err)
		return nil, nil, nil
	}
	adj := &api.ContainerAdjustment{}
	adj.SetLinuxCgroupsPath(newPath)
	p.log.Info("batch container placed below the tier", "pod", pod.GetNamespace()+"/"+pod.GetName(), "container", ctr.GetName(), "cgroupsPath", newPath)
	return adj, nil, nil
}

// Run connects to the runtime's NRI socket and serves until ctx ends, reconnecting
// (with backoff) when the runtime restarts.
func (p *NRIPlugin) Run(ctx context.Context, socket string) error {
	backoff := time.Second
	for {
		s, err := stub.New(p, stub.WithPluginName("understory"), stub.WithPluginIdx("50"), stub.WithSocketPath(socket))
		if err != nil {
			return fmt.Errorf("creating NRI stub: %w", err)
		}
		err = s.Run(ctx)
		if ctx.Err() != nil {
			return nil
		}
		p.log.Warn("NRI connection ended; reconnecting", "socket", socket, "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// podFromNRI builds the fields of a Pod that classification reads. NRI does not carry
// the Kubernetes QoS class; kubelet's cgroup parent tells it.
func podFromNRI(pod *api.PodSandbox) *corev1.Pod {
	q := corev1.PodQOSGuaranteed
	parent := pod.GetLinux().GetCgroupParent()
	switch {
	case strings.Contains(parent, "besteffort"):
		q = corev1.PodQOSBestEffort
	case strings.Contains(parent, "burstable"):
		q = corev1.PodQOSBurstable
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: pod.GetName(), Namespace: pod.GetNamespace(), UID: types.UID(pod.GetUid()),
			Annotations: pod.GetAnnotations(), Labels: pod.GetLabels()},
		Status: corev1.PodStatus{QOSClass: q},
	}
}

// errBadCgroupsPath means the runtime gave a container cgroups path of an unknown form.
var errBadCgroupsPath = errors.New("unrecognised container cgroups path")

// nriPodCgroup is a batch pod's cgroup below the tier, relative to the hierarchy root:
// cgroupfs "<tier>/pod<uid>", systemd "<tier dir>/<tier unit>-pod<uid_>.slice".
func nriPodCgroup(d cgroups.Driver, tier, uid string) (string, error) {
	// PodPath validates the UID as kubelet-safe; its name is reused below the tier.
	kubelet, err := cgroups.PodPath(d, cgroups.QOSBestEffort, uid)
	if err != nil {
		return "", err
	}
	if d == cgroups.DriverSystemd {
		unit := strings.TrimSuffix(path.Base(tier), ".slice")
		// kubelet's unit is "kubepods-besteffort-pod<uid_>.slice"; keep its "pod<uid_>.slice".
		podUnit := strings.TrimPrefix(path.Base(kubelet), "kubepods-besteffort-")
		return path.Join(tier, unit+"-"+podUnit), nil
	}
	return path.Join(tier, path.Base(kubelet)), nil
}

// tierContainerPath rewrites a container's runtime cgroups path to put it below the tier.
// cgroupfs paths look like "/kubepods/besteffort/pod<uid>/<id>"; systemd ones like
// "kubepods-besteffort-pod<uid_>.slice:cri-containerd:<id>".
func tierContainerPath(d cgroups.Driver, tier, uid, orig string) (string, error) {
	podCg, err := nriPodCgroup(d, tier, uid)
	if err != nil {
		return "", err
	}
	if d == cgroups.DriverSystemd {
		parts := strings.SplitN(orig, ":", 3)
		if len(parts) != 3 || parts[1] == "" || parts[2] == "" {
			return "", fmt.Errorf("%q: %w", orig, errBadCgroupsPath)
		}
		return path.Base(podCg) + ":" + parts[1] + ":" + parts[2], nil
	}
	id := path.Base(orig)
	if !strings.HasPrefix(orig, "/") || id == "/" || id == "." || strings.Contains(orig, "..") {
		return "", fmt.Errorf("%q: %w", orig, errBadCgroupsPath)
	}
	return "/" + path.Join(podCg, id), nil
}
