package gpu

// Keeps k8s.io/kubelet (the PodResources API, used by the GPU room's device code) in
// go.mod until that code lands; delete this file then.
import (
	_ "k8s.io/kubelet/pkg/apis/podresources/v1"
)
