package cgroups

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// LoweredLimit is a descendant's CFS limit that LowerDescendantCPULimits changed: Rel is
// the descendant's path relative to the hierarchy root, Was the limit it had.
type LoweredLimit struct {
	Rel string
	Was CFSLimit
}

// LowerDescendantCPULimits lowers, on cgroup v1, the CFS limit of every descendant
// whose quota/period ratio is above quota/period to that ratio (each at its own period,
// the deepest first), so that the group itself can then be cut to quota/period: v1
// refuses a group's limit below a descendant's (a cut of an in-place batch pod below
// its container's own limit). It returns what it changed, with the limits they had,
// for the caller to put back when the group is raised again (RaiseDescendantCPULimits).
// A descendant whose period is too short for the ratio (below MinCFSQuota) keeps
// MinCFSQuota. v2 min()s the limits along the path and needs nothing: it returns nil.
// Descendants that vanish during the walk are skipped.
func (g *Group) LowerDescendantCPULimits(quota, period time.Duration) ([]LoweredLimit, error) {
	if g.h.layout == LayoutV2 || quota < 0 {
		return nil, nil
	}
	if period < MinCFSPeriod || period > MaxCFSPeriod {
		return nil, fmt.Errorf("lowering cpu limits below %s: period %v outside [%v,%v]: %w", g.rel, period,
			MinCFSPeriod, MaxCFSPeriod, ErrInvalidValue)
	}
	q, p := quota.Microseconds(), period.Microseconds()
	type found struct {
		dir, rel string
		q, p     int64
	}
	var over []found
	dir := g.cpuDir()
	err := filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			if path != dir && isGone(err) {
				return nil
			}
			return err
		}
		if !e.IsDir() || path == dir {
			return nil
		}
		cq, cp, err := dirCFS(path).readCFS()
		if err != nil {
			if errors.Is(err, ErrNotExist) || errors.Is(err, ErrUnsupported) {
				return fs.SkipDir
			}
			return err
		}
		if cq >= 0 && cp > 0 && ratioLess(q, p, cq, cp) {
			rel, _ := filepath.Rel(dir, path)
			over = append(over, found{dir: path, rel: g.rel + "/" + filepath.ToSlash(rel), q: cq, p: cp})
		}
		return nil
	})
	if err != nil {
		return nil, classify("reading cfs limits below", dir, "", err)
	}
	// The deepest first: a child may not be left above its own descendants' limits
	// (the kernel checks the whole subtree on every write).
	slices.SortStableFunc(over, func(a, b found) int {
		return strings.Count(b.rel, "/") - strings.Count(a.rel, "/")
	})
	var lowered []LoweredLimit
	for _, f := range over {
		nq := max(int64(float64(q)*float64(f.p)/float64(p)), MinCFSQuota.Microseconds())
		if err := applyCFS(dirCFS(f.dir), nq, f.p); err != nil && !errors.Is(err, ErrClamped) {
			if errors.Is(err, ErrNotExist) {
				continue
			}
			return lowered, fmt.Errorf("lowering the cpu limit of %s: %w", f.rel, err)
		}
		lowered = append(lowered, LoweredLimit{Rel: f.rel, Was: CFSLimit{Quota: cfsDuration(f.q), Period: cfsDuration(f.p)}})
	}
	return lowered, nil
}

// RaiseDescendantCPULimits puts back descendants' limits that LowerDescendantCPULimits
// lowered, as far as the group's new limit quota/period allows: each gets the lower of
// its old limit and that ratio at its own period, the shallowest first. It returns the
// ones still below their old limit (to raise again on a later raise); a descendant that
// is gone is dropped.
func (h *Hierarchy) RaiseDescendantCPULimits(lowered []LoweredLimit, quota, period time.Duration) ([]LoweredLimit, error) {
	if len(lowered) == 0 {
		return nil, nil
	}
	todo := slices.Clone(lowered)
	slices.SortStableFunc(todo, func(a, b LoweredLimit) int {
		return strings.Count(a.Rel, "/") - strings.Count(b.Rel, "/")
	})
	var left []LoweredLimit
	var firstErr error
	for _, l := range todo {
		want := l.Was
		if quota >= 0 && period > 0 {
			// The group's ratio at the descendant's period.
			capQ := time.Duration(float64(quota) * float64(l.Was.Period) / float64(period)).Truncate(time.Microsecond)
			if l.Was.Quota < 0 || capQ < l.Was.Quota {
				want.Quota = max(capQ, MinCFSQuota)
			}
		}
		g, err := h.Load(l.Rel)
		if err != nil {
			continue // gone
		}
		if err := g.SetCPULimit(want.Quota, want.Period); err != nil && !errors.Is(err, ErrClamped) {
			if errors.Is(err, ErrNotExist) {
				continue
			}
			if firstErr == nil {
				firstErr = fmt.Errorf("raising the cpu limit of %s: %w", l.Rel, err)
			}
			left = append(left, l)
			continue
		}
		if want != l.Was {
			left = append(left, l)
		}
	}
	return left, firstErr
}
