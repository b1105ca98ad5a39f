package placement

import (
	"math/rand"
	"testing"
)

// benchCluster is 5000 nodes shaped like the openb cluster, partly filled.
func benchCluster() ([]*Node, *Workload) {
	rng := rand.New(rand.NewSource(1))
	shapes := []struct {
		model string
		cpu   int64
		gpus  int
	}{{"G2", 96000, 8}, {"T4", 104000, 2}, {"P100", 64000, 2}, {"V100M16", 32000, 4}, {"G3", 128000, 8}}
	nodes := make([]*Node, 5000)
	for i := range nodes {
		s := shapes[rng.Intn(len(shapes))]
		n := placeNode("n", s.model, s.cpu, s.gpus)
		n.UsedCPUMilli = rng.Int63n(s.cpu / 2)
		for d := range n.GPUFree {
			n.GPUFree[d] = []int{0, 190, 530, 1000, 1000}[rng.Intn(5)]
		}
		nodes[i] = n
	}
	var in []Request
	for _, m := range []int{1000, 810, 470, 460, 320, 650, 230, 160} {
		in = append(in, reqs(10+m/10, Request{CPUMilli: int64(m) * 8, NumGPU: 1, GPUMilli: m})...)
	}
	in = append(in, reqs(30, Request{CPUMilli: 4000})...)
	in = append(in, reqs(20, Request{CPUMilli: 32000, NumGPU: 8, GPUMilli: 1000})...)
	in = append(in, reqs(20, Request{CPUMilli: 8000, NumGPU: 1, GPUMilli: 1000, Models: []string{"T4"}})...)
	return nodes, NewWorkload(in, DefaultCoverage)
}

// BenchmarkScore5000Nodes is one filter+prioritize pass: every policy scoring a
// share request over 5000 nodes (the extender's p99 budget is 5 ms).
func BenchmarkScore5000Nodes(b *testing.B) {
	nodes, w := benchCluster()
	for _, name := range []string{PolicyBestFit, PolicyFGD, PolicyUnderstory} {
		for _, r := range []struct {
			name string
			req  Request
		}{{"share", Request{CPUMilli: 4000, NumGPU: 1, GPUMilli: 470}}, {"whole2", Request{CPUMilli: 8000, NumGPU: 2, GPUMilli: 1000}}} {
			b.Run(name+"/"+r.name, func(b *testing.B) {
				p, _ := NewPolicy(name, w, nil)
				b.ReportAllocs()
				for b.Loop() {
					if _, _, err := Select(p, nodes, r.req, nil); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
