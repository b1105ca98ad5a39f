package testenv

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// fdHelperEnv turns the test binary into the helper process of
// TestRunCheckingFDsNetpoller (re-exec of os.Args[0]): "netpoller" checks that the
// runtime has not started its netpoller yet, then runs the tests -run picks under
// RunCheckingFDs.
const fdHelperEnv = "UNDERSTORY_TESTENV_FD_HELPER"

// netpollerStartedExit is the helper's exit code when the netpoller was started before
// TestMain: the helper then cannot show that RunCheckingFDs keeps it out of the leaks.
const netpollerStartedExit = 3

// TestMain checks this package's own tests for descriptor leaks, as the packages that
// use RunCheckingFDs do.
func TestMain(m *testing.M) {
	if os.Getenv(fdHelperEnv) == "netpoller" {
		fds, err := openFDs()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		for _, fd := range fds {
			if strings.HasPrefix(fd.Target, "anon_inode:[eventpoll]") {
				fmt.Fprintf(os.Stderr, "netpoller started before TestMain: %s\n", fd)
				os.Exit(netpollerStartedExit)
			}
		}
	}
	os.Exit(RunCheckingFDs(m))
}
