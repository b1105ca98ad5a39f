package timeslice

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// cDefines reads a C file's one-line #defines (name → body).
func cDefines(t *testing.T, path string) map[string]string {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defs := map[string]string{}
	re := regexp.MustCompile(`(?m)^#define\s+(\w+)\s+(.*?)\s*(?:/\*.*)?$`)
	for _, m := range re.FindAllStringSubmatch(string(src), -1) {
		defs[m[1]] = m[2]
	}
	return defs
}

// cValue evaluates the simple #define bodies of the shim's headers: decimal, hex and
// character constants with u/ull suffixes, other defines, one + or <<, parentheses.
func cValue(t *testing.T, defs map[string]string, expr string) uint64 {
	t.Helper()
	expr = strings.TrimSpace(expr)
	for strings.HasPrefix(expr, "(") && strings.HasSuffix(expr, ")") {
		expr = strings.TrimSpace(expr[1 : len(expr)-1])
	}
	for _, op := range []string{"<<", "+"} {
		if l, r, ok := strings.Cut(expr, op); ok {
			a, b := cValue(t, defs, l), cValue(t, defs, r)
			if op == "+" {
				return a + b
			}
			return a << b
		}
	}
	if body, ok := defs[expr]; ok {
		return cValue(t, defs, body)
	}
	if len(expr) == 3 && expr[0] == '\'' && expr[2] == '\'' {
		return uint64(expr[1])
	}
	n, err := strconv.ParseUint(strings.TrimRight(strings.ToLower(expr), "ul"), 0, 64)
	if err != nil {
		t.Fatalf("cannot evaluate C expression %q: %v", expr, err)
	}
	return n
}

// TestABIMatchesShimHeader holds the Go constants equal to shim/nvrm_abi.h and the
// shim's own defines, so that the agent and the shim speak the same numbers.
func TestABIMatchesShimHeader(t *testing.T) {
	t.Parallel()
	abi := cDefines(t, filepath.Join("shim", "nvrm_abi.h"))
	shim := cDefines(t, filepath.Join("shim", "understory_tsg.c"))
	for _, tc := range []struct {
		name string
		want uint64
	}{
		{"TSG_NV_IOCTL_MAGIC", IoctlMagic},
		{"TSG_NV_IOCTL_BASE", IoctlBase},
		{"TSG_NV_ESC_CHECK_VERSION_STR", EscCheckVersionStr},
		{"TSG_NV_ESC_IOCTL_XFER_CMD", EscIoctlXferCmd},
		{"TSG_NV_ESC_RM_FREE", EscRMFree},
		{"TSG_NV_ESC_RM_CONTROL", EscRMControl},
		{"TSG_NV_ESC_RM_ALLOC", EscRMAlloc},
		{"TSG_CLASS_KEPLER_CHANNEL_GROUP_A", ClassKeplerChannelGroupA},
		{"TSG_CTRL_CMD_SET_TIMESLICE", CtrlCmdSetTimeslice},
		{"TSG_CTRL_CMD_GET_TIMESLICE", CtrlCmdGetTimeslice},
		{"TSG_NVOS54_FLAGS_FINN_SERIALIZED", RMControlFlagSerialized},
		{"TSG_RM_API_VERSION_CMD_QUERY", RMAPIVersionCmdQuery},
		{"TSG_NV_OK", StatusOK},
	} {
		if got := cValue(t, abi, tc.name); got != tc.want {
			t.Errorf("nvrm_abi.h %s = %#x, Go says %#x", tc.name, got, tc.want)
		}
	}
	for _, tc := range []struct {
		name string
		want uint64
	}{
		{"TSG_MAX_SLICE_US", MaxTimesliceUS},
		{"TSG_DEFAULT_REPORT_MAX", DefaultReportMaxBytes},
	} {
		if got := cValue(t, shim, tc.name); got != tc.want {
			t.Errorf("understory_tsg.c %s = %d, Go says %d", tc.name, got, tc.want)
		}
	}
	for name, want := range map[string]string{
		"TSG_ENV_TIMESLICE":  EnvTimesliceUS,
		"TSG_ENV_REPORT":     EnvReport,
		"TSG_ENV_REPORT_MAX": EnvReportMaxBytes,
		"TSG_REPORT_VERSION": ReportVersion,
	} {
		if got := shim[name]; got != strconv.Quote(want) {
			t.Errorf("understory_tsg.c %s = %s, Go says %q", name, got, want)
		}
	}
	var branches []int
	for _, f := range strings.Split(abi["TSG_SUPPORTED_BRANCHES"], ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			t.Fatalf("TSG_SUPPORTED_BRANCHES: %v", err)
		}
		branches = append(branches, n)
	}
	if !slices.Equal(branches, SupportedBranches()) {
		t.Errorf("nvrm_abi.h supports branches %v, Go %v", branches, SupportedBranches())
	}

	// The structures' sizes, as the header's static assertions state them.
	src, err := os.ReadFile(filepath.Join("shim", "nvrm_abi.h"))
	if err != nil {
		t.Fatal(err)
	}
	sizes := map[string]uint64{}
	for _, m := range regexp.MustCompile(`sizeof\(struct (\w+)\) == (\d+)`).FindAllStringSubmatch(string(src), -1) {
		n, _ := strconv.ParseUint(m[2], 10, 64)
		sizes[m[1]] = n
	}
	for st, want := range map[string]uint64{
		"tsg_rm_alloc21":       SizeRMAlloc21,
		"tsg_rm_alloc64":       SizeRMAlloc64,
		"tsg_rm_control":       SizeRMControl,
		"tsg_xfer":             SizeXfer,
		"tsg_rm_api_version":   SizeRMAPIVersion,
		"tsg_timeslice_params": SizeTimesliceParams,
	} {
		if sizes[st] != want {
			t.Errorf("nvrm_abi.h asserts struct %s is %d bytes, Go says %d", st, sizes[st], want)
		}
	}
}

// TestIOWR: the request words as glibc's _IOWR('F', nr, size) makes them (and as the
// fake driver logged them from the C side).
func TestIOWR(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		nr, size uint32
		want     uint32
	}{
		{"alloc NVOS21", EscRMAlloc, SizeRMAlloc21, 0xc020462b},
		{"alloc NVOS64", EscRMAlloc, SizeRMAlloc64, 0xc030462b},
		{"control NVOS54", EscRMControl, SizeRMControl, 0xc020462a},
		{"version query", EscCheckVersionStr, SizeRMAPIVersion, 0xc04846d2},
		{"size indirection", EscIoctlXferCmd, SizeXfer, 0xc01046d3},
	} {
		if got := IOWR(tc.nr, tc.size); got != tc.want {
			t.Errorf("%s: IOWR(%#x, %d) = %#x, want %#x", tc.name, tc.nr, tc.size, got, tc.want)
		}
	}
}

func TestDriverSupported(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		version string
		want    bool
	}{
		{"580.159.04", true},  // the lent GPU machines' driver (a tag newer than the mirror's)
		{"580.142", true},     // the newest 580 tag read
		{"535.43.02", true},   // the first release of the layouts
		{"595.45.04", true},   // the newest tag read
		{"550.163.01", true},  //
		{"530.30.02", false},  // NVOS21 and NVOS64 without paramsSize
		{"470.256.02", false}, //
		{"600.10", false},     // a branch not read yet
		{"585.1", false},      // no such branch in the tags read
		{"580", false},        // no dot
		{"", false},
		{".580", false},
		{"-", false},
		{"58a.1", false},
		{"0000580.1", false}, // more than six digits
		{"0580.1", true},     // as the shim reads it: digits, then a dot
	} {
		if got := DriverSupported(tc.version); got != tc.want {
			t.Errorf("DriverSupported(%q) = %t, want %t", tc.version, got, tc.want)
		}
	}
}
