package runqlat

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// roleEnv turns the test binary into a helper process for the real tests
// (re-exec of os.Args[0]):
//
//   - "burn": a busy loop;
//   - "idle-burn": a busy loop on a thread with SCHED_IDLE (a batch task);
//   - "victim": sleeps 1 ms and spins 100 µs, over and over, so it is woken
//     about 900 times a second and each time waits for the CPU;
//   - "denied": calls Load (run without BPF privileges) and exits 0 when the
//     error wraps ErrPermission, 1 otherwise.
//
// burn and victim stop by themselves after helperMaxLife so a crashed test
// never leaves them behind.
const (
	roleEnv       = "UNDERSTORY_RUNQLAT_TEST_ROLE"
	helperMaxLife = 30 * time.Second
	schedIdle     = 5 // SCHED_IDLE (include/uapi/linux/sched.h)
)

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "":
		os.Exit(m.Run())
	case "burn":
		deadline := time.Now().Add(helperMaxLife)
		for time.Now().Before(deadline) {
			spin(10 * time.Millisecond)
		}
	case "idle-burn":
		runtime.LockOSThread()
		if err := unix.SchedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: schedIdle}, 0); err != nil {
			fmt.Printf("sched_setattr(SCHED_IDLE): %v\n", err)
			os.Exit(1)
		}
		deadline := time.Now().Add(helperMaxLife)
		for time.Now().Before(deadline) {
			spin(10 * time.Millisecond)
		}
	case "victim":
		deadline := time.Now().Add(helperMaxLife)
		for time.Now().Before(deadline) {
			_ = unix.Nanosleep(&unix.Timespec{Nsec: int64(time.Millisecond)}, nil)
			spin(100 * time.Microsecond)
		}
	case "denied":
		p, err := Load(Options{})
		if err == nil {
			p.Close()
			fmt.Println("Load succeeded without privileges")
			os.Exit(1)
		}
		if !errors.Is(err, ErrPermission) {
			fmt.Printf("Load: %v, want ErrPermission\n", err)
			os.Exit(1)
		}
		fmt.Printf("Load: %v\n", err)
	default:
		os.Exit(2)
	}
}

// spin burns CPU for d of wall time.
func spin(d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); {
	}
}
