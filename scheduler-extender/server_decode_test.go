package extender

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// stdArgs decodes with encoding/json, the reference the fast path must agree with.
func stdArgs(body []byte) (*extenderv1.ExtenderArgs, error) {
	var a extenderv1.ExtenderArgs
	if err := json.Unmarshal(body, &a); err != nil {
		return nil, err
	}
	return &a, nil
}

func namesOf(a extenderArgs) []string {
	if a.names == nil {
		return nil
	}
	out := make([]string, len(a.names))
	for i, b := range a.names {
		out[i] = string(b)
	}
	return out
}

func TestDecodeExtenderArgs(t *testing.T) {
	t.Parallel()
	pod, _ := json.Marshal(testPod("ns", "p", gpus(1)))
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
			pc := newPodCache(4, 1<<20)
			_, ferr := fastExtenderArgs([]byte(tc.body), pc, nil, nil)
			if tc.fast && ferr != nil {
				t.Fatalf("fast path refused: %v", ferr)
			}
			a, err := decodeExtenderArgs([]byte(tc.body), pc, &listCache{}, nil)
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
			if (a.pod != nil) != tc.pod || (tc.pod && a.pod.Name != "p") {
				t.Fatalf("pod %+v", a.pod)
			}
			if got := 0; a.nodes != nil {
				got = len(a.nodes.Items)
				if got != tc.nodes {
					t.Fatalf("nodes %d, want %d", got, tc.nodes)
				}
			}
		})
	}
}

func TestListCache(t *testing.T) {
	t.Parallel()
	lc := &listCache{min: defaultMinCachedList}
	long := nodeNames("n", defaultMinCachedList)
	body := func(names []string) []byte {
		b, _ := json.Marshal(extenderv1.ExtenderArgs{NodeNames: &names})
		return b
	}
	first, err := fastExtenderArgs(body(long), nil, lc, nil)
	if err != nil || first.namesCached {
		t.Fatalf("first decode: cached=%v err=%v", first.namesCached, err)
	}
	again, err := fastExtenderArgs(body(long), nil, lc, nil)
	if err != nil || !again.namesCached || !reflect.DeepEqual(namesOf(again), long) {
		t.Fatalf("second decode should come from the cache: cached=%v err=%v", again.namesCached, err)
	}
	longer := append(append([]string(nil), long...), "extra")
	got, err := fastExtenderArgs(body(longer), nil, lc, nil)
	if err != nil || got.namesCached || !reflect.DeepEqual(namesOf(got), longer) {
		t.Fatalf("a longer list must not match the cached one: %v %v", got.namesCached, err)
	}
	short := nodeNames("n", 3)
	got, _ = fastExtenderArgs(body(short), nil, lc, nil)
	if got.namesCached || !reflect.DeepEqual(namesOf(got), short) {
		t.Fatalf("short list: %q", namesOf(got))
	}
}

func TestPodCacheSharesDecodedPods(t *testing.T) {
	t.Parallel()
	raw, _ := json.Marshal(testPod("ns", "p"))
	pc := newPodCache(2, 1<<20)
	a, err := pc.decode(raw)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pc.decode(bytes.Clone(raw))
	if a != b {
		t.Fatal("same JSON should hit the cache")
	}
	for _, n := range []string{"x", "y", "z"} {
		r, _ := json.Marshal(testPod("ns", n))
		if _, err := pc.decode(r); err != nil {
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
			pc := newPodCache(1024, budget)
			for i := range 160 {
				pod := testPod("ns", fmt.Sprintf("p%d", i), annotate("big", strings.Repeat("x", tc.annotation)))
				raw, _ := json.Marshal(pod)
				got, err := pc.decode(raw)
				if err != nil || got.Name != pod.Name || len(got.Annotations["big"]) != tc.annotation {
					t.Fatalf("decode: %v, %v", got, err)
				}
				if n, b := pc.size(); b > budget || n > 1024 {
					t.Fatalf("after %d pods: %d entries, %d bytes, budget %d", i+1, n, b, budget)
				}
			}
			n, b := pc.size()
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
	pod, _ := json.Marshal(testPod("ns", "p", gpus(1)))
	for _, s := range []string{
		`{"Pod":` + string(pod) + `,"NodeNames":["a","b"]}`,
		`{"NodeNames":["a\u0062"],"Nodes":null}`, `{"X":[{"a":1e5}],"nodeNames":[]}`, `{}`, `[`, `{"NodeNames":[1]}`,
		`{"Pod":null,"NodeNames":null}`, `{"Nodes":{"items":[{"metadata":{"name":"n"}}]}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		// The first decode fills the list cache (no minimum length), the second reads it.
		lc := &listCache{}
		_, _ = fastExtenderArgs(body, newPodCache(2, 1<<20), lc, nil)
		fast, ferr := fastExtenderArgs(body, newPodCache(2, 1<<20), lc, make([][]byte, 0, 1))
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
		if (fast.pod == nil) != (std.Pod == nil) || (fast.nodes == nil) != (std.Nodes == nil) {
			t.Fatalf("pod/nodes presence differs: fast %v/%v std %v/%v", fast.pod != nil, fast.nodes != nil, std.Pod != nil, std.Nodes != nil)
		}
		if fast.pod != nil && !reflect.DeepEqual(fast.pod, std.Pod) {
			t.Fatal("pods differ")
		}
	})
}

// FuzzFilterResult checks the hand-written encoder against encoding/json's decoder.
func FuzzFilterResult(f *testing.F) {
	f.Add("n1", "n2", "insufficient gpu", "gang ns/g: 3/4 members fit", "")
	f.Add("é", "\x00", "\"quoted\"", "\\", "<tag>")
	f.Fuzz(func(t *testing.T, passed, failed, reason, ureason, errMsg string) {
		out := filterOutcome{passed: []string{passed}}
		out.fail([]byte(failed), reason, false)
		out.fail([]byte(failed+"-u"), ureason, true)
		var res extenderv1.ExtenderFilterResult
		if err := json.Unmarshal(appendFilterResult(nil, &out, errMsg), &res); err != nil {
			t.Fatalf("invalid JSON: %v", err)
		}
		norm := func(s string) string { b, _ := json.Marshal(s); var o string; _ = json.Unmarshal(b, &o); return o }
		if res.NodeNames == nil || (*res.NodeNames)[0] != norm(passed) || res.FailedNodes[norm(failed)] != norm(reason) ||
			res.FailedAndUnresolvableNodes[norm(failed+"-u")] != norm(ureason) || res.Error != norm(errMsg) {
			t.Fatalf("round trip lost data: %+v", res)
		}
	})
}

// FuzzHandlers posts arbitrary bodies to every verb: the server answers 200,
// 400 or 413 and never panics.
func FuzzHandlers(f *testing.F) {
	pod, _ := json.Marshal(testPod("ns", "p", gpus(1)))
	f.Add(uint8(0), []byte(`{"Pod":`+string(pod)+`,"NodeNames":["n0","x"]}`))
	f.Add(uint8(1), []byte(`{"Pod":`+string(pod)+`,"NodeNames":["n0"]}`))
	f.Add(uint8(2), []byte(`{"PodName":"p","PodNamespace":"ns","PodUID":"u","Node":"n0"}`))
	f.Add(uint8(0), []byte(`{"Pod":{"metadata":{"name":"p","uid":"u","annotations":{"understory.io/gpu-model":",,"}}},"NodeNames":["n0"]}`))
	s, err := NewServer(DefaultConfig(), Deps{})
	if err != nil {
		f.Fatal(err)
	}
	s.State().UpsertNode(testNode("n0", "A100", 2, 8, 32))
	h := s.Handler()
	verbs := []string{"/filter", "/prioritize", "/bind"}
	f.Fuzz(func(t *testing.T, verb uint8, body []byte) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, verbs[int(verb)%3], bytes.NewReader(body)))
		switch rec.Code {
		case http.StatusOK, http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		default:
			t.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
		if rec.Code == http.StatusOK && verb%3 != 1 && !json.Valid(rec.Body.Bytes()) {
			t.Fatalf("invalid JSON answer %s", rec.Body)
		}
	})
}
