package admission

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// KoordinatorScheduler is Koordinator's scheduler's name (koord-scheduler), which its
// colocation profiles write into spec.schedulerName. Once Koordinator is gone, a pod
// naming it stays Pending for ever: nothing schedules it.
const KoordinatorScheduler = "koord-scheduler"

// WithReplacedSchedulers makes pods that name one of names in spec.schedulerName (a
// scheduler that no longer runs, such as koord-scheduler after a migration) name the
// default scheduler instead, with a warning; the second-scheduler mode then applies
// as to any pod. NewMutator refuses a name that is not a valid scheduler name, the
// default scheduler's, or the second scheduler's own.
func WithReplacedSchedulers(names ...string) MutatorOption {
	return func(m *Mutator) { m.replaced = append(m.replaced, names...) }
}

// validateReplaced checks the replaced scheduler names against the mutator's own.
func (m *Mutator) validateReplaced() error {
	for _, n := range m.replaced {
		if err := ValidateSchedulerName(n); err != nil {
			return fmt.Errorf("replaced scheduler: %w", err)
		}
		if n == m.scheduler {
			return fmt.Errorf("replaced scheduler: %w %q: that is the second scheduler's own name", ErrInvalidSchedulerName, n)
		}
	}
	return nil
}

// replaceScheduler points out, if it names a replaced scheduler, at the default
// scheduler, and says so in res.
func (m *Mutator) replaceScheduler(out *corev1.Pod, res *Result) {
	cur := out.Spec.SchedulerName
	if cur == "" || !slices.Contains(m.replaced, cur) {
		return
	}
	out.Spec.SchedulerName = DefaultSchedulerName
	res.SchedulerName = DefaultSchedulerName
	res.Warnings = append(res.Warnings, fmt.Sprintf("understory: spec.schedulerName %s replaced by %s (that scheduler "+
		"no longer runs here; docs/from-koordinator.md)", cur, DefaultSchedulerName))
}
