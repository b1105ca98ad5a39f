package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/understory/understory/contract"
)

// testPod is a pod asking for 100m CPU and gpus whole GPUs, with an annotation
// key=value when key is not empty.
func testPod(ns, name string, gpus int, key, value string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + ns + "-" + name),
			Labels: map[string]string{}, Annotations: map[string]string{}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")},
			Limits:   corev1.ResourceList{},
		}}}},
	}
	if gpus > 0 {
		p.Spec.Containers[0].Resources.Limits[contract.ResourceGPU] = *resource.NewQuantity(int64(gpus), resource.DecimalSI)
	}
	if key != "" {
		p.Annotations[key] = value
	}
	return p
}

func nodeNames(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + strconv.Itoa(i)
	}
	return out
}

// stdArgs decodes with encoding/json, the reference the fast path must agree with.
func stdArgs(body []byte) (*extenderv1.ExtenderArgs, error) {
	var a extenderv1.ExtenderArgs
	if err := json.Unmarshal(body, &a); err != nil {
		return nil, err
	}
	return &a, nil
}

func namesOf(a Args) []string {
	if a.Names == nil {
		return nil
	}
	out := make([]string, len(a.Names))
	for i, b := range a.Names {
		out[i] = string(b)
	}
	return out
}

func TestDecodeArgs(t *testing.T) {
	t.Parallel()
	pod, _ := json.Marshal(testPod("ns", "p", 1, "", ""))
	tests := []struct {
		name  string
		body  string
		fast  bool // the fast path must take it
		names []string
		nodes int
		pod   bool
		bad   bool
	}{
		{"kube-scheduler form", `{"Pod":` + string(pod) + `,"Nodes":null,"NodeNames":["a","b"]}`, true, []string{"a", "b"}, 0, true, false},
		{"whitespace and lowercase keys", " {\n \"pod\" : " + string(pod) + " , \"nodenames\" : [ \"a\" ] } ", true, []string{"a"}, 0, true, false},
		{"unknown fields skipped", `{"X":{"y":[1,-2.5e3,true,false,null,"s\"\u00e9"]},"NodeNames":[]}`, true, []string{}, 0, false, false},
		{"escaped name goes slow", `{"NodeNames":["a\u0062"]}`, false, []string{"ab"}, 0, false, false},
		{"non-ascii name goes slow", `{"NodeNames":["né"]}`, false, []string{"né"}, 0, false, false},
		{"null names", `{"NodeNames":null}`, true, nil, 0, false, false},
		{"nodes mode", `{"Nodes":{"items":[{"metadata":{"name":"n1"}}]}}`, true, nil, 1, false, false},
		{"duplicate key goes slow", `{"NodeNames":["a"],"NodeNames":["b"]}`, false, []string{"b"}, 0, false, false},
		{"not an object", `[]`, false, nil, 0, false, true},
		{"truncated", `{"NodeNames":["a"`, false, nil, 0, false, true},
		{"trailing garbage", `{"NodeNames":[]} x`, false, nil, 0, false, true},
		{"bad literal", `{"X":tru,"NodeNames":[]}`, false, nil, 0, false, true},
		{"bad number", `{"X":01,"NodeNames":[]}`, false, nil, 0, false, true},
		{"name not a string", `{"NodeNames":[1]}`, false, nil, 0, false, true},
		{"pod wrong type", `{"Pod":"x","NodeNames":[]}`, false, nil, 0, false, true},
		{"deep nesting", `{"X":` + strings.Repeat("[", 600) + strings.Repeat("]", 600) + `,"NodeNames":["a"]}`, false, []string{"a"}, 0, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pc := NewPodCache(4, 1<<20)
			_, ferr := fastArgs([]byte(tc.body), pc, nil, nil)
			if tc.fast && ferr != nil {
				t.Fatalf("fast path refused: %v", ferr)
			}
			a, err := decodeArgs([]byte(tc.body), pc, &Lists{}, nil)
			if tc.bad {
				if err == nil || !errors.Is(err, ErrBadRequest) {
					t.Fatalf("want ErrBadRequest, got %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(namesOf(a), tc.names) {
				t.Fatalf("names %q, want %q", namesOf(a), tc.names)
			}
			if (a.Pod != nil) != tc.pod || (tc.pod && a.Pod.Name != "p") {
				t.Fatalf("pod %+v", a.Pod)
			}
			if got := 0; a.Nodes != nil {
				got = len(a.Nodes.Items)
				if got != tc.nodes {
					t.Fatalf("nodes %d, want %d", got, tc.nodes)
				}
			}
		})
	}
}

func TestListCache(t *testing.T) {
	t.Parallel()
	lc := &Lists{min: minCachedList}
	long := nodeNames("n", minCachedList)
	body := func(names []string) []byte {
		b, _ := json.Marshal(extenderv1.ExtenderArgs{NodeNames: &names})
		return b
	}
	first, err := fastArgs(body(long), nil, lc, nil)
	if err != nil || first.Cached {
		t.Fatalf("first decode: cached=%v err=%v", first.Cached, err)
	}
	again, err := fastArgs(body(long), nil, lc, nil)
	if err != nil || !again.Cached || !reflect.DeepEqual(namesOf(again), long) {
		t.Fatalf("second decode should come from the cache: cached=%v err=%v", again.Cached, err)
	}
	longer := append(append([]string(nil), long...), "extra")
	got, err := fastArgs(body(longer), nil, lc, nil)
	if err != nil || got.Cached || !reflect.DeepEqual(namesOf(got), longer) {
		t.Fatalf("a longer list must not match the cached one: %v %v", got.Cached, err)
	}
	short := nodeNames("n", 3)
	got, _ = fastArgs(body(short), nil, lc, nil)
	if got.Cached || !reflect.DeepEqual(namesOf(got), short) {
		t.Fatalf("short list: %q", namesOf(got))
	}
}

func TestPodCacheSharesDecodedPods(t *testing.T) {
	t.Parallel()
	raw, _ := json.Marshal(testPod("ns", "p", 0, "", ""))
	pc := NewPodCache(2, 1<<20)
	a, err := pc.Decode(raw)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pc.Decode(bytes.Clone(raw))
	if a != b {
		t.Fatal("same JSON should hit the cache")
	}
	for _, n := range []string{"x", "y", "z"} {
		r, _ := json.Marshal(testPod("ns", n, 0, "", ""))
		if _, err := pc.Decode(r); err != nil {
			t.Fatal(err)
		}
	}
	if len(pc.m) > 2 {
		t.Fatalf("cache grew to %d entries, max 2", len(pc.m))
	}
}

// TestPodCacheBoundedInBytes: the decoded-pod cache keeps its estimated cost
// within its byte budget however large the pods are, and a pod too large to
// keep is still decoded. Before, it was bounded by count only: 160 cached
// requests of 1 MiB pods retained 160 MiB.
func TestPodCacheBoundedInBytes(t *testing.T) {
	t.Parallel()
	const budget = 1 << 20
	tests := []struct {
		name       string
		annotation int // bytes of annotation per pod
		wantKept   bool
	}{
		{"small pods", 100, true},
		{"32 KiB pods", 32 << 10, true},
		{"pods above an eighth of the budget", 100 << 10, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pc := NewPodCache(1024, budget)
			for i := range 160 {
				pod := testPod("ns", fmt.Sprintf("p%d", i), 0, "big", strings.Repeat("x", tc.annotation))
				raw, _ := json.Marshal(pod)
				got, err := pc.Decode(raw)
				if err != nil || got.Name != pod.Name || len(got.Annotations["big"]) != tc.annotation {
					t.Fatalf("decode: %v, %v", got, err)
				}
				if n, b := pc.Size(); b > budget || n > 1024 {
					t.Fatalf("after %d pods: %d entries, %d bytes, budget %d", i+1, n, b, budget)
				}
			}
			n, b := pc.Size()
			if tc.wantKept != (n > 0) {
				t.Fatalf("%d entries kept (%d bytes)", n, b)
			}
			var sum int64
			for _, e := range pc.m {
				sum += podCacheCost(e.raw)
			}
			if sum != b {
				t.Fatalf("accounted %d bytes, entries cost %d", b, sum)
			}
		})
	}
}

// FuzzFilterArgs checks the fast decoder against encoding/json: whatever both
// accept must decode the same, and the fast path must never accept what
// encoding/json refuses.
func FuzzFilterArgs(f *testing.F) {
	pod, _ := json.Marshal(testPod("ns", "p", 1, "", ""))
	for _, s := range []string{
		`{"Pod":` + string(pod) + `,"NodeNames":["a","b"]}`,
		`{"NodeNames":["a\u0062"],"Nodes":null}`, `{"X":[{"a":1e5}],"nodeNames":[]}`, `{}`, `[`, `{"NodeNames":[1]}`,
		`{"Pod":null,"NodeNames":null}`, `{"Nodes":{"items":[{"metadata":{"name":"n"}}]}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		// The first decode fills the list cache (no minimum length), the second reads it.
		lc := &Lists{}
		_, _ = fastArgs(body, NewPodCache(2, 1<<20), lc, nil)
		fast, ferr := fastArgs(body, NewPodCache(2, 1<<20), lc, make([][]byte, 0, 1))
		std, serr := stdArgs(body)
		if ferr != nil {
			if !errors.Is(ferr, errSlowPath) {
				t.Fatalf("fast path error %v is not errSlowPath", ferr)
			}
			return
		}
		if serr != nil {
			t.Fatalf("fast path accepted %q that encoding/json refuses: %v", body, serr)
		}
		var want []string
		if std.NodeNames != nil {
			want = *std.NodeNames
		}
		if got := namesOf(fast); !reflect.DeepEqual(got, want) {
			t.Fatalf("names %q, encoding/json %q", got, want)
		}
		if (fast.Pod == nil) != (std.Pod == nil) || (fast.Nodes == nil) != (std.Nodes == nil) {
			t.Fatalf("pod/nodes presence differs: fast %v/%v std %v/%v", fast.Pod != nil, fast.Nodes != nil, std.Pod != nil, std.Nodes != nil)
		}
		if fast.Pod != nil && !reflect.DeepEqual(fast.Pod, std.Pod) {
			t.Fatal("pods differ")
		}
	})
}

// FuzzFilterResult checks the hand-written encoder against encoding/json's decoder.
func FuzzFilterResult(f *testing.F) {
	f.Add("n1", "n2", "insufficient gpu", "gang ns/g: 3/4 members fit", "")
	f.Add("é", "\x00", "\"quoted\"", "\\", "<tag>")
	f.Fuzz(func(t *testing.T, passed, failed, reason, ureason, errMsg string) {
		out := Outcome{Passed: []string{passed}}
		out.Fail([]byte(failed), reason, false)
		out.Fail([]byte(failed+"-u"), ureason, true)
		var res extenderv1.ExtenderFilterResult
		if err := json.Unmarshal(AppendFilterResult(nil, &out, errMsg), &res); err != nil {
			t.Fatalf("invalid JSON: %v", err)
		}
		norm := func(s string) string { b, _ := json.Marshal(s); var o string; _ = json.Unmarshal(b, &o); return o }
		if res.NodeNames == nil || (*res.NodeNames)[0] != norm(passed) || res.FailedNodes[norm(failed)] != norm(reason) ||
			res.FailedAndUnresolvableNodes[norm(failed+"-u")] != norm(ureason) || res.Error != norm(errMsg) {
			t.Fatalf("round trip lost data: %+v", res)
		}
	})
}

// TestListResolution: a cached list keeps what the index resolved it to for
// one generation only, and a list too short to cache keeps nothing.
func TestListResolution(t *testing.T) {
	t.Parallel()
	d := NewDecoder(1 << 20)
	pod, _ := json.Marshal(testPod("ns", "p", 1, "", ""))
	body := func(names []string) []byte {
		b, _ := json.Marshal(map[string]any{"Pod": json.RawMessage(pod), "NodeNames": names})
		return b
	}
	long := body(nodeNames("n", minCachedList))
	first, err := d.Args(long, nil)
	if err != nil || first.List == nil || first.Cached {
		t.Fatalf("first decode: list %v, cached %v, err %v", first.List, first.Cached, err)
	}
	first.List.Resolve(7, "seven")
	again, err := d.Args(long, nil)
	if err != nil || again.List != first.List || !again.Cached {
		t.Fatalf("second decode: list %p (first %p), cached %v, err %v", again.List, first.List, again.Cached, err)
	}
	if got := again.List.Resolved(7); got != "seven" {
		t.Fatalf("resolved at 7: %v", got)
	}
	if got := again.List.Resolved(8); got != nil {
		t.Fatalf("resolved at another generation: %v", got)
	}
	short, err := d.Args(body(nodeNames("n", 3)), nil)
	if err != nil || short.List != nil || short.List.Resolved(7) != nil {
		t.Fatalf("short list: %v %v", short.List, err)
	}
	short.List.Resolve(7, "ignored") // a nil list stores nothing
}

// TestArgsChecks: Decoder.Args refuses bodies without a usable pod or
// candidates, and names the nodes of the Nodes form.
func TestArgsChecks(t *testing.T) {
	t.Parallel()
	pod, _ := json.Marshal(testPod("ns", "p", 1, "", ""))
	tests := []struct {
		name, body string
		names      []string
		err        string
	}{
		{"names", `{"Pod":` + string(pod) + `,"NodeNames":["a"]}`, []string{"a"}, ""},
		{"nodes", `{"Pod":` + string(pod) + `,"Nodes":{"items":[{"metadata":{"name":"n1"}}]}}`, []string{"n1"}, ""},
		{"no pod", `{"NodeNames":["a"]}`, nil, "Pod is missing"},
		{"no uid", `{"Pod":{"metadata":{"name":"p"}},"NodeNames":["a"]}`, nil, "no name or uid"},
		{"no candidates", `{"Pod":` + string(pod) + `}`, nil, "neither NodeNames nor Nodes"},
		{"not json", `{`, nil, "ExtenderArgs"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a, err := NewDecoder(1<<20).Args([]byte(tc.body), nil)
			if tc.err != "" {
				if err == nil || !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q wrapping ErrBadRequest", err, tc.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(namesOf(a), tc.names) {
				t.Fatalf("names %q, err %v; want %q", namesOf(a), err, tc.names)
			}
		})
	}
}

// FuzzBindingArgs checks BindingArgs against encoding/json: it accepts
// exactly the documents encoding/json decodes into ExtenderBindingArgs with
// every field set, decoded the same, and wraps ErrBadRequest otherwise.
func FuzzBindingArgs(f *testing.F) {
	for _, s := range []string{`{"PodName":"p","PodNamespace":"ns","PodUID":"u","Node":"n0"}`,
		`{"podname":"p","podnamespace":"ns","poduid":"u","node":"n"}`, `{"PodName":"p"}`, `{`, `null`, `[]`,
		`{"PodName":"p","PodNamespace":"ns","PodUID":"u","Node":"n0","X":[1,{"y":null}]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := BindingArgs(body)
		var want extenderv1.ExtenderBindingArgs
		serr := json.Unmarshal(body, &want)
		complete := serr == nil && want.PodName != "" && want.PodNamespace != "" && want.PodUID != "" && want.Node != ""
		switch {
		case err != nil && !errors.Is(err, ErrBadRequest):
			t.Fatalf("error %v does not wrap ErrBadRequest", err)
		case (err == nil) != complete:
			t.Fatalf("BindingArgs err %v, encoding/json err %v, args %+v", err, serr, want)
		case err == nil && got != want:
			t.Fatalf("decoded %+v, encoding/json %+v", got, want)
		}
	})
}

// FuzzHostPriorities checks the hand-written HostPriorityList encoder against
// encoding/json's decoder, for plain names and any others.
func FuzzHostPriorities(f *testing.F) {
	f.Add("n1", "n2", int64(10))
	f.Add("é", "\"q\"\\", int64(-3))
	f.Fuzz(func(t *testing.T, a, b string, score int64) {
		names := [][]byte{[]byte(a), []byte(b)}
		plain := true
		for _, c := range a + b {
			if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
				plain = false
			}
		}
		var got extenderv1.HostPriorityList
		if err := json.Unmarshal(AppendHostPriorities(nil, names, []int64{score, score + 1}, plain), &got); err != nil {
			t.Fatalf("invalid JSON: %v", err)
		}
		norm := func(s string) string { q, _ := json.Marshal(s); var o string; _ = json.Unmarshal(q, &o); return o }
		if len(got) != 2 || got[0].Host != norm(a) || got[1].Host != norm(b) || got[0].Score != score || got[1].Score != score+1 {
			t.Fatalf("round trip lost data: %+v", got)
		}
	})
}
