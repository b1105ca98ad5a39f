package vm

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestSymbolNames(t *testing.T) {
	t.Parallel()
	syms := parseKallsyms("ffffffff81000000 T _stext\nffffffff81a066f0 t __schedule\nnot a line\nffffffff81a06f90 T schedule\n0000000000000000 T zero\n")
	for _, tc := range []struct{ addr, want string }{
		{"ffffffff81a068ac", "__schedule+0x1bc"},
		{"ffffffff81a06f90", "schedule+0x0"},
		{"ffffffff81a06fea", "schedule+0x5a"},
		{"ffffffff80000000", ""}, // below the text
		{"ffffffff81b06f90", ""}, // far past the last symbol
		{"ffffc90000123456", ""}, // a stack address
		{"zz", ""},               // not hex
	} {
		if got := syms.name(tc.addr); got != tc.want {
			t.Errorf("name(%s) = %q, want %q", tc.addr, got, tc.want)
		}
	}
	if got := symbols(nil).name("ffffffff81a068ac"); got != "" {
		t.Errorf("no symbols named %q", got)
	}
}

// fakeQMP answers qmp_capabilities and the human monitor's info registers and x,
// each after an event nobody asked for.
func fakeQMP(t *testing.T, sock string) {
	t.Helper()
	serveJSON(t, sock, []any{map[string]any{"QMP": map[string]any{"version": map[string]any{}, "capabilities": []any{}}}},
		func(execute string, args map[string]any) []any {
			var reply any = map[string]any{"return": map[string]any{}}
			if execute == "human-monitor-command" {
				line, _ := args["command-line"].(string)
				out := "RAX=0 RBX=0\nRSP=ffffc90000abc000 RBP=0\nRIP=ffffffff81a068ac RFL=00000046 [---Z-P-] CPL=0\n"
				if strings.HasPrefix(line, "x/") {
					out = "ffffc90000abc000: 0xffffffff81a06fea 0x0000000000000001\nffffc90000abc010: 0xffffc90000abc100 0xffffffff81a06f90\n"
				}
				reply = map[string]any{"return": out}
			}
			return []any{map[string]any{"event": "RTC_CHANGE", "data": map[string]any{}}, reply}
		})
}

func TestMonitorNamesWhereAVCPUIs(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "qmp.sock")
	fakeQMP(t, sock)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := dialMonitor(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	syms := parseKallsyms("ffffffff81a066f0 t __schedule\nffffffff81a06f90 T schedule\n")
	got := m.cpuState(1, syms)
	want := "  cpu 1: rip ffffffff81a068ac __schedule+0x1bc, interrupts on false\n    stack: schedule+0x5a < schedule+0x0\n"
	if got != want {
		t.Errorf("cpuState:\n%s\nwant:\n%s", got, want)
	}
}
