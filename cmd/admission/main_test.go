package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseFlags(t *testing.T) {
	t.Parallel()
	tls := []string{"-tls-cert-file=c", "-tls-private-key-file=k"}
	tests := []struct {
		name string
		args []string
		want string // "" ok, else part of the error
	}{
		{"defaults", tls, ""},
		{"no TLS", nil, "-tls-cert-file"},
		{"bad body limit", append(tls, "-max-body-bytes=10"), "max body bytes"},
		{"bad gang max", append(tls, "-max-gang-min-member=0"), "max gang"},
		{"stray argument", append(tls, "extra"), "unexpected arguments"},
		{"bad timeout", append(tls, "-shutdown-timeout=0s"), "shutdown-timeout"},
		{"writers", append(tls, "-gpu-devices-writers=system:serviceaccount:s:x, system:serviceaccount:s:y"), ""},
		{"empty writer", append(tls, "-gpu-devices-writers=a,,b"), "writer"},
		{"no writer", append(tls, "-gpu-devices-writers="), "writer"},
		{"second scheduler", append(tls, "-scheduler-name=understory-scheduler"), ""},
		{"scheduler name invalid", append(tls, "-scheduler-name=Under_Story"), "-scheduler-name"},
		{"scheduler name default", append(tls, "-scheduler-name=default-scheduler"), "default scheduler"},
		{"replace koord-scheduler", append(tls, "-replace-scheduler=koord-scheduler, old-sched"), ""},
		{"replace the default scheduler", append(tls, "-replace-scheduler=default-scheduler"), "-replace-scheduler"},
		{"replace the second scheduler", append(tls, "-scheduler-name=understory-scheduler", "-replace-scheduler=understory-scheduler"),
			"second scheduler's own"},
		{"replace an invalid name", append(tls, "-replace-scheduler=Koord_Scheduler"), "-replace-scheduler"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o, err := parseFlags(tc.args, io.Discard)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
			if tc.name == "writers" && strings.Join(o.cfg.GPUDevicesWriters, "|") != "system:serviceaccount:s:x|system:serviceaccount:s:y" {
				t.Fatalf("writers %q", o.cfg.GPUDevicesWriters)
			}
			if tc.name == "replace koord-scheduler" && strings.Join(o.replaced, "|") != "koord-scheduler|old-sched" {
				t.Fatalf("replaced %q", o.replaced)
			}
			if tc.name == "second scheduler" && (o.schedulerName != "understory-scheduler" ||
				o.cfg.GPUShareScheduler != "understory-scheduler") {
				t.Fatalf("scheduler name %q", o.schedulerName)
			}
		})
	}
}

// The shipped ConfigMap's profiles load.
func TestShippedProfilesLoad(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../manifests/admission/configmap.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(data), "profiles.yaml: |\n")
	if !ok {
		t.Fatal("no profiles.yaml in the ConfigMap")
	}
	block, _, _ = strings.Cut(block, "\n---")
	var lines []string
	for _, l := range strings.Split(block, "\n") {
		lines = append(lines, strings.TrimPrefix(l, "    "))
	}
	f := filepath.Join(t.TempDir(), "profiles.yaml")
	if err := os.WriteFile(f, []byte(strings.Join(lines, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	ps, err := loadProfiles(f)
	if err != nil || ps.Len() != 1 {
		t.Fatalf("profiles %d, %v", ps.Len(), err)
	}
	if _, err := loadProfiles(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("missing file accepted")
	}
}
