package signals

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/understory/understory/koordlet/signals/psi"
	"github.com/understory/understory/koordlet/signals/runqlat"
	"github.com/understory/understory/qos"
)

var t0 = time.Unix(1_800_000_000, 0)

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestQueueTakesEarliestFirstAndWakes(t *testing.T) {
	t.Parallel()
	q := newQueue(discard())
	q.report(Harm{Signal: qos.SignalPSICPU, At: t0.Add(2 * time.Millisecond)})
	q.report(Harm{Signal: qos.SignalPSIMemory, At: t0.Add(time.Millisecond)})
	select {
	case <-q.wake:
	default:
		t.Fatal("no wake-up after a report")
	}
	got, err := q.take([]Harm{{Signal: "kept"}})
	if err != nil || len(got) != 3 || got[0].Signal != "kept" || got[1].Signal != qos.SignalPSIMemory ||
		got[2].Signal != qos.SignalPSICPU {
		t.Fatalf("take = %+v, %v; want dst kept, then earliest first", got, err)
	}
	q.fail(errors.New("first"))
	q.fail(errors.New("second"))
	for range maxQueued + 5 {
		q.report(Harm{Signal: qos.SignalRunqueueDelay, At: t0})
	}
	got, err = q.take(nil)
	if len(got) != maxQueued || err == nil || err.Error() != "first" {
		t.Fatalf("take = %d harms, %v; want %d and the first error", len(got), err, maxQueued)
	}
	if got, err := q.take(nil); len(got) != 0 || err != nil {
		t.Fatalf("second take = %+v, %v; want nothing", got, err)
	}
}

func TestParseMode(t *testing.T) {
	t.Parallel()
	for _, m := range []string{"auto", "ebpf", "psi", "sampling"} {
		if got, err := ParseMode(m); err != nil || string(got) != m {
			t.Errorf("ParseMode(%q) = %q, %v", m, got, err)
		}
	}
	for _, m := range []string{"", "EBPF", "bpf", "psi "} {
		if _, err := ParseMode(m); !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("ParseMode(%q) = %v, want ErrInvalidOptions", m, err)
		}
	}
}

func TestReason(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("ebpf: %w", runqlat.ErrPermission), ReasonPermission},
		{fmt.Errorf("ebpf: %w", errors.Join(fmt.Errorf("a: %w", runqlat.ErrNoBTF), fmt.Errorf("b: %w", runqlat.ErrNoTracefs))),
			ReasonNoBTF},
		{fmt.Errorf("ebpf: %w", runqlat.ErrNoTracefs), ReasonNoTracefs},
		{fmt.Errorf("ebpf: %w", ErrNoCgroup2), ReasonNoCgroup2},
		{fmt.Errorf("psi: %w", psi.ErrUnsupported), ReasonUnsupported},
		{fmt.Errorf("psi: %w", psi.ErrPermission), ReasonPermission},
		{errors.New("something else"), ReasonError},
	} {
		if got := Reason(tc.err); got != tc.want {
			t.Errorf("Reason(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

// fakeOpener opens a fake source of mode, or fails with err.
func fakeOpener(mode Mode, err error, opened *[]Mode) Opener {
	return Opener{Mode: mode, Open: func(Options) (Source, error) {
		*opened = append(*opened, mode)
		if err != nil {
			return nil, err
		}
		return fakeSource{mode: mode}, nil
	}}
}

type fakeSource struct {
	sampling
	mode Mode
}

func (f fakeSource) Mode() Mode { return f.mode }

// The modes start the fallback chain where they name it, and every source that could
// not be opened is in the State with its reason.
func TestOpenWithFallsBackInOrder(t *testing.T) {
	t.Parallel()
	denied := fmt.Errorf("ebpf: %w", runqlat.ErrPermission)
	noPSI := fmt.Errorf("psi: %w", psi.ErrUnsupported)
	tests := []struct {
		name            string
		mode            Mode
		ebpfErr, psiErr error
		tried           []Mode
		active          Mode
		fallbacks       string
	}{
		{"auto, eBPF works", ModeAuto, nil, nil, []Mode{ModeEBPF}, ModeEBPF, ""},
		{"zero mode is auto", "", denied, nil, []Mode{ModeEBPF, ModePSI}, ModePSI, "ebpf:permission"},
		{"auto, nothing works", ModeAuto, denied, noPSI, []Mode{ModeEBPF, ModePSI}, ModeSampling,
			"ebpf:permission,psi:unsupported"},
		{"ebpf denied falls back to psi", ModeEBPF, denied, nil, []Mode{ModeEBPF, ModePSI}, ModePSI, "ebpf:permission"},
		{"psi never tries eBPF", ModePSI, nil, noPSI, []Mode{ModePSI}, ModeSampling, "psi:unsupported"},
		{"sampling tries nothing", ModeSampling, nil, nil, nil, ModeSampling, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var tried []Mode
			src, st, err := OpenWith(Options{Mode: tc.mode},
				[]Opener{fakeOpener(ModeEBPF, tc.ebpfErr, &tried), fakeOpener(ModePSI, tc.psiErr, &tried)})
			if err != nil {
				t.Fatal(err)
			}
			var fb []string
			for _, f := range st.Fallbacks {
				fb = append(fb, string(f.Mode)+":"+f.Reason)
				if f.Error == "" {
					t.Errorf("fallback %+v without its error", f)
				}
			}
			want := tc.mode
			if want == "" {
				want = ModeAuto
			}
			if st.Active != tc.active || src.Mode() != tc.active || st.Requested != want ||
				strings.Join(fb, ",") != tc.fallbacks || fmt.Sprint(tried) != fmt.Sprint(tc.tried) {
				t.Fatalf("state %+v, source %s, tried %v; want %s after %v with fallbacks %q",
					st, src.Mode(), tried, tc.active, tc.tried, tc.fallbacks)
			}
			if s := st.String(); !strings.Contains(s, string(tc.active)) {
				t.Fatalf("State.String() = %q", s)
			}
		})
	}
	if _, _, err := OpenWith(Options{Mode: "bpf"}, nil); !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("bad mode: %v, want ErrInvalidOptions", err)
	}
}

// A v1-only node (no cgroup2) and a fake root that is not a cgroup2 mount have neither
// eBPF nor PSI: Open ends at sampling and says why.
func TestOpenWithoutCgroup2(t *testing.T) {
	t.Parallel()
	for _, root := range []string{"", t.TempDir()} {
		src, st, err := Open(Options{Cgroup2Root: root, ProcRoot: t.TempDir(), Logger: discard()})
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close()
		if st.Active != ModeSampling || len(st.Fallbacks) != 2 || st.Fallbacks[0].Reason != ReasonNoCgroup2 {
			t.Fatalf("root %q: state %+v; want sampling after eBPF (no_cgroup2) and PSI", root, st)
		}
		if root == "" && st.Fallbacks[1].Reason != ReasonNoCgroup2 {
			t.Fatalf("no cgroup2: PSI fallback %+v, want no_cgroup2", st.Fallbacks[1])
		}
	}
}
