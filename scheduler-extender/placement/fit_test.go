package placement

import (
	"errors"
	"slices"
	"testing"

	"github.com/understory/understory/contract"
)

// testNode is an empty node with gpus devices of the model.
func placeNode(name, model string, cpu int64, gpus int) *Node {
	n := &Node{Name: name, Model: model, CPUMilli: cpu, MemoryMiB: 1 << 20, MaxPods: 110, GPUFree: make([]int, gpus)}
	for i := range n.GPUFree {
		n.GPUFree[i] = contract.MilliPerGPU
	}
	return n
}

func TestFit(t *testing.T) {
	t.Parallel()
	used := func(n *Node, free ...int) *Node { copy(n.GPUFree, free); return n }
	tests := []struct {
		name string
		node *Node
		req  Request
		want error
	}{
		{"cpu only fits", placeNode("a", "", 4000, 0), Request{CPUMilli: 4000, MemoryMiB: 10}, nil},
		{"zero cpu fits a full node", func() *Node { n := placeNode("a", "", 4000, 0); n.UsedCPUMilli = 4000; return n }(), Request{}, nil},
		{"cpu short", placeNode("a", "", 4000, 0), Request{CPUMilli: 4001}, ErrInsufficientCPU},
		{"memory short", placeNode("a", "", 4000, 0), Request{MemoryMiB: 1<<20 + 1}, ErrInsufficientMemory},
		{"pods full", func() *Node { n := placeNode("a", "", 4000, 0); n.Pods = 110; return n }(), Request{}, ErrTooManyPods},
		{"no pod limit", func() *Node { n := placeNode("a", "", 4000, 0); n.MaxPods, n.Pods = 0, 5000; return n }(), Request{}, nil},
		{"gpu on cpu node", placeNode("a", "", 4000, 0), Request{NumGPU: 1, GPUMilli: 500}, ErrInsufficientGPU},
		{"whole gpus fit", placeNode("a", "T4", 4000, 2), Request{NumGPU: 2, GPUMilli: 1000}, nil},
		{"whole gpus need fully free devices", used(placeNode("a", "T4", 4000, 2), 1000, 999), Request{NumGPU: 2, GPUMilli: 1000}, ErrInsufficientGPU},
		{"share fits a used device", used(placeNode("a", "T4", 4000, 2), 0, 300), Request{NumGPU: 1, GPUMilli: 300}, nil},
		{"share too big", used(placeNode("a", "T4", 4000, 2), 0, 299), Request{NumGPU: 1, GPUMilli: 300}, ErrInsufficientGPU},
		{"model accepted", placeNode("a", "T4", 4000, 1), Request{NumGPU: 1, GPUMilli: 1000, Models: []string{"V100", "T4"}}, nil},
		{"model refused", placeNode("a", "T4", 4000, 1), Request{NumGPU: 1, GPUMilli: 1000, Models: []string{"V100"}}, ErrGPUModel},
		{"batch cpu short", func() *Node { n := placeNode("a", "", 4000, 0); n.BatchCPUMilli = 1000; return n }(), Request{BatchCPUMilli: 1001}, ErrInsufficientBatch},
		{"batch memory fits", func() *Node { n := placeNode("a", "", 4000, 0); n.BatchMemoryMiB = 1000; return n }(), Request{BatchMemoryMiB: 1000}, nil},
		{"negative cpu", placeNode("a", "", 4000, 0), Request{CPUMilli: -1}, ErrInvalidRequest},
		{"share on two gpus", placeNode("a", "T4", 4000, 2), Request{NumGPU: 2, GPUMilli: 500}, ErrInvalidRequest},
		{"milli without gpu", placeNode("a", "T4", 4000, 2), Request{GPUMilli: 500}, ErrInvalidRequest},
		{"milli above a gpu", placeNode("a", "T4", 4000, 2), Request{NumGPU: 1, GPUMilli: 1001}, ErrInvalidRequest},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.node.Fit(tc.req)
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("Fit = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestPlaceDischarge(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		req      Request
		devices  []int
		wantErr  error
		wantFree []int
	}{
		{"whole gpus", Request{CPUMilli: 1000, MemoryMiB: 10, NumGPU: 2, GPUMilli: 1000}, []int{1, 3}, nil, []int{1000, 0, 1000, 0}},
		{"share", Request{CPUMilli: 1000, NumGPU: 1, GPUMilli: 250}, []int{2}, nil, []int{1000, 1000, 750, 1000}},
		{"cpu only", Request{CPUMilli: 1000, BatchCPUMilli: 100}, nil, nil, []int{1000, 1000, 1000, 1000}},
		{"too few devices", Request{NumGPU: 2, GPUMilli: 1000}, []int{1}, ErrInvalidDevices, nil},
		{"same device twice", Request{NumGPU: 2, GPUMilli: 1000}, []int{1, 1}, ErrInvalidDevices, nil},
		{"device out of range", Request{NumGPU: 1, GPUMilli: 1000}, []int{4}, ErrInvalidDevices, nil},
		{"devices for a cpu pod", Request{CPUMilli: 1}, []int{0}, ErrInvalidDevices, nil},
		{"does not fit", Request{CPUMilli: 9000}, nil, ErrInsufficientCPU, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := placeNode("n", "T4", 8000, 4)
			n.BatchCPUMilli = 1000
			before := n.Clone()
			err := n.Place(tc.req, tc.devices)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Place = %v, want %v", err, tc.wantErr)
				}
				if !nodesEqual(n, before) {
					t.Fatalf("failed Place changed the node: %+v", n)
				}
				return
			}
			if err != nil {
				t.Fatalf("Place: %v", err)
			}
			if !slices.Equal(n.GPUFree, tc.wantFree) || n.UsedCPUMilli != tc.req.CPUMilli || n.Pods != 1 ||
				n.UsedMemoryMiB != tc.req.MemoryMiB || n.UsedBatchCPUMilli != tc.req.BatchCPUMilli {
				t.Fatalf("after Place: %+v", n)
			}
			n.Discharge(tc.req, tc.devices)
			if !nodesEqual(n, before) {
				t.Fatalf("Discharge did not restore: %+v, want %+v", n, before)
			}
		})
	}
}

// TestChargeMirrorsReality: Charge books what runs even when it over-commits a
// node (and skips devices that do not exist); Discharge undoes it exactly.
func TestChargeMirrorsReality(t *testing.T) {
	t.Parallel()
	n := placeNode("n", "T4", 8000, 2)
	r := Request{CPUMilli: 9000, NumGPU: 1, GPUMilli: 700}
	n.Charge(r, []int{0})
	n.Charge(r, []int{0, 7, -1})
	if n.UsedCPUMilli != 18000 || n.Pods != 2 || !slices.Equal(n.GPUFree, []int{-400, 1000}) {
		t.Fatalf("after Charge: %+v", n)
	}
	n.Discharge(r, []int{0, 7, -1})
	n.Discharge(r, []int{0})
	if !nodesEqual(n, placeNode("n", "T4", 8000, 2)) {
		t.Fatalf("after Discharge: %+v", n)
	}
}

func TestValidAndInferDevices(t *testing.T) {
	t.Parallel()
	n := withFree(placeNode("n", "T4", 8000, 4), 200, 1000, 600, 1000)
	for _, tc := range []struct {
		r     Request
		devs  []int
		valid bool
		infer []int
	}{
		{Request{NumGPU: 2, GPUMilli: 1000}, []int{0, 2}, true, []int{1, 3}},
		{Request{NumGPU: 2, GPUMilli: 1000}, []int{1, 1}, false, []int{1, 3}},
		{Request{NumGPU: 1, GPUMilli: 500}, []int{4}, false, []int{2}},
		{Request{NumGPU: 1, GPUMilli: 900}, nil, false, []int{1}},
		{Request{NumGPU: 1, GPUMilli: 100}, []int{0}, true, []int{0}},
	} {
		if got := ValidDevices(n, tc.r, tc.devs); got != tc.valid {
			t.Errorf("ValidDevices(%+v, %v) = %v", tc.r, tc.devs, got)
		}
		if got := InferDevices(n, tc.r); !slices.Equal(got, tc.infer) {
			t.Errorf("InferDevices(%+v) = %v, want %v", tc.r, got, tc.infer)
		}
	}
}

func TestClone(t *testing.T) {
	t.Parallel()
	n := placeNode("n", "T4", 8000, 2)
	n.Usage = &Usage{CPUCapacity: 1}
	c := n.Clone()
	c.GPUFree[0] = 1
	c.Usage.CPUCapacity = 2
	if n.GPUFree[0] != 1000 || n.Usage.CPUCapacity != 1 {
		t.Fatalf("clone shares state with the original")
	}
}

func nodesEqual(a, b *Node) bool {
	return a.UsedCPUMilli == b.UsedCPUMilli && a.UsedMemoryMiB == b.UsedMemoryMiB && a.Pods == b.Pods &&
		a.UsedBatchCPUMilli == b.UsedBatchCPUMilli && a.UsedBatchMemoryMiB == b.UsedBatchMemoryMiB &&
		slices.Equal(a.GPUFree, b.GPUFree)
}
