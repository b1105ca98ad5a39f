package controlplane

import (
	"bytes"
	"context"
	_ "embed" // PodGroup CRD manifest
	"errors"
	"fmt"
	"io"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

//go:embed crds/podgroups.yaml
var podGroupCRD string

// PodGroupCRD returns the manifest of the PodGroup CRD
// (scheduling.x-k8s.io/v1alpha1, as used by the coscheduling plugin), for
// InstallCRD.
func PodGroupCRD() []byte { return []byte(podGroupCRD) }

// PodGroupGVR is the resource of PodGroupCRD.
func PodGroupGVR() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: "scheduling.x-k8s.io", Version: "v1alpha1", Resource: "podgroups"}
}

// ErrNotCRD marks a manifest document that is not an apiextensions.k8s.io/v1
// CustomResourceDefinition.
var ErrNotCRD = errors.New("not an apiextensions.k8s.io/v1 CustomResourceDefinition")

func crdGVR() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
}

// InstallCRD creates every CRD in manifest (YAML or JSON, "---"-separated
// documents) and waits until each is Established and its storage version is
// served (a List succeeds). It returns the storage-version resources.
func (cp *ControlPlane) InstallCRD(ctx context.Context, manifest []byte) ([]schema.GroupVersionResource, error) {
	crds, err := decodeCRDs(manifest)
	if err != nil {
		return nil, err
	}
	var out []schema.GroupVersionResource
	for _, crd := range crds {
		if _, err := cp.dynamic.Resource(crdGVR()).Create(ctx, crd, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("creating CRD %s: %w", crd.GetName(), err)
		}
		gvr, namespaced, err := crdResource(crd)
		if err != nil {
			return nil, err
		}
		if err := cp.waitCRDServed(ctx, crd.GetName(), gvr, namespaced); err != nil {
			return nil, err
		}
		out = append(out, gvr)
	}
	return out, nil
}

func decodeCRDs(manifest []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 4096)
	var crds []*unstructured.Unstructured
	for i := 0; ; i++ {
		obj := map[string]any{}
		if err := dec.Decode(&obj); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, fmt.Errorf("decoding CRD manifest document %d: %w", i, err)
		}
		if len(obj) == 0 {
			continue // empty document
		}
		u := &unstructured.Unstructured{Object: obj}
		if u.GetAPIVersion() != "apiextensions.k8s.io/v1" || u.GetKind() != "CustomResourceDefinition" {
			return nil, fmt.Errorf("document %d is %s %s: %w", i, u.GetAPIVersion(), u.GetKind(), ErrNotCRD)
		}
		crds = append(crds, u)
	}
	if len(crds) == 0 {
		return nil, fmt.Errorf("empty CRD manifest: %w", ErrNotCRD)
	}
	return crds, nil
}

// crdResource returns the storage version's resource and whether it is
// namespaced.
func crdResource(crd *unstructured.Unstructured) (schema.GroupVersionResource, bool, error) {
	group, _, _ := unstructured.NestedString(crd.Object, "spec", "group")
	plural, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "plural")
	scope, _, _ := unstructured.NestedString(crd.Object, "spec", "scope")
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	for _, v := range versions {
		vm, ok := v.(map[string]any)
		if !ok {
			continue
		}
		if storage, _ := vm["storage"].(bool); storage {
			name, _ := vm["name"].(string)
			return schema.GroupVersionResource{Group: group, Version: name, Resource: plural}, scope == "Namespaced", nil
		}
	}
	return schema.GroupVersionResource{}, false, fmt.Errorf("CRD %s has no storage version: %w", crd.GetName(), ErrNotCRD)
}

func (cp *ControlPlane) waitCRDServed(ctx context.Context, name string, gvr schema.GroupVersionResource, namespaced bool) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for {
		err := cp.crdServed(ctx, name, gvr, namespaced)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for CRD %s: %w (last: %w)", name, ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

var errNotEstablished = errors.New("not established yet")

func (cp *ControlPlane) crdServed(ctx context.Context, name string, gvr schema.GroupVersionResource, namespaced bool) error {
	crd, err := cp.dynamic.Resource(crdGVR()).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("getting CRD %s: %w", name, err)
	}
	conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	established := false
	for _, c := range conds {
		cm, _ := c.(map[string]any)
		if cm["type"] == "Established" && cm["status"] == "True" {
			established = true
		}
	}
	if !established {
		return errNotEstablished
	}
	ri := cp.dynamic.Resource(gvr)
	var lerr error
	if namespaced {
		_, lerr = ri.Namespace(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{Limit: 1})
	} else {
		_, lerr = ri.List(ctx, metav1.ListOptions{Limit: 1})
	}
	if lerr != nil {
		return fmt.Errorf("listing %s: %w", gvr, lerr)
	}
	return nil
}
