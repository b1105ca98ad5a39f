package duty

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/understory/understory/cgroups"
)

// RecoverTimeout bounds the thaw of one group in ThawStale, so that one group stuck
// FREEZING (a task in D state) does not hold up the others.
const RecoverTimeout = time.Second

// ThawStale thaws every group in groups, for the agent's start: a run that crashed or was
// killed (SIGKILL, OOM) while the cycler had groups frozen leaves them frozen, and nothing
// else ever thaws them. The agent decides which groups (its batch pods' cgroups, found
// again at start) and then decides their duties afresh.
//
// Every group gets a thaw write, even one that does not read as frozen: a v1 group left
// FREEZING reads as not frozen. stale lists the groups that read as frozen before. Groups
// that vanished are skipped; the others' errors are joined, each wrapping ErrThaw. Each
// thaw is bounded by RecoverTimeout and ctx.
func ThawStale(ctx context.Context, groups []*cgroups.Group) (stale []string, err error) {
	var errs []error
	for _, g := range groups {
		if g == nil {
			continue
		}
		frozen, ferr := g.Frozen()
		if errors.Is(ferr, cgroups.ErrNotExist) {
			continue
		}
		opCtx, cancel := context.WithTimeout(ctx, RecoverTimeout)
		terr := g.ThawContext(opCtx)
		cancel()
		switch {
		case errors.Is(terr, cgroups.ErrNotExist):
			continue
		case terr != nil:
			errs = append(errs, fmt.Errorf("thawing cgroup %s left frozen: %w: %w", g.Path(), ErrThaw, terr))
			continue
		}
		if frozen {
			stale = append(stale, g.Path())
		}
	}
	return stale, errors.Join(errs...)
}
