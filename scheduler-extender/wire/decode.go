package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// ErrBadRequest wraps every reason a request body is rejected.
var ErrBadRequest = errors.New("bad request")

// Args is an ExtenderArgs body as the handlers use it.
type Args struct {
	Pod *corev1.Pod
	// Names are the candidate node names: slices of the body, of the caller's
	// buffer or (Cached) of the list cache's own copy. In the Nodes form they
	// are the nodes' names.
	Names [][]byte
	// List is the list cache's entry of Names (nil: not cached): it keys what
	// the index resolved the list to (List.Resolved).
	List *List
	// Cached: Names alias the list cache, not the body or the buffer.
	Cached bool
	// Plain: every name is printable ASCII without quotes or backslashes.
	Plain bool
	// Nodes is set in nodeCacheCapable=false mode.
	Nodes *corev1.NodeList
}

// Decoder decodes ExtenderArgs bodies with the decoded-pod cache and the
// candidate-list cache. Safe for concurrent use.
type Decoder struct {
	pods  *PodCache
	lists *Lists
}

// PodCacheSize is how many decoded pods a Decoder keeps at most (its byte
// budget bounds their bytes too).
const PodCacheSize = 1024

// NewDecoder returns a decoder whose pod cache keeps up to PodCacheSize pods
// within podBytes (an estimate: the kept JSON and the decoded pod).
func NewDecoder(podBytes int64) *Decoder {
	return &Decoder{pods: NewPodCache(PodCacheSize, podBytes), lists: &Lists{min: minCachedList}}
}

// Pods is the decoder's decoded-pod cache.
func (d *Decoder) Pods() *PodCache { return d.pods }

// Lists is the decoder's candidate-list cache.
func (d *Decoder) Lists() *Lists { return d.lists }

// Args decodes and checks an ExtenderArgs body: it must carry a pod with a
// name and a uid, and NodeNames or Nodes (whose names become Names). buf is
// reused for the names when large enough. Every error wraps ErrBadRequest.
func (d *Decoder) Args(body []byte, buf [][]byte) (Args, error) {
	a, err := decodeArgs(body, d.pods, d.lists, buf)
	switch {
	case err != nil:
	case a.Pod == nil:
		err = fmt.Errorf("ExtenderArgs.Pod is missing: %w", ErrBadRequest)
	case a.Pod.UID == "" || a.Pod.Name == "":
		err = fmt.Errorf("ExtenderArgs.Pod has no name or uid: %w", ErrBadRequest)
	case a.Names == nil && a.Nodes == nil:
		err = fmt.Errorf("ExtenderArgs has neither NodeNames nor Nodes: %w", ErrBadRequest)
	}
	if err != nil {
		return Args{}, err
	}
	if a.Names == nil {
		a.Names = make([][]byte, len(a.Nodes.Items))
		for i := range a.Nodes.Items {
			a.Names[i] = []byte(a.Nodes.Items[i].Name)
		}
	}
	return a, nil
}

// decodeArgs parses an ExtenderArgs body. The fast path scans the top-level
// object itself, keeps node names as slices of body (no allocation per name)
// and decodes the pod through pc; any input it is not sure about goes to
// encoding/json, so both accept the same documents.
func decodeArgs(body []byte, pc *PodCache, lc *Lists, buf [][]byte) (Args, error) {
	a, err := fastArgs(body, pc, lc, buf)
	if err == nil {
		return a, nil
	}
	if !errors.Is(err, errSlowPath) {
		return a, fmt.Errorf("ExtenderArgs: %w: %w", err, ErrBadRequest)
	}
	var std extenderv1.ExtenderArgs
	if err := json.Unmarshal(body, &std); err != nil {
		return Args{}, fmt.Errorf("ExtenderArgs: %w: %w", err, ErrBadRequest)
	}
	a = Args{Pod: std.Pod, Nodes: std.Nodes}
	if std.NodeNames != nil {
		a.Names = make([][]byte, len(*std.NodeNames))
		for i, n := range *std.NodeNames {
			a.Names[i] = []byte(n)
		}
	}
	return a, nil
}

// buf is reused for the names when large enough.
func fastArgs(body []byte, pc *PodCache, lc *Lists, buf [][]byte) (Args, error) {
	var a Args
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
				if l := lc.match(body[start:]); l != nil {
					s.i += len(l.raw)
					a.Names, a.List, a.Plain, a.Cached = l.names, l, true, true
					break
				}
				names, err := s.nameList(buf[:0])
				if err != nil {
					return a, err
				}
				a.Names, a.Plain = names, names != nil
				a.List = lc.add(body[start:s.i], names)
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
		pod, err := pc.Decode(podRaw)
		if err != nil {
			return a, errSlowPath
		}
		a.Pod = pod
	}
	if nodesRaw != nil && !bytes.Equal(nodesRaw, []byte("null")) {
		var nl corev1.NodeList
		if err := json.Unmarshal(nodesRaw, &nl); err != nil {
			return a, errSlowPath
		}
		a.Nodes = &nl
	}
	return a, nil
}

// BindingArgs decodes an ExtenderBindingArgs body; PodName, PodNamespace,
// PodUID and Node are required. Every error wraps ErrBadRequest.
func BindingArgs(body []byte) (extenderv1.ExtenderBindingArgs, error) {
	var args extenderv1.ExtenderBindingArgs
	err := json.Unmarshal(body, &args)
	switch {
	case err != nil:
		err = fmt.Errorf("ExtenderBindingArgs: %w: %w", err, ErrBadRequest)
	case args.PodName == "" || args.PodNamespace == "" || args.PodUID == "" || args.Node == "":
		err = fmt.Errorf("ExtenderBindingArgs needs PodName, PodNamespace, PodUID and Node: %w", ErrBadRequest)
	}
	if err != nil {
		return extenderv1.ExtenderBindingArgs{}, err
	}
	return args, nil
}

// errSlowPath makes the fast decoder hand a body to encoding/json.
var errSlowPath = errors.New("needs the general decoder")

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
