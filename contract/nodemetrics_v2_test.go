package contract

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The version-1 document of validMetrics with batch resources: what every reader
// built before version 2 decodes (a cross-binary contract, docs/node-metrics.md).
const goldenV1 = `{"v":1,"ts":"2026-11-22T03:00:00Z","win":10000,` +
	`"cpu":{"cap":2000,"used":1200,"ls":400,"batch":700,"budget":1300},` +
	`"mem":{"cap":8589934592,"used":3221225472,"ls":1073741824,"batch":1073741824},` +
	`"batch":{"cpu":3500,"mem":6442450944}}`

const goldenV2 = `{"v":2,"ts":"2026-11-22T03:00:00Z","win":10000,` +
	`"cpu":{"cap":2000,"used":1200,"ls":400,"batch":700,"budget":1300},` +
	`"mem":{"cap":8589934592,"used":3221225472,"ls":1073741824,"batch":1073741824},` +
	`"batch":{"cpu":3500,"mem":6442450944},` +
	`"gpu":{"devs":[` +
	`{"i":0,"uuid":"GPU-8a6f3b5e-1c2d-4e5f-8a9b-0c1d2e3f4a5b","model":"NVIDIA A100-SXM4-40GB","ok":true,` +
	`"util":62.5,"ls":40,"memUsed":21474836480,"memCap":42949672960,"reclaim":0.35},` +
	`{"i":1,"uuid":"GPU-1b2c3d4e-5f60-4718-9a0b-1c2d3e4f5a6b","model":"NVIDIA A100-SXM4-40GB","ok":false,` +
	`"util":0,"ls":0,"memUsed":0,"memCap":42949672960,"reclaim":0}],` +
	`"alloc":{"pods":[{"ns":"ml","name":"train-0","uid":"0b5e6f1c-1111-4222-8333-444455556666","devs":[1]}]}}}`

func validV2() NodeMetrics {
	m := validMetrics()
	m.Version = NodeMetricsVersion2
	m.Batch = &BatchResources{CPU: 3500, Memory: 6 << 30}
	m.GPU = &GPUMetrics{
		Devices: []GPUDevice{
			{Index: 0, UUID: "GPU-8a6f3b5e-1c2d-4e5f-8a9b-0c1d2e3f4a5b", Model: "NVIDIA A100-SXM4-40GB", Healthy: true,
				Util: 62.5, LSUtil: 40, MemUsed: 20 << 30, MemTotal: 40 << 30, Reclaimable: 0.35},
			{Index: 1, UUID: "GPU-1b2c3d4e-5f60-4718-9a0b-1c2d3e4f5a6b", Model: "NVIDIA A100-SXM4-40GB",
				MemTotal: 40 << 30},
		},
		Alloc: &GPUAllocation{Pods: []PodGPUs{
			{Namespace: "ml", Name: "train-0", UID: "0b5e6f1c-1111-4222-8333-444455556666", Devices: []int{1}},
		}},
	}
	return m
}

func TestNodeMetricsV2RoundTrip(t *testing.T) {
	t.Parallel()
	m := validV2()
	b, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != goldenV2 {
		t.Fatalf("encoding changed (a cross-binary contract, see docs/node-metrics.md):\n got %s\nwant %s", b, goldenV2)
	}
	got, err := DecodeNodeMetrics(string(b))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, m) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, m)
	}
	// No GPU information, and a node without GPUs, are different documents.
	for _, tc := range []struct {
		gpu  *GPUMetrics
		want string
	}{
		{nil, strings.Replace(goldenV1, `"v":1`, `"v":2`, 1)},
		{&GPUMetrics{Devices: []GPUDevice{}}, strings.Replace(strings.TrimSuffix(goldenV1, "}"), `"v":1`, `"v":2`, 1) +
			`,"gpu":{"devs":[]}}`},
	} {
		m := validV2()
		m.GPU = tc.gpu
		b, err := m.Encode()
		if err != nil || string(b) != tc.want {
			t.Fatalf("Encode(gpu %+v) = %s, %v; want %s", tc.gpu, b, err, tc.want)
		}
		got, err := DecodeNodeMetrics(string(b))
		if err != nil || !reflect.DeepEqual(got, m) {
			t.Fatalf("round trip of %s: %+v, %v", b, got, err)
		}
	}
}

// TestEncodeAnnotations: the version-1 annotation is byte for byte what this build
// wrote before version 2 existed, whatever the value's version or GPU section.
func TestEncodeAnnotations(t *testing.T) {
	t.Parallel()
	for _, version := range []int{0, NodeMetricsVersion, NodeMetricsVersion2} {
		m := validV2()
		m.Version = version
		ann, err := m.EncodeAnnotations()
		if err != nil {
			t.Fatal(err)
		}
		if len(ann) != 2 || ann[AnnotationNodeMetrics] != goldenV1 || ann[AnnotationNodeMetricsV2] != goldenV2 {
			t.Fatalf("version %d: annotations\n%q\nwant v1 %s\nand  v2 %s", version, ann, goldenV1, goldenV2)
		}
		got, err := DecodeNodeAnnotations(ann)
		want := validV2()
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("DecodeNodeAnnotations = %+v, %v; want the version-2 value", got, err)
		}
	}
	m := validV2()
	m.GPU.Devices[0].Util = 101
	if _, err := m.EncodeAnnotations(); !errors.Is(err, ErrInvalidNodeMetrics) {
		t.Fatalf("EncodeAnnotations of an invalid GPU section = %v, want ErrInvalidNodeMetrics", err)
	}
	v1 := validMetrics()
	v1.GPU = &GPUMetrics{Devices: []GPUDevice{}}
	if _, err := v1.Encode(); !errors.Is(err, ErrInvalidNodeMetrics) {
		t.Fatalf("a version-1 value with a GPU section encoded: %v", err)
	}
}

func TestDecodeNodeAnnotations(t *testing.T) {
	t.Parallel()
	enc := func(m NodeMetrics) string {
		b, err := m.Encode()
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	v1 := validMetrics()
	v2 := validV2()
	older := validV2()
	older.Timestamp = v1.Timestamp.Add(-time.Minute)
	newer := validV2()
	newer.Timestamp = v1.Timestamp.Add(time.Minute)
	for _, tc := range []struct {
		name   string
		ann    map[string]string
		want   NodeMetrics
		errs   []error // the error wraps every one
		errNot error
	}{
		{"v1 only (an agent before version 2)", map[string]string{AnnotationNodeMetrics: enc(v1)}, v1, nil, nil},
		{"v2 only", map[string]string{AnnotationNodeMetricsV2: enc(v2)}, v2, nil, nil},
		{"both: v2", map[string]string{AnnotationNodeMetrics: enc(v1), AnnotationNodeMetricsV2: enc(v2)}, v2, nil, nil},
		{"v2 newer", map[string]string{AnnotationNodeMetrics: enc(v1), AnnotationNodeMetricsV2: enc(newer)}, newer,
			nil, nil},
		{"stale v2 left by a rolled-back agent", map[string]string{AnnotationNodeMetrics: enc(v1),
			AnnotationNodeMetricsV2: enc(older)}, v1, nil, nil},
		{"bad v2, good v1", map[string]string{AnnotationNodeMetrics: enc(v1), AnnotationNodeMetricsV2: `{"v":2}`},
			v1, nil, nil},
		{"future v2 annotation, good v1", map[string]string{AnnotationNodeMetrics: enc(v1),
			AnnotationNodeMetricsV2: `{"v":7}`}, v1, nil, nil},
		{"bad v1, good v2", map[string]string{AnnotationNodeMetrics: "x", AnnotationNodeMetricsV2: enc(v2)}, v2,
			nil, nil},
		{"none", map[string]string{"other": "x"}, NodeMetrics{}, []error{ErrNoNodeMetrics}, ErrInvalidNodeMetrics},
		{"nil map", nil, NodeMetrics{}, []error{ErrNoNodeMetrics}, nil},
		{"both bad", map[string]string{AnnotationNodeMetrics: `{"v":9}`, AnnotationNodeMetricsV2: "{"},
			NodeMetrics{}, []error{ErrUnsupportedVersion, ErrInvalidNodeMetrics}, ErrNoNodeMetrics},
		{"v2 document in the v1 annotation", map[string]string{AnnotationNodeMetrics: enc(v2)}, NodeMetrics{},
			[]error{ErrUnsupportedVersion}, nil},
		{"v1 document in the v2 annotation", map[string]string{AnnotationNodeMetricsV2: enc(v1)}, NodeMetrics{},
			[]error{ErrUnsupportedVersion}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := DecodeNodeAnnotations(tc.ann)
			for _, e := range tc.errs {
				if !errors.Is(err, e) {
					t.Fatalf("error %v does not wrap %v", err, e)
				}
			}
			if tc.errNot != nil && errors.Is(err, tc.errNot) {
				t.Fatalf("error %v wraps %v", err, tc.errNot)
			}
			if tc.errs == nil && err != nil {
				t.Fatalf("DecodeNodeAnnotations: %v", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
	// A version-1 document from a future agent that put a "gpu" field into it: the
	// field is ignored, as it always was by version-1 readers.
	s := strings.TrimSuffix(goldenV1, "}") + `,"gpu":{"devs":[{"i":99}]}}`
	if m, err := DecodeNodeMetrics(s); err != nil || m.GPU != nil {
		t.Fatalf("gpu in a version-1 document: %+v, %v; want it ignored", m.GPU, err)
	}
}

func TestDecodeNodeMetricsV2Rejects(t *testing.T) {
	t.Parallel()
	dev := func(f func(*GPUDevice)) func(*NodeMetrics) {
		return func(m *NodeMetrics) { f(&m.GPU.Devices[0]) }
	}
	pod := func(f func(*PodGPUs)) func(*NodeMetrics) {
		return func(m *NodeMetrics) { f(&m.GPU.Alloc.Pods[0]) }
	}
	many := func(n int) []GPUDevice {
		out := make([]GPUDevice, n)
		for i := range out {
			out[i] = GPUDevice{Index: i, UUID: fmt.Sprintf("GPU-%d", i)}
		}
		return out
	}
	for _, tc := range []struct {
		name string
		edit func(*NodeMetrics)
	}{
		{"devs null", func(m *NodeMetrics) { m.GPU.Devices = nil }},
		{"too many GPUs", func(m *NodeMetrics) { m.GPU.Devices = many(MaxGPUsPerNode + 1) }},
		{"index out of range", dev(func(d *GPUDevice) { d.Index = MaxGPUsPerNode })},
		{"negative index", dev(func(d *GPUDevice) { d.Index = -1 })},
		{"indices not increasing", func(m *NodeMetrics) { m.GPU.Devices[1].Index = 0 }},
		{"uuid twice", func(m *NodeMetrics) { m.GPU.Devices[1].UUID = m.GPU.Devices[0].UUID }},
		{"no uuid", dev(func(d *GPUDevice) { d.UUID = "" })},
		{"uuid with comma", dev(func(d *GPUDevice) { d.UUID = "GPU-1,GPU-2" })},
		{"uuid with space", dev(func(d *GPUDevice) { d.UUID = "GPU 1" })},
		{"uuid too long", dev(func(d *GPUDevice) { d.UUID = strings.Repeat("a", maxGPUUUID+1) })},
		{"uuid without GPU- prefix", dev(func(d *GPUDevice) { d.UUID = "8a6f3b5e-1c2d-4e5f-8a9b-0c1d2e3f4a5b" })},
		{"uuid of a MIG device", dev(func(d *GPUDevice) { d.UUID = "MIG-8a6f3b5e-1c2d-4e5f-8a9b-0c1d2e3f4a5b" })},
		{"uuid prefix only", dev(func(d *GPUDevice) { d.UUID = "GPU-" })},
		{"uuid with punctuation", dev(func(d *GPUDevice) { d.UUID = "GPU-8a6f;rm" })},
		{"lsFree negative", dev(func(d *GPUDevice) { d.LSFreeMilli = ptr(-1) })},
		{"lsFree above a GPU", dev(func(d *GPUDevice) { d.LSFreeMilli = ptr(MilliPerGPU + 1) })},
		{"model too long", dev(func(d *GPUDevice) { d.Model = strings.Repeat("a", maxGPUModel+1) })},
		{"util above 100", dev(func(d *GPUDevice) { d.Util = 100.5 })},
		{"negative ls", dev(func(d *GPUDevice) { d.LSUtil = -1 })},
		{"reclaim above 1", dev(func(d *GPUDevice) { d.Reclaimable = 1.01 })},
		{"negative memory", dev(func(d *GPUDevice) { d.MemUsed = -1 })},
		{"alloc pods null", func(m *NodeMetrics) { m.GPU.Alloc.Pods = nil }},
		{"alloc pod without devices", pod(func(p *PodGPUs) { p.Devices = nil })},
		{"alloc device out of range", pod(func(p *PodGPUs) { p.Devices = []int{64} })},
		{"alloc device twice", pod(func(p *PodGPUs) { p.Devices = []int{1, 1} })},
		{"alloc pod without name", pod(func(p *PodGPUs) { p.Name = "" })},
		{"alloc pod without namespace", pod(func(p *PodGPUs) { p.Namespace = "" })},
		{"alloc namespace too long", pod(func(p *PodGPUs) { p.Namespace = strings.Repeat("n", 64) })},
		{"alloc pod twice", func(m *NodeMetrics) { m.GPU.Alloc.Pods = append(m.GPU.Alloc.Pods, m.GPU.Alloc.Pods[0]) }},
		{"alloc too many pods", func(m *NodeMetrics) {
			m.GPU.Alloc.Pods = make([]PodGPUs, maxGPUAllocPods+1)
			for i := range m.GPU.Alloc.Pods {
				m.GPU.Alloc.Pods[i] = PodGPUs{Namespace: "ns", Name: fmt.Sprint("p", i), Devices: []int{0}}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := validV2()
			tc.edit(&m)
			if err := m.Validate(); !errors.Is(err, ErrInvalidNodeMetrics) {
				t.Fatalf("Validate = %v, want ErrInvalidNodeMetrics", err)
			}
			if _, err := m.Encode(); !errors.Is(err, ErrInvalidNodeMetrics) {
				t.Fatalf("Encode = %v, want ErrInvalidNodeMetrics", err)
			}
		})
	}
	// The same through the decoder, on hand-written JSON.
	base := strings.TrimSuffix(strings.Replace(goldenV1, `"v":1`, `"v":2`, 1), "}")
	for _, tc := range []struct{ name, gpu string }{
		{"util not a number", `{"devs":[{"i":0,"uuid":"GPU-0","util":"high"}]}`},
		{"devs not a list", `{"devs":{}}`},
		{"util above 100", `{"devs":[{"i":0,"uuid":"GPU-0","util":1e3}]}`},
		{"alloc without pods", `{"devs":[],"alloc":{}}`},
		{"index huge", `{"devs":[{"i":99999999999999999999,"uuid":"GPU-0"}]}`},
		{"lsFree not a number", `{"devs":[{"i":0,"uuid":"GPU-0","lsFree":"half"}]}`},
		{"lsFree fractional", `{"devs":[{"i":0,"uuid":"GPU-0","lsFree":500.5}]}`},
		{"lsFree above a GPU", `{"devs":[{"i":0,"uuid":"GPU-0","lsFree":1001}]}`},
		{"mps not a bool", `{"devs":[{"i":0,"uuid":"GPU-0","mps":1}]}`},
	} {
		s := base + `,"gpu":` + tc.gpu + `}`
		if _, err := DecodeNodeMetrics(s); !errors.Is(err, ErrInvalidNodeMetrics) {
			t.Errorf("%s: DecodeNodeMetrics(%s) = %v, want ErrInvalidNodeMetrics", tc.name, s, err)
		}
	}
}

// TestNodeMetricsV2Size: a node at every bound the extender can place on (64 GPUs
// with long UUIDs and model names, each held by a pod with long names) still fits.
func TestNodeMetricsV2Size(t *testing.T) {
	t.Parallel()
	m := validV2()
	m.GPU.Devices = make([]GPUDevice, MaxGPUsPerNode)
	m.GPU.Alloc.Pods = make([]PodGPUs, MaxGPUsPerNode)
	for i := range MaxGPUsPerNode {
		m.GPU.Devices[i] = GPUDevice{Index: i, UUID: fmt.Sprintf("GPU-%08d-1c2d-4e5f-8a9b-0c1d2e3f4a5b", i),
			Model: "NVIDIA H100 80GB HBM3", Healthy: true, Util: 99.9, LSUtil: 33.3, MemUsed: 80 << 30,
			MemTotal: 80 << 30, Reclaimable: 0.333, LSFreeMilli: ptr(667), MPS: true}
		m.GPU.Alloc.Pods[i] = PodGPUs{Namespace: strings.Repeat("n", 40), Name: fmt.Sprintf("%s-%d",
			strings.Repeat("p", 60), i), UID: "0b5e6f1c-1111-4222-8333-444455556666", Devices: []int{i}}
	}
	b, err := m.Encode()
	if err != nil {
		t.Fatalf("a full 64-GPU node does not encode: %v", err)
	}
	if len(b) > maxNodeMetricsV2Bytes/2 {
		t.Errorf("a full 64-GPU node takes %d bytes: less than half the %d-byte bound expected", len(b),
			maxNodeMetricsV2Bytes)
	}
	if _, err := DecodeNodeMetrics(string(b)); err != nil {
		t.Fatal(err)
	}
}

func FuzzDecodeNodeAnnotations(f *testing.F) {
	f.Add(goldenV1, goldenV2)
	f.Add(goldenV1, "")
	f.Add("", goldenV2)
	f.Add(goldenV2, goldenV1)
	f.Fuzz(func(t *testing.T, s1, s2 string) {
		ann := map[string]string{}
		if s1 != "" {
			ann[AnnotationNodeMetrics] = s1
		}
		if s2 != "" {
			ann[AnnotationNodeMetricsV2] = s2
		}
		m, err := DecodeNodeAnnotations(ann)
		if err != nil {
			if !errors.Is(err, ErrInvalidNodeMetrics) && !errors.Is(err, ErrUnsupportedVersion) &&
				!errors.Is(err, ErrNoNodeMetrics) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("returned value does not validate: %v", err)
		}
		if m.Version == NodeMetricsVersion && s1 == "" || m.Version == NodeMetricsVersion2 && s2 == "" {
			t.Fatalf("version %d from an absent annotation", m.Version)
		}
	})
}

// TestNodeMetricsV2PerGPUFacts: the LS-free share and the MPS flag round-trip, and a
// document of an agent older than them (goldenV2) still decodes, with both unknown:
// LSFreeMilli nil (never read as free), MPS false.
func TestNodeMetricsV2PerGPUFacts(t *testing.T) {
	t.Parallel()
	old, err := DecodeNodeMetrics(goldenV2)
	if err != nil {
		t.Fatalf("an older agent's document: %v", err)
	}
	for i, d := range old.GPU.Devices {
		if d.LSFreeMilli != nil || d.MPS {
			t.Errorf("older document, device %d: lsFree %v, mps %v; want unknown and false", i, d.LSFreeMilli, d.MPS)
		}
	}
	for _, tc := range []struct {
		name   string
		free   *int
		mps    bool
		suffix string // what the device's JSON ends with
	}{
		{"unknown", nil, false, `"reclaim":0.35}`},
		{"none free", ptr(0), false, `"reclaim":0.35,"lsFree":0}`},
		{"all free on MPS", ptr(MilliPerGPU), true, `"reclaim":0.35,"lsFree":1000,"mps":true}`},
		{"part free", ptr(640), false, `"reclaim":0.35,"lsFree":640}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := validV2()
			m.GPU.Devices[0].LSFreeMilli, m.GPU.Devices[0].MPS = tc.free, tc.mps
			b, err := m.Encode()
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(b), tc.suffix+`,{"i":1`) {
				t.Fatalf("encoding %s: device 0 does not end with %s", b, tc.suffix)
			}
			got, err := DecodeNodeMetrics(string(b))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, m) {
				t.Fatalf("round trip:\n got %+v\nwant %+v", got.GPU.Devices[0], m.GPU.Devices[0])
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }
