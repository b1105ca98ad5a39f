package podsource

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilvalidation "k8s.io/apimachinery/pkg/util/validation"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// MaxManifestSize is the largest manifest file, in bytes, that Static reads.
const MaxManifestSize = 1 << 20

// MaxUIDLength is the longest metadata.uid a static pod may carry.
const MaxUIDLength = 128

// Sentinel errors; Errors() values and ParseManifest errors wrap them.
var (
	// ErrInvalidManifest: the file is not a single valid Pod manifest.
	ErrInvalidManifest = errors.New("invalid pod manifest")
	// ErrManifestTooLarge: the file exceeds MaxManifestSize.
	ErrManifestTooLarge = errors.New("pod manifest too large")
	// ErrDuplicateUID: another file (sorting earlier) already holds the UID.
	ErrDuplicateUID = errors.New("duplicate pod uid")
	// ErrNotRegular: the directory entry is a FIFO, device or socket.
	ErrNotRegular = errors.New("not a regular file")
)

// ParseManifest decodes and validates one static pod manifest. name (usually
// the file path) is only used in error messages. The returned pod has its
// namespace defaulted to "default"; nothing else is defaulted.
func ParseManifest(name string, data []byte) (*corev1.Pod, error) {
	if len(data) > MaxManifestSize {
		return nil, fmt.Errorf("pod manifest %s: %d bytes, limit %d: %w", name, len(data), MaxManifestSize, ErrManifestTooLarge)
	}
	doc, err := singleDocument(data)
	if err != nil {
		return nil, fmt.Errorf("pod manifest %s: %v: %w", name, err, ErrInvalidManifest)
	}
	pod := &corev1.Pod{}
	if err := yaml.Unmarshal(doc, pod); err != nil {
		return nil, fmt.Errorf("pod manifest %s: decoding: %v: %w", name, err, ErrInvalidManifest)
	}
	if err := validatePod(pod); err != nil {
		return nil, fmt.Errorf("pod manifest %s: %v: %w", name, err, ErrInvalidManifest)
	}
	return pod, nil
}

// singleDocument returns the only non-empty YAML document in data. Without
// this check sigs.k8s.io/yaml would silently decode the first document of a
// multi-document file and drop the rest.
func singleDocument(data []byte) ([]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var found []byte
	n := 0
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("splitting YAML documents: %w", err)
		}
		var probe any
		if err := yaml.Unmarshal(doc, &probe); err != nil {
			return nil, fmt.Errorf("decoding: %w", err)
		}
		if probe == nil { // empty document, comments only
			continue
		}
		n++
		found = doc
	}
	switch n {
	case 0:
		return nil, errors.New("no pod in file")
	case 1:
		return found, nil
	default:
		return nil, fmt.Errorf("file holds %d YAML documents, want exactly one Pod", n)
	}
}

func validatePod(pod *corev1.Pod) error {
	if pod.Kind != "Pod" {
		return fmt.Errorf("kind is %q, want Pod", pod.Kind)
	}
	if pod.APIVersion != "v1" {
		return fmt.Errorf("apiVersion is %q, want v1", pod.APIVersion)
	}
	if pod.Name == "" {
		return errors.New("metadata.name is required")
	}
	if msgs := utilvalidation.IsDNS1123Subdomain(pod.Name); len(msgs) > 0 {
		return fmt.Errorf("metadata.name %q: %s", pod.Name, strings.Join(msgs, "; "))
	}
	if pod.Namespace == "" {
		pod.Namespace = metav1.NamespaceDefault
	}
	if msgs := utilvalidation.IsDNS1123Label(pod.Namespace); len(msgs) > 0 {
		return fmt.Errorf("metadata.namespace %q: %s", pod.Namespace, strings.Join(msgs, "; "))
	}
	if pod.UID == "" {
		return errors.New("metadata.uid is required for static pods (the agent finds the pod cgroup by UID)")
	}
	if err := validateUID(pod.UID); err != nil {
		return fmt.Errorf("metadata.uid %q: %w", pod.UID, err)
	}
	return nil
}

// validateUID accepts UIDs that are safe as one cgroup path component.
func validateUID(uid types.UID) error {
	s := string(uid)
	if len(s) > MaxUIDLength {
		return fmt.Errorf("longer than %d bytes", MaxUIDLength)
	}
	if s == "." || s == ".." {
		return errors.New(`"." and ".." are not allowed`)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.':
		default:
			return fmt.Errorf("byte %q at offset %d is not in [A-Za-z0-9._-]", c, i)
		}
	}
	return nil
}
