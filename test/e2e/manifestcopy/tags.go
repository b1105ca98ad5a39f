package manifestcopy

import (
	"fmt"
	"os"

	"sigs.k8s.io/yaml"
)

// ImageTags returns the newTag of each entry of a kustomization's images: (by image
// name), the tags an install of that kustomization asks for.
func ImageTags(path string) (map[string]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var k struct {
		Images []struct {
			Name   string `json:"name"`
			NewTag string `json:"newTag"`
		} `json:"images"`
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	out := make(map[string]string, len(k.Images))
	for _, i := range k.Images {
		out[i.Name] = i.NewTag
	}
	return out, nil
}
