package extender

import (
	"encoding/json"
	"fmt"
	"testing"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/understory/understory/scheduler-extender/wire"
)

// benchDecoder turns an ExtenderArgs body into the handlers' wire.Args.
type benchDecoder struct {
	name   string
	decode func(s *Server, body []byte, buf [][]byte) (wire.Args, error)
}

// handWritten is the extender's own decoder (package wire).
func handWritten() benchDecoder {
	return benchDecoder{"hand-written", func(s *Server, body []byte, buf [][]byte) (wire.Args, error) {
		return s.dec.Args(body, buf)
	}}
}

// generalDecoder is a decoder built on a general JSON library's Unmarshal
// into extenderv1.ExtenderArgs. Node names alias the decoded strings (no copy
// per name): the best case for the library.
func generalDecoder(name string, unmarshal func([]byte, any) error) benchDecoder {
	return benchDecoder{name, func(_ *Server, body []byte, buf [][]byte) (wire.Args, error) {
		var std extenderv1.ExtenderArgs
		if err := unmarshal(body, &std); err != nil {
			return wire.Args{}, fmt.Errorf("ExtenderArgs: %w: %w", err, wire.ErrBadRequest)
		}
		a := wire.Args{Pod: std.Pod, Nodes: std.Nodes, Names: buf[:0]}
		if std.NodeNames != nil {
			for _, n := range *std.NodeNames {
				a.Names = append(a.Names, unsafe.Slice(unsafe.StringData(n), len(n)))
			}
		}
		return a, nil
	}}
}

// cachingDecoder is what would replace the hand-written scanner while keeping
// its caches: a general JSON library splits the top-level object (Pod and
// NodeNames kept raw), the pod goes through the decoded-pod cache and the name
// list through the list cache, and only a list the cache lacks is decoded.
func cachingDecoder(name string, unmarshal func([]byte, any) error) benchDecoder {
	return benchDecoder{name, func(s *Server, body []byte, buf [][]byte) (wire.Args, error) {
		var top struct {
			Pod       json.RawMessage
			Nodes     *corev1.NodeList
			NodeNames json.RawMessage
		}
		if err := unmarshal(body, &top); err != nil {
			return wire.Args{}, fmt.Errorf("ExtenderArgs: %w: %w", err, wire.ErrBadRequest)
		}
		a := wire.Args{Nodes: top.Nodes, Names: buf[:0]}
		if len(top.Pod) > 0 && string(top.Pod) != "null" {
			pod, err := s.dec.Pods().Decode(top.Pod)
			if err != nil {
				return wire.Args{}, fmt.Errorf("ExtenderArgs.Pod: %w: %w", err, wire.ErrBadRequest)
			}
			a.Pod = pod
		}
		if len(top.NodeNames) > 0 && string(top.NodeNames) != "null" {
			if _, names, l := s.dec.Lists().Match(top.NodeNames); l != nil {
				a.Names, a.List, a.Cached = names, l, true
				return a, nil
			}
			var names []string
			if err := unmarshal(top.NodeNames, &names); err != nil {
				return wire.Args{}, fmt.Errorf("ExtenderArgs.NodeNames: %w: %w", err, wire.ErrBadRequest)
			}
			for _, n := range names {
				a.Names = append(a.Names, unsafe.Slice(unsafe.StringData(n), len(n)))
			}
		}
		return a, nil
	}}
}

// benchDecoding is BenchmarkFilter5000 and BenchmarkPrioritize5000 with the
// body decoded in the loop, as the handlers do (every node a candidate, the
// NodeNames form, the four request shapes in turn), for each decoder; and the
// decoding alone. The decoders share the server's caches: the hand-written one
// runs first and caches the candidate list, as the first call of a busy
// extender does.
func benchDecoding(b *testing.B, decoders []benchDecoder) {
	s, args := benchState(b)
	bodies := make([][]byte, len(args))
	for i, a := range args {
		names := make([]string, len(a.Names))
		for j, n := range a.Names {
			names[j] = string(n)
		}
		var err error
		if bodies[i], err = json.Marshal(extenderv1.ExtenderArgs{Pod: a.Pod, NodeNames: &names}); err != nil {
			b.Fatal(err)
		}
	}
	for _, d := range decoders {
		for _, verb := range []string{"decode", "filter", "prioritize"} {
			b.Run(verb+"/"+d.name, func(b *testing.B) {
				var (
					buf   [][]byte
					out   wire.Outcome
					sc    []int64
					raws  []float64
					bytes int
				)
				b.ResetTimer()
				start := cpuNow()
				for i := 0; i < b.N; i++ {
					body := bodies[i%len(bodies)]
					bytes += len(body)
					a, err := d.decode(s, body, buf)
					if err != nil {
						b.Fatal(err)
					}
					switch verb {
					case "filter":
						out = s.res.Filter(a.Pod, a.Names, a.List, nil, out)
					case "prioritize":
						sc, raws = s.res.Prioritize(a.Pod, a.Names, a.List, sc, raws)
					}
					if !a.Cached {
						buf = a.Names[:0]
					}
				}
				reportCPU(b, start)
				b.SetBytes(int64(bytes / b.N))
			})
		}
	}
}

// BenchmarkDecode5000 compares the hand-written ExtenderArgs decoder with
// encoding/json on 5 000-node bodies (docs/extender.md, "Why the decoder is
// hand-written").
func BenchmarkDecode5000(b *testing.B) {
	benchDecoding(b, []benchDecoder{handWritten(), generalDecoder("encoding-json", json.Unmarshal),
		cachingDecoder("encoding-json+caches", json.Unmarshal)})
}
