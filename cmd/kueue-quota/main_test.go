package main

import (
	"errors"
	"io"
	"testing"

	"github.com/understory/understory/kueuequota"
)

func TestParseFlags(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		args    []string
		wantErr error
		check   func(t *testing.T, o options)
	}{
		{name: "defaults", check: func(t *testing.T, o options) {
			if len(o.cfg.Resources) != 4 || o.cfg.Flavor != kueuequota.DefaultFlavor || !o.cfg.EvictOverQuota {
				t.Errorf("defaults: %+v", o.cfg)
			}
		}},
		{name: "resources list", args: []string{"-resources", " a, b ,", "-interval", "1m"}, check: func(t *testing.T, o options) {
			if len(o.cfg.Resources) != 2 || o.cfg.Resources[1] != "b" {
				t.Errorf("resources %q", o.cfg.Resources)
			}
		}},
		{name: "no resources", args: []string{"-resources", ""}, wantErr: kueuequota.ErrConfig},
		{name: "bad rise fraction", args: []string{"-rise-fraction", "2"}, wantErr: kueuequota.ErrConfig},
		{name: "stray argument", args: []string{"x"}, wantErr: errors.New("any")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o, err := parseFlags(tc.args, io.Discard)
			switch {
			case tc.wantErr == nil && err != nil:
				t.Fatal(err)
			case tc.wantErr != nil && err == nil:
				t.Fatal("no error")
			case tc.wantErr != nil && errors.Is(tc.wantErr, kueuequota.ErrConfig) && !errors.Is(err, kueuequota.ErrConfig):
				t.Fatalf("err = %v, want ErrConfig", err)
			}
			if tc.check != nil {
				tc.check(t, o)
			}
		})
	}
}
