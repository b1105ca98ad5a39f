//go:build !cgo

package dashboards

import (
	"context"
	"testing"

	"github.com/understory/understory/cgroups"
)

// haveGPUNode: without cgo there is no go-nvml mock, hence no GPU node.
const haveGPUNode = false

type gpuNode struct{}

func startGPUNode(context.Context, *testing.T, *cgroups.Hierarchy, string) *gpuNode { return nil }
func (*gpuNode) lsLoad(bool)                                                        {}
func (*gpuNode) addr() string                                                       { return "" }
