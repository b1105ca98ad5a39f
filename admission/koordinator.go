package admission

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/understory/understory/contract"
)

// renameKoordinatorResources renames Koordinator's batch resources
// (kubernetes.io/batch-cpu, kubernetes.io/batch-memory) to Understory's in every
// container's requests and limits: the same units, so the value is kept as written.
// Nodes publish only Understory's names, so a pod left on Koordinator's would stay
// Pending. A container that sets both names of one resource is refused (ErrRejected):
// which one it meant is a guess. It reports whether it renamed anything; on an error
// pod is partly modified and must be discarded.
func renameKoordinatorResources(pod *corev1.Pod) (bool, error) {
	renamed := false
	for _, set := range []struct {
		path string
		cs   []corev1.Container
	}{{"spec.initContainers", pod.Spec.InitContainers}, {"spec.containers", pod.Spec.Containers}} {
		for i := range set.cs {
			c := &set.cs[i]
			for _, canonical := range []corev1.ResourceName{contract.ResourceBatchCPU, contract.ResourceBatchMemory} {
				alias := corev1.ResourceName(contract.KoordinatorAlias(string(canonical)))
				for _, l := range []struct {
					name string
					list *corev1.ResourceList
				}{{"requests", &c.Resources.Requests}, {"limits", &c.Resources.Limits}} {
					q, ok := (*l.list)[alias]
					if !ok {
						continue
					}
					if _, both := (*l.list)[canonical]; both {
						return false, fmt.Errorf("%w: %s[%d] (%q).resources.%s: sets both %s and its Koordinator "+
							"alias %s; set %s only", ErrRejected, set.path, i, c.Name, l.name, canonical, alias, canonical)
					}
					*l.list = l.list.DeepCopy()
					delete(*l.list, alias)
					(*l.list)[canonical] = q
					renamed = true
				}
			}
		}
	}
	return renamed, nil
}
