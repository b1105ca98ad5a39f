package extender

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"

	corev1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// errSlowPath makes the fast decoder hand a body to encoding/json.
var errSlowPath = errors.New("needs the general decoder")

// ErrBadRequest wraps every reason a request body is rejected.
var ErrBadRequest = errors.New("bad request")

// extenderArgs is ExtenderArgs as the handlers use it.
type extenderArgs struct {
	pod *corev1.Pod
	// names are the candidate node names; in NodeNames mode they alias the body.
	names [][]byte
	// namesRaw is the NodeNames array's JSON when the fast path read it (a cache key).
	namesRaw []byte
	// namesCached: names alias the list cache, not the body or the buffer.
	namesCached bool
	// namesPlain: every name is printable ASCII without quotes or backslashes.
	namesPlain bool
	// nodes is set in nodeCacheCapable=false mode.
	nodes *corev1.NodeList
}

// decodeExtenderArgs parses an ExtenderArgs body. The fast path scans the
// top-level object itself, keeps node names as slices of body (no allocation per
// name) and decodes the pod through pc; any input it is not sure about goes to
// encoding/json, so both accept the same documents.
func decodeExtenderArgs(body []byte, pc *podCache, lc *listCache, buf [][]byte) (extenderArgs, error) {
	a, err := fastExtenderArgs(body, pc, lc, buf)
	if err == nil {
		return a, nil
	}
	if !errors.Is(err, errSlowPath) {
		return a, fmt.Errorf("ExtenderArgs: %w: %w", err, ErrBadRequest)
	}
	var std extenderv1.ExtenderArgs
	if err := json.Unmarshal(body, &std); err != nil {
		return extenderArgs{}, fmt.Errorf("ExtenderArgs: %w: %w", err, ErrBadRequest)
	}
	a = extenderArgs{pod: std.Pod, nodes: std.Nodes}
	if std.NodeNames != nil {
		a.names = make([][]byte, len(*std.NodeNames))
		for i, n := range *std.NodeNames {
			a.names[i] = []byte(n)
		}
	}
	return a, nil
}

// maxScanDepth is where the fast path gives up on nesting (encoding/json stops at 10000).
const maxScanDepth = 512

type scanner struct {
	b []byte
	i int
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// simpleString reads a string without escapes or non-ASCII bytes and returns its
// contents; anything else is errSlowPath.
func (s *scanner) simpleString() ([]byte, error) {
	if s.peek() != '"' {
		return nil, errSlowPath
	}
	start := s.i + 1
	for j := start; j < len(s.b); j++ {
		c := s.b[j]
		switch {
		case c == '"':
			s.i = j + 1
			return s.b[start:j], nil
		case c == '\\' || c < 0x20 || c >= 0x80:
			return nil, errSlowPath
		}
	}
	return nil, errSlowPath
}

// skipString skips any valid JSON string.
func (s *scanner) skipString() error {
	s.i++ // opening quote
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return nil
		case c == '\\':
			if s.i+1 >= len(s.b) {
				return errSlowPath
			}
			switch s.b[s.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i += 2
			case 'u':
				if s.i+6 > len(s.b) || !isHex4(s.b[s.i+2:s.i+6]) {
					return errSlowPath
				}
				s.i += 6
			default:
				return errSlowPath
			}
		case c < 0x20:
			return errSlowPath
		default:
			s.i++
		}
	}
	return errSlowPath
}

func isHex4(b []byte) bool {
	for _, c := range b {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

func (s *scanner) skipNumber() error {
	digits := func() int {
		n := 0
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			s.i++
			n++
		}
		return n
	}
	if s.peek() == '-' {
		s.i++
	}
	switch {
	case s.peek() == '0':
		s.i++
	case s.peek() >= '1' && s.peek() <= '9':
		digits()
	default:
		return errSlowPath
	}
	if s.peek() == '.' {
		s.i++
		if digits() == 0 {
			return errSlowPath
		}
	}
	if c := s.peek(); c == 'e' || c == 'E' {
		s.i++
		if c := s.peek(); c == '+' || c == '-' {
			s.i++
		}
		if digits() == 0 {
			return errSlowPath
		}
	}
	return nil
}

func (s *scanner) literal(lit string) error {
	if !bytes.HasPrefix(s.b[s.i:], []byte(lit)) {
		return errSlowPath
	}
	s.i += len(lit)
	return nil
}

// skipValue skips one JSON value iteratively (no recursion on hostile nesting).
func (s *scanner) skipValue() error {
	var stack []byte // expected closers
	for {
		s.ws()
		switch c := s.peek(); {
		case c == '{' || c == '[':
			if len(stack) >= maxScanDepth {
				return errSlowPath
			}
			s.i++
			s.ws()
			closer := byte('}')
			if c == '[' {
				closer = ']'
			}
			if s.peek() == closer {
				s.i++
				break
			}
			stack = append(stack, closer)
			if c == '{' {
				if err := s.objectKey(); err != nil {
					return err
				}
			}
			continue
		case c == '"':
			if err := s.skipString(); err != nil {
				return err
			}
		case c == 't':
			if err := s.literal("true"); err != nil {
				return err
			}
		case c == 'f':
			if err := s.literal("false"); err != nil {
				return err
			}
		case c == 'n':
			if err := s.literal("null"); err != nil {
				return err
			}
		default:
			if err := s.skipNumber(); err != nil {
				return err
			}
		}
		// After a value: close containers or move to the next element.
		for {
			if len(stack) == 0 {
				return nil
			}
			s.ws()
			top := stack[len(stack)-1]
			switch s.peek() {
			case top:
				s.i++
				stack = stack[:len(stack)-1]
				continue
			case ',':
				s.i++
				if top == '}' {
					s.ws()
					if err := s.objectKey(); err != nil {
						return err
					}
				}
			default:
				return errSlowPath
			}
			break
		}
	}
}

// objectKey reads `"key" :` inside an object.
func (s *scanner) objectKey() error {
	if s.peek() != '"' {
		return errSlowPath
	}
	if err := s.skipString(); err != nil {
		return err
	}
	s.ws()
	if s.peek() != ':' {
		return errSlowPath
	}
	s.i++
	return nil
}

// buf is reused for the names when large enough.
func fastExtenderArgs(body []byte, pc *podCache, lc *listCache, buf [][]byte) (extenderArgs, error) {
	var a extenderArgs
	s := scanner{b: body}
	s.ws()
	if s.peek() != '{' {
		return a, errSlowPath
	}
	s.i++
	s.ws()
	var podRaw, nodesRaw []byte
	var seenPod, seenNames, seenNodes bool
	if s.peek() == '}' {
		s.i++
	} else {
		for {
			s.ws()
			key, err := s.simpleString()
			if err != nil {
				return a, err
			}
			s.ws()
			if s.peek() != ':' {
				return a, errSlowPath
			}
			s.i++
			s.ws()
			start := s.i
			switch {
			case bytes.EqualFold(key, []byte("Pod")):
				if seenPod {
					return a, errSlowPath
				}
				seenPod = true
				if err := s.skipValue(); err != nil {
					return a, err
				}
				podRaw = body[start:s.i]
			case bytes.EqualFold(key, []byte("Nodes")):
				if seenNodes {
					return a, errSlowPath
				}
				seenNodes = true
				if err := s.skipValue(); err != nil {
					return a, err
				}
				nodesRaw = body[start:s.i]
			case bytes.EqualFold(key, []byte("NodeNames")):
				if seenNames {
					return a, errSlowPath
				}
				seenNames = true
				if raw, names, ok := lc.match(body[start:]); ok {
					s.i += len(raw)
					a.names, a.namesRaw, a.namesPlain, a.namesCached = names, raw, true, true
					break
				}
				names, err := s.nameList(buf[:0])
				if err != nil {
					return a, err
				}
				a.names, a.namesRaw, a.namesPlain = names, body[start:s.i], names != nil
				lc.add(a.namesRaw, names)
			default:
				if err := s.skipValue(); err != nil {
					return a, err
				}
			}
			s.ws()
			if s.peek() == ',' {
				s.i++
				continue
			}
			if s.peek() == '}' {
				s.i++
				break
			}
			return a, errSlowPath
		}
	}
	s.ws()
	if s.i != len(body) {
		return a, errSlowPath
	}
	if podRaw != nil && !bytes.Equal(podRaw, []byte("null")) {
		pod, err := pc.decode(podRaw)
		if err != nil {
			return a, errSlowPath
		}
		a.pod = pod
	}
	if nodesRaw != nil && !bytes.Equal(nodesRaw, []byte("null")) {
		var nl corev1.NodeList
		if err := json.Unmarshal(nodesRaw, &nl); err != nil {
			return a, errSlowPath
		}
		a.nodes = &nl
	}
	return a, nil
}

// nameList reads null or an array of simple strings.
func (s *scanner) nameList(names [][]byte) ([][]byte, error) {
	if s.peek() == 'n' {
		return nil, s.literal("null")
	}
	if s.peek() != '[' {
		return nil, errSlowPath
	}
	s.i++
	if names == nil {
		names = make([][]byte, 0, 64)
	}
	s.ws()
	if s.peek() == ']' {
		s.i++
		return names, nil
	}
	for {
		s.ws()
		n, err := s.simpleString()
		if err != nil {
			return nil, err
		}
		names = append(names, n)
		s.ws()
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			return names, nil
		default:
			return nil, errSlowPath
		}
	}
}

// defaultMinCachedList is the shortest NodeNames list the server remembers.
const defaultMinCachedList = 64

// listCacheSize is how many NodeNames lists listCache keeps.
const listCacheSize = 4

// listCache remembers NodeNames arrays as sent: kube-scheduler sends the same
// candidate list call after call, and comparing it with memcmp is much cheaper
// than scanning it. Cached names alias the cache's own copy, never a body.
type listCache struct {
	min     int // shortest list worth remembering
	mu      sync.Mutex
	entries [listCacheSize]cachedList
	next    int
}

type cachedList struct {
	raw   []byte
	names [][]byte
}

// match reports whether rest starts with a cached array; a JSON array is
// self-delimiting, so equal leading bytes mean the same array.
func (c *listCache) match(rest []byte) ([]byte, [][]byte, bool) {
	if c == nil {
		return nil, nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.entries {
		if e.raw != nil && bytes.HasPrefix(rest, e.raw) {
			return e.raw, e.names, true
		}
	}
	return nil, nil, false
}

func (c *listCache) add(raw []byte, names [][]byte) {
	if c == nil || names == nil || len(names) < c.min {
		return
	}
	own := bytes.Clone(raw)
	out := make([][]byte, len(names))
	for i, n := range names {
		off := cap(raw) - cap(n) // n aliases raw: same backing array
		out[i] = own[off : off+len(n) : off+len(n)]
	}
	c.mu.Lock()
	c.entries[c.next] = cachedList{raw: own, names: out}
	c.next = (c.next + 1) % listCacheSize
	c.mu.Unlock()
}

// podCache remembers decoded pods by their exact JSON: kube-scheduler sends the
// same pod to filter and prioritize (and again on every retry), and decoding a
// pod costs more than the rest of a call. Cached pods are shared: never modify them.
//
// It is bounded in count and in bytes: a pod can carry up to 256 KiB of
// annotations and more in its spec, so a count alone let 160 cached requests
// retain 160 MiB. An entry costs podCacheCost(raw): the kept copy of the JSON
// plus an estimate of the decoded pod (its strings are copies of the JSON's).
// A pod costing more than an eighth of the budget is decoded but not kept.
type podCache struct {
	mu       sync.Mutex
	seed     maphash.Seed
	m        map[uint64]podCacheEntry
	max      int
	maxBytes int64
	bytes    int64 // sum of the entries' costs
}

type podCacheEntry struct {
	raw []byte
	pod *corev1.Pod
}

// podCacheOverhead is the fixed part of an entry's cost: the map slot, the Pod
// struct and its nested structs.
const podCacheOverhead = 2 << 10

// podCacheCost is what keeping raw and its decoded pod costs, estimated.
func podCacheCost(raw []byte) int64 { return 2*int64(len(raw)) + podCacheOverhead }

func newPodCache(size int, maxBytes int64) *podCache {
	return &podCache{seed: maphash.MakeSeed(), m: make(map[uint64]podCacheEntry, min(size, 1024)), max: size, maxBytes: maxBytes}
}

func (c *podCache) decode(raw []byte) (*corev1.Pod, error) {
	h := maphash.Bytes(c.seed, raw)
	c.mu.Lock()
	e, ok := c.m[h]
	c.mu.Unlock()
	if ok && bytes.Equal(e.raw, raw) {
		return e.pod, nil
	}
	pod := &corev1.Pod{}
	if err := json.Unmarshal(raw, pod); err != nil {
		return nil, err
	}
	cost := podCacheCost(raw)
	if cost > c.maxBytes/8 {
		return pod, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.m[h]; ok { // a hash collision or a concurrent decode of the same body
		c.bytes -= podCacheCost(old.raw)
		delete(c.m, h)
	}
	for k, old := range c.m { // evict arbitrary entries until the new one fits
		if len(c.m) < c.max && c.bytes+cost <= c.maxBytes {
			break
		}
		c.bytes -= podCacheCost(old.raw)
		delete(c.m, k)
	}
	c.m[h] = podCacheEntry{raw: bytes.Clone(raw), pod: pod}
	c.bytes += cost
	return pod, nil
}

// size is the entries and their cost in bytes.
func (c *podCache) size() (int, int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m), c.bytes
}
