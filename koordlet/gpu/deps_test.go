//go:build cgo

package gpu

// Keeps the GPU room's dependencies in go.mod until the code that uses them lands
// (delete this file then).
import (
	_ "github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	_ "k8s.io/kubelet/pkg/apis/podresources/v1"
)
