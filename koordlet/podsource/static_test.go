package podsource

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// waitTimeout bounds how long event-driven tests wait; they normally finish
// in milliseconds.
const waitTimeout = 10 * time.Second

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeAtomic writes via a temporary dotfile and renames it into place.
func writeAtomic(t *testing.T, path, data string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	writeFile(t, tmp, data)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func podNames(pods []*corev1.Pod) []string {
	out := make([]string, 0, len(pods))
	for _, p := range pods {
		out = append(out, p.Namespace+"/"+p.Name)
	}
	return out
}

func errKeys(m map[string]error) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, filepath.Base(k))
	}
	slices.Sort(out)
	return out
}

func drain(ch <-chan struct{}) {
	select {
	case <-ch:
	default:
	}
}

func signalled(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// waitFor waits on ch until cond holds. It never polls on its own, so in
// inotify tests (poll interval 1 h) only inotify can make it pass.
func waitFor(t *testing.T, ch <-chan struct{}, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(waitTimeout)
	defer deadline.Stop()
	for !cond() {
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func TestStaticScan(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		setup    func(t *testing.T, dir string)
		wantPods []string
		wantErrs map[string]error // base name -> sentinel (nil: any error)
	}{
		{
			name:     "empty directory",
			setup:    func(*testing.T, string) {},
			wantPods: []string{},
			wantErrs: map[string]error{},
		},
		{
			name: "extensions, dotfiles and subdirectories",
			setup: func(t *testing.T, dir string) {
				writeFile(t, filepath.Join(dir, "b.yaml"), podYAML("b", "ub"))
				writeFile(t, filepath.Join(dir, "a.yml"), podYAML("a", "ua"))
				writeFile(t, filepath.Join(dir, "c.json"), `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"c","namespace":"ns","uid":"uc"}}`)
				writeFile(t, filepath.Join(dir, ".hidden.yaml"), podYAML("hidden", "uh"))
				writeFile(t, filepath.Join(dir, "d.yaml~"), podYAML("backup", "ud"))
				writeFile(t, filepath.Join(dir, "notes.txt"), "not a pod")
				if err := os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o755); err != nil {
					t.Fatal(err)
				}
				writeFile(t, filepath.Join(dir, "sub.yaml", "e.yaml"), podYAML("nested", "ue"))
			},
			wantPods: []string{"default/a", "default/b", "ns/c"},
			wantErrs: map[string]error{},
		},
		{
			name: "invalid file is reported and skipped",
			setup: func(t *testing.T, dir string) {
				writeFile(t, filepath.Join(dir, "a.yaml"), podYAML("a", "ua"))
				writeFile(t, filepath.Join(dir, "b.yaml"), "apiVersion: v1\nkind: Pod\nmetadata:\n  name: b\n")
			},
			wantPods: []string{"default/a"},
			wantErrs: map[string]error{"b.yaml": ErrInvalidManifest},
		},
		{
			name: "duplicate uid keeps first by file name",
			setup: func(t *testing.T, dir string) {
				writeFile(t, filepath.Join(dir, "b.yaml"), podYAML("second", "same"))
				writeFile(t, filepath.Join(dir, "a.yaml"), podYAML("first", "same"))
				writeFile(t, filepath.Join(dir, "c.yaml"), podYAML("third", "same"))
			},
			wantPods: []string{"default/first"},
			wantErrs: map[string]error{"b.yaml": ErrDuplicateUID, "c.yaml": ErrDuplicateUID},
		},
		{
			name: "file over 1 MiB",
			setup: func(t *testing.T, dir string) {
				writeFile(t, filepath.Join(dir, "big.yaml"), podYAML("big", "u")+"#"+strings.Repeat("x", MaxManifestSize))
			},
			wantPods: []string{},
			wantErrs: map[string]error{"big.yaml": ErrManifestTooLarge},
		},
		{
			name: "fifo is rejected without blocking",
			setup: func(t *testing.T, dir string) {
				if err := syscall.Mkfifo(filepath.Join(dir, "fifo.yaml"), 0o644); err != nil {
					t.Skipf("mkfifo: %v", err)
				}
			},
			wantPods: []string{},
			wantErrs: map[string]error{"fifo.yaml": ErrNotRegular},
		},
		{
			name: "symlinks are followed, dangling ones reported",
			setup: func(t *testing.T, dir string) {
				target := filepath.Join(t.TempDir(), "real.yaml")
				writeFile(t, target, podYAML("linked", "ul"))
				if err := os.Symlink(target, filepath.Join(dir, "linked.yaml")); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(filepath.Join(dir, "missing"), filepath.Join(dir, "dangling.yaml")); err != nil {
					t.Fatal(err)
				}
			},
			wantPods: []string{"default/linked"},
			wantErrs: map[string]error{"dangling.yaml": fs.ErrNotExist},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			tc.setup(t, dir)
			s := NewStatic(dir, nil)
			s.scan()
			if got := podNames(s.List()); !slices.Equal(got, tc.wantPods) {
				t.Errorf("pods = %v, want %v", got, tc.wantPods)
			}
			errs := s.Errors()
			if got, want := errKeys(errs), slices.Sorted(maps.Keys(tc.wantErrs)); !slices.Equal(got, want) {
				t.Errorf("error files = %v, want %v (%v)", got, want, errs)
			}
			for path, err := range errs {
				if want := tc.wantErrs[filepath.Base(path)]; want != nil && !errors.Is(err, want) {
					t.Errorf("%s: err = %v, want %v", path, err, want)
				}
				if !strings.Contains(err.Error(), path) {
					t.Errorf("error for %s does not name the file: %v", path, err)
				}
			}
		})
	}
}

func TestStaticKeepsLastGood(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "web.yaml")
	s := NewStatic(dir, nil)
	ch := s.Changed()

	steps := []struct {
		name        string
		do          func()
		wantNames   []string
		wantAnno    string // understory.io/qos of the first pod
		wantErr     error
		wantChanged bool
	}{
		{"create", func() { writeFile(t, path, podYAML("web", "u1")) }, []string{"default/web"}, "BE", nil, true},
		{"rescan unchanged", func() {}, []string{"default/web"}, "BE", nil, false},
		{"break", func() { writeFile(t, path, "kind: Pod\nmetadata: [") }, []string{"default/web"}, "BE", ErrInvalidManifest, false},
		{"truncate", func() { writeFile(t, path, "") }, []string{"default/web"}, "BE", ErrInvalidManifest, false},
		{"unreadable", func() {
			writeFile(t, path, podYAML("web", "u1")+"#"+strings.Repeat("x", MaxManifestSize))
		}, []string{"default/web"}, "BE", ErrManifestTooLarge, false},
		{"fix with new content", func() {
			writeFile(t, path, strings.Replace(podYAML("web", "u1"), "BE", "LS", 1))
		}, []string{"default/web"}, "LS", nil, true},
		{"delete", func() {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		}, []string{}, "", nil, true},
	}
	var last *corev1.Pod
	for _, st := range steps {
		drain(ch)
		st.do()
		s.scan()
		pods := s.List()
		if got := podNames(pods); !slices.Equal(got, st.wantNames) {
			t.Fatalf("%s: pods = %v, want %v", st.name, got, st.wantNames)
		}
		if len(pods) > 0 {
			if got := pods[0].Annotations["understory.io/qos"]; got != st.wantAnno {
				t.Errorf("%s: qos annotation = %q, want %q", st.name, got, st.wantAnno)
			}
			if !st.wantChanged && pods[0] != last {
				t.Errorf("%s: pod object replaced although nothing changed", st.name)
			}
			last = pods[0]
		}
		err := s.Errors()[path]
		if st.wantErr == nil && err != nil {
			t.Errorf("%s: unexpected error %v", st.name, err)
		}
		if st.wantErr != nil && !errors.Is(err, st.wantErr) {
			t.Errorf("%s: err = %v, want %v", st.name, err, st.wantErr)
		}
		if got := signalled(ch); got != st.wantChanged {
			t.Errorf("%s: Changed signalled = %v, want %v", st.name, got, st.wantChanged)
		}
	}
}

func TestStaticDuplicateFallsBackToLastGood(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")
	writeFile(t, a, podYAML("a", "u1"))
	writeFile(t, b, podYAML("b", "u2"))
	s := NewStatic(dir, nil)
	s.scan()

	// b now claims a's UID: b keeps serving its last good pod (u2).
	writeFile(t, b, podYAML("b-new", "u1"))
	s.scan()
	if got, want := podNames(s.List()), []string{"default/a", "default/b"}; !slices.Equal(got, want) {
		t.Fatalf("pods = %v, want %v", got, want)
	}
	if err := s.Errors()[b]; !errors.Is(err, ErrDuplicateUID) || !strings.Contains(err.Error(), a) {
		t.Fatalf("b error = %v, want ErrDuplicateUID naming %s", err, a)
	}
	// A persistent problem counts once, not once per scan.
	s.scan()
	if n := s.ErrorCount(); n != 1 {
		t.Fatalf("ErrorCount = %d after one problem seen twice, want 1", n)
	}

	// Once a is gone the UID is free and b's current content is served.
	if err := os.Remove(a); err != nil {
		t.Fatal(err)
	}
	s.scan()
	pods := s.List()
	if got, want := podNames(pods), []string{"default/b-new"}; !slices.Equal(got, want) {
		t.Fatalf("pods = %v, want %v", got, want)
	}
	if pods[0].UID != "u1" {
		t.Errorf("uid = %s", pods[0].UID)
	}
	if errs := s.Errors(); len(errs) != 0 {
		t.Errorf("errors = %v", errs)
	}
}

func TestStaticDirectoryRemovedKeepsPods(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "manifests")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "a.yaml"), podYAML("a", "u1"))
	s := NewStatic(dir, nil)
	s.scan()

	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	s.scan()
	if got := podNames(s.List()); !slices.Equal(got, []string{"default/a"}) {
		t.Fatalf("pods after directory removal = %v", got)
	}
	if err := s.Errors()[dir]; !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("directory error = %v", err)
	}

	// The directory comes back empty: that is an explicit empty set.
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s.scan()
	if got := s.List(); len(got) != 0 {
		t.Errorf("pods = %v, want none", podNames(got))
	}
	if errs := s.Errors(); len(errs) != 0 {
		t.Errorf("errors = %v", errs)
	}
}

func TestStaticRunSetupErrors(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "file")
	writeFile(t, file, "x")
	tests := []struct {
		name string
		dir  string
		want error
	}{
		{"missing", filepath.Join(t.TempDir(), "nope"), fs.ErrNotExist},
		{"not a directory", file, ErrNotDirectory},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := NewStatic(tc.dir, nil)
			if err := s.Run(t.Context()); !errors.Is(err, tc.want) {
				t.Errorf("Run = %v, want %v", err, tc.want)
			}
			if s.HasSynced() {
				t.Error("synced after failed setup")
			}
		})
	}
}

// runStatic runs s in the background and stops it at cleanup.
func runStatic(t *testing.T, s *Static) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	waitFor(t, s.Changed(), "first sync", s.HasSynced)
}

func TestStaticRunTwice(t *testing.T) {
	t.Parallel()
	s := NewStatic(t.TempDir(), nil, WithPollInterval(time.Hour))
	runStatic(t, s)
	if err := s.Run(t.Context()); !errors.Is(err, ErrAlreadyRunning) {
		t.Errorf("second Run = %v, want ErrAlreadyRunning", err)
	}
}

// TestStaticInotify uses a one-hour poll so every change must arrive through
// inotify.
func TestStaticInotify(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), podYAML("a", "ua"))
	s := NewStatic(dir, slog.New(slog.DiscardHandler), WithPollInterval(time.Hour))
	runStatic(t, s)
	if got := podNames(s.List()); !slices.Equal(got, []string{"default/a"}) {
		t.Fatalf("initial pods = %v", got)
	}

	has := func(want ...string) func() bool {
		return func() bool { return slices.Equal(podNames(s.List()), want) }
	}
	writeFile(t, filepath.Join(dir, "b.yaml"), podYAML("b", "ub")) // IN_CLOSE_WRITE
	waitFor(t, s.Changed(), "direct write", has("default/a", "default/b"))

	writeAtomic(t, filepath.Join(dir, "c.json"), podYAML("c", "uc")) // IN_MOVED_TO
	waitFor(t, s.Changed(), "rename into place", has("default/a", "default/b", "default/c"))

	if err := os.Rename(filepath.Join(dir, "c.json"), filepath.Join(dir, "c.disabled")); err != nil { // IN_MOVED_FROM
		t.Fatal(err)
	}
	waitFor(t, s.Changed(), "rename away", has("default/a", "default/b"))

	if err := os.Remove(filepath.Join(dir, "a.yaml")); err != nil { // IN_DELETE
		t.Fatal(err)
	}
	waitFor(t, s.Changed(), "delete", has("default/b"))

	// A broken file shows up in Errors (no Changed: the set is the same).
	writeFile(t, filepath.Join(dir, "b.yaml"), "kind: [")
	deadline := time.Now().Add(waitTimeout)
	for s.Errors()[filepath.Join(dir, "b.yaml")] == nil {
		if time.Now().After(deadline) {
			t.Fatal("error for broken b.yaml never recorded")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := podNames(s.List()); !slices.Equal(got, []string{"default/b"}) {
		t.Errorf("broken file lost its pod: %v", got)
	}
}

func TestStaticPollOnly(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := NewStatic(dir, nil, WithPollInterval(10*time.Millisecond), withoutInotify())
	runStatic(t, s)
	if n := len(s.List()); n != 0 {
		t.Fatalf("initial pods = %d", n)
	}
	writeFile(t, filepath.Join(dir, "a.yaml"), podYAML("a", "ua"))
	waitFor(t, s.Changed(), "poll to find a.yaml", func() bool { return len(s.List()) == 1 })
}

func TestStaticConcurrentReaders(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := NewStatic(dir, nil, WithPollInterval(time.Millisecond))
	runStatic(t, s)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				for _, p := range s.List() {
					if p.UID == "" {
						t.Error("pod without uid")
					}
				}
				_ = s.Errors()
			}
		})
	}
	name := func(i int) string { return filepath.Join(dir, string(rune('a'+i))+".yaml") }
	for i := range 20 {
		writeFile(t, name(i), podYAML(string(rune('a'+i)), string(rune('a'+i))))
	}
	waitFor(t, s.Changed(), "all files", func() bool { return len(s.List()) == 20 })
	for i := 0; i < 20; i += 3 {
		writeFile(t, name(i), "broken: [")
	}
	deadline := time.Now().Add(waitTimeout)
	for len(s.Errors()) != 7 {
		if time.Now().After(deadline) {
			t.Fatalf("errors = %d, want 7", len(s.Errors()))
		}
		time.Sleep(time.Millisecond)
	}
	if n := len(s.List()); n != 20 {
		t.Errorf("broken files lost pods: %d listed, want 20", n)
	}
	close(stop)
	wg.Wait()
}

func TestWatcherRewatch(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "m")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	w, err := newWatcher(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Skipf("inotify unavailable: %v", err)
	}
	defer w.close()

	waitLost := func(what string) {
		t.Helper()
		waitFor(t, w.events, what, w.lost)
	}
	// Directory deleted: the watch is gone until re-added.
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	waitLost("IN_DELETE_SELF/IN_IGNORED")
	if err := w.rewatch(); err == nil {
		t.Fatal("rewatch of a missing directory succeeded")
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := w.rewatch(); err != nil {
		t.Fatal(err)
	}
	drain(w.events)
	writeFile(t, filepath.Join(dir, "x.yaml"), "x")
	select {
	case <-w.events:
	case <-time.After(waitTimeout):
		t.Fatal("no inotify event after rewatch")
	}
	if w.lost() {
		t.Fatal("watch lost after a file write")
	}

	// Directory moved away: the watch must not follow the old inode.
	if err := os.Rename(dir, dir+".old"); err != nil {
		t.Fatal(err)
	}
	waitLost("IN_MOVE_SELF")
}

func TestIsManifestName(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]bool{
		"a.yaml": true, "a.yml": true, "a.json": true, "a.b.yaml": true,
		".a.yaml": false, "a.yaml~": false, "a.YAML": false, "a": false, "a.txt": false,
		"a.yaml.swp": false, ".yaml": false,
	} {
		if got := isManifestName(name); got != want {
			t.Errorf("isManifestName(%q) = %v, want %v", name, got, want)
		}
	}
}

// Files whose bytes did not change keep their pod object (no re-parse).
func TestStaticReparsesOnlyChangedFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), podYAML("a", "ua"))
	writeFile(t, filepath.Join(dir, "b.yaml"), podYAML("b", "ub"))
	s := NewStatic(dir, nil)
	s.scan()
	before := slices.Clone(s.List())
	writeFile(t, filepath.Join(dir, "b.yaml"), podYAML("b", "ub")+"# touched\n")
	s.scan()
	after := s.List()
	if after[0] != before[0] {
		t.Error("unchanged a.yaml was re-parsed")
	}
	if after[1] == before[1] {
		t.Error("changed b.yaml was not re-parsed")
	}
	if !bytes.Contains(s.files["b.yaml"].raw, []byte("# touched")) {
		t.Error("raw bytes not updated")
	}
}
