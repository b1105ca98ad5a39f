package cgroups

import (
	"os"
	"testing"
	"time"
)

// burnerEnv turns the test binary into a CPU burner for the real-cgroup
// tests (re-exec of os.Args[0]). The burner stops by itself after
// burnerMaxLife so a crashed test never leaves it behind.
const (
	burnerEnv     = "UNDERSTORY_CGROUPS_TEST_BURNER"
	burnerMaxLife = 60 * time.Second
)

func TestMain(m *testing.M) {
	if os.Getenv(burnerEnv) == "1" {
		burn(burnerMaxLife)
		return
	}
	m.Run()
}

// burn spins one goroutine until d has passed.
func burn(d time.Duration) {
	deadline := time.Now().Add(d)
	x := uint64(1)
	for i := 0; ; i++ {
		x = x*6364136223846793005 + 1442695040888963407
		if i%(1<<20) == 0 && time.Now().After(deadline) {
			break
		}
	}
	if x == 0 {
		println(x)
	}
}
