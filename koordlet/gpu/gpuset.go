package gpu

// syncGPUs brings a per-GPU table in line with one step's observations: entries of GPUs
// not observed are dropped, each observed GPU (an empty UUID is skipped) gets an entry,
// new ones zero, and each(entry, observation) updates it.
func syncGPUs[T, O any](m map[string]*T, obs []O, uuid func(O) string, each func(*T, O)) {
	for u := range m {
		seen := false
		for _, o := range obs {
			if uuid(o) == u {
				seen = true
				break
			}
		}
		if !seen {
			delete(m, u)
		}
	}
	for _, o := range obs {
		u := uuid(o)
		if u == "" {
			continue
		}
		g := m[u]
		if g == nil {
			g = new(T)
			m[u] = g
		}
		each(g, o)
	}
}
