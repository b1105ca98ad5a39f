package cgroups

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/understory/understory/cgroups/cgroupstest"
	"github.com/understory/understory/internal/testenv"
)

// burnerEnv turns the test binary into a CPU burner for the real-cgroup
// tests (re-exec of os.Args[0]). The burner stops by itself after
// burnerMaxLife so a crashed test never leaves it behind.
const (
	burnerEnv     = "UNDERSTORY_CGROUPS_TEST_BURNER"
	burnerMaxLife = 60 * time.Second
)

// memHogEnv turns the test binary into a memory helper for the real memory
// tests: "anon:<MiB>" allocates and touches anonymous memory, "file:<MiB>:<path>"
// writes and fsyncs a file (clean page cache charged to its memory cgroup).
// It waits for a line on stdin first (the test moves it into the group
// meanwhile), prints "ready" when done, then holds the memory until stdin
// closes or burnerMaxLife passes.
const memHogEnv = "UNDERSTORY_CGROUPS_TEST_MEMHOG"

// TestMain runs the tests, failing the run if they leave a file descriptor open (the
// agent holds a cgroup file open per group: a leak there is a leak in production).
func TestMain(m *testing.M) {
	if os.Getenv(burnerEnv) == "1" {
		cgroupstest.Burn(burnerMaxLife)
		return
	}
	if spec := os.Getenv(memHogEnv); spec != "" {
		if err := memHog(spec); err != nil {
			fmt.Fprintln(os.Stderr, "memhog:", err)
			os.Exit(2)
		}
		return
	}
	os.Exit(testenv.RunCheckingFDs(m))
}

func memHog(spec string) error {
	go func() {
		time.Sleep(burnerMaxLife)
		os.Exit(3)
	}()
	in := bufio.NewReader(os.Stdin)
	if _, err := in.ReadString('\n'); err != nil {
		return err
	}
	kind, rest, _ := strings.Cut(spec, ":")
	sizeStr, path, _ := strings.Cut(rest, ":")
	mib, err := strconv.Atoi(sizeStr)
	if err != nil {
		return err
	}
	var hold [][]byte
	switch kind {
	case "anon":
		for range mib {
			b := make([]byte, 1<<20)
			for i := 0; i < len(b); i += 4096 {
				b[i] = 1
			}
			hold = append(hold, b)
		}
	case "file":
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		chunk := make([]byte, 1<<20)
		for range mib {
			if _, err := f.Write(chunk); err != nil {
				return err
			}
		}
		if err := f.Sync(); err != nil {
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	default:
		return fmt.Errorf("unknown kind %q", kind)
	}
	fmt.Println("ready")
	_, _ = in.ReadString('\n') // until the test closes stdin
	runtime.KeepAlive(hold)
	return nil
}
