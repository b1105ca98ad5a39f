package signals

import (
	"context"
	"time"

	"github.com/understory/understory/koordlet/signals/psi"
)

// psiWatcher adapts psi.Watcher to triggers: its events become trigger values on a
// channel of the source's own, so fakes need no psi.Event.
type psiWatcher struct {
	w   *psi.Watcher
	out chan trigger
}

var _ triggers = (*psiWatcher)(nil)

func newPSIWatcher() (*psiWatcher, error) {
	w, err := psi.NewWatcher()
	if err != nil {
		return nil, err
	}
	return &psiWatcher{w: w, out: make(chan trigger)}, nil
}

func (p *psiWatcher) Add(key, path string, stall, window time.Duration) error {
	return p.w.Add(key, path, stall, window)
}

func (p *psiWatcher) Remove(key string) error { return p.w.Remove(key) }
func (p *psiWatcher) Events() <-chan trigger  { return p.out }
func (p *psiWatcher) Close() error            { return p.w.Close() }

// Run runs the watcher and forwards its events until it stops (ctx, Close).
func (p *psiWatcher) Run(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range p.w.C() {
			select {
			case p.out <- trigger{key: ev.Key, at: ev.Time, gone: ev.Gone}:
			case <-ctx.Done():
				return
			}
		}
	}()
	err := p.w.Run(ctx)
	<-done
	return err
}
