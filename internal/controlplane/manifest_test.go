package controlplane

import "testing"

func TestDecodeObjects(t *testing.T) {
	t.Parallel()
	objs, err := DecodeObjects([]byte("---\napiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\n---\n" +
		"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: b, namespace: a}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 2 || objs[0].GetKind() != "Namespace" || objs[1].GetNamespace() != "a" {
		t.Fatalf("objects %v", objs)
	}
	if _, err := DecodeObjects([]byte("kind: [")); err == nil {
		t.Error("malformed YAML decoded")
	}
}
