package images

import (
	"encoding/json"
	"go/version"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// instruction is one Dockerfile instruction: its keyword (upper case) and the rest.
type instruction struct {
	cmd, args string
}

// parseDockerfile splits a Dockerfile into stages of instructions: comments and
// blank lines dropped, backslash continuations joined. Enough to check what the
// images must agree on, not a full parser.
func parseDockerfile(t *testing.T, data string) [][]instruction {
	t.Helper()
	var stages [][]instruction
	var cur string
	for _, line := range strings.Split(data, "\n") {
		trimmed := strings.TrimSpace(line)
		if cur == "" && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if strings.HasSuffix(trimmed, "\\") {
			cur += strings.TrimSpace(strings.TrimSuffix(trimmed, "\\")) + " "
			continue
		}
		cur += trimmed
		cmd, args, _ := strings.Cut(cur, " ")
		cur = ""
		in := instruction{strings.ToUpper(cmd), strings.TrimSpace(args)}
		switch {
		case in.cmd == "FROM":
			stages = append(stages, []instruction{in})
		case in.cmd == "ARG" && len(stages) == 0:
			// Global build arguments, before the first FROM.
		case len(stages) == 0:
			t.Fatalf("instruction %q before the first FROM", in.cmd)
		default:
			stages[len(stages)-1] = append(stages[len(stages)-1], in)
		}
	}
	if cur != "" {
		t.Fatalf("dangling continuation %q", cur)
	}
	return stages
}

// last returns the args of the stage's last instruction cmd, or "".
func last(stage []instruction, cmd string) string {
	a := ""
	for _, in := range stage {
		if in.cmd == cmd {
			a = in.args
		}
	}
	return a
}

// Each Dockerfile in build/ builds what mkimage builds: the same package with the
// same cgo setting, the binary at the same path, the same user and entrypoint, and
// a distroless base matching the builder's glibc. Docker cannot run here; this keeps them from rotting.
func TestDockerfilesMatchImages(t *testing.T) {
	t.Parallel()
	buildDir := filepath.Join("..", "build")
	mod, err := os.ReadFile(filepath.Join("..", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("go.mod has no go directive")
	}
	goMod := "go" + string(m[1])
	var names []string
	for _, c := range Components() {
		names = append(names, c.Name+".Dockerfile")
		t.Run(c.Name, func(t *testing.T) {
			t.Parallel()
			data, err := os.ReadFile(filepath.Join(buildDir, c.Name+".Dockerfile"))
			if err != nil {
				t.Fatal(err)
			}
			// The builder's Go is at least what go.mod asks for, else `go build` in
			// the builder would have to download a toolchain.
			argRe := regexp.MustCompile(`(?m)^ARG GO_VERSION=(\S+)$`)
			if m := argRe.FindStringSubmatch(string(data)); m == nil {
				t.Error("no ARG GO_VERSION=<version>")
			} else if version.Compare("go"+m[1], goMod) < 0 {
				t.Errorf("ARG GO_VERSION=%s is older than go.mod's %s", m[1], goMod)
			}
			stages := parseDockerfile(t, string(data))
			if len(stages) < 2 {
				t.Fatalf("%d stages, want a builder and a final stage", len(stages))
			}
			builder, final := stages[0], stages[len(stages)-1]
			// The builder's Go is pinned; the final stage is distroless on the
			// builder's Debian release (bookworm = debian12: the same glibc).
			if from := builder[0].args; !strings.HasPrefix(from, "golang:${GO_VERSION}-bookworm ") {
				t.Errorf("builder FROM %q: want golang:${GO_VERSION}-bookworm", from)
			}
			base := strings.Fields(final[0].args)[0]
			wantBase := regexp.MustCompile(`^gcr\.io/distroless/static-debian12(:nonroot)?$`)
			if c.CGO {
				// A cgo binary needs glibc in the final stage.
				wantBase = regexp.MustCompile(`^gcr\.io/distroless/base-nossl-debian12(:nonroot)?$`)
			}
			if !wantBase.MatchString(base) {
				t.Errorf("final FROM %s, want %s", base, wantBase)
			}
			if strings.HasSuffix(base, ":nonroot") != (c.User == NonRootUser) {
				t.Errorf("final FROM %s for user %s: want the :nonroot variant exactly for non-root", base, c.User)
			}

			// The builder compiles the component's package with its cgo setting.
			run := ""
			for _, in := range builder {
				if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
					run = in.args
				}
			}
			cgo := "CGO_ENABLED=0"
			if c.CGO {
				cgo = "CGO_ENABLED=1"
			}
			out := "/out/" + c.Binary
			if !strings.Contains(run, cgo) || !strings.HasSuffix(run, " "+c.Package) ||
				!strings.Contains(run, "-o "+out+" ") || !strings.Contains(run, "-trimpath") {
				t.Errorf("builder RUN %q: want %s go build -trimpath -o %s %s", run, cgo, out, c.Package)
			}

			// The final stage copies it to the entrypoint and runs it as the user.
			copyRe := regexp.MustCompile(`^--from=\S+ (\S+) (\S+)$`)
			m := copyRe.FindStringSubmatch(last(final, "COPY"))
			if m == nil || m[1] != out || m[2] != c.Entrypoint()[0] {
				t.Errorf("final COPY %q: want --from=<builder> %s %s", last(final, "COPY"), out, c.Entrypoint()[0])
			}
			// And its extra files, each to its path.
			for _, e := range c.Extra {
				want := "--from=build /out/" + e.Source + " " + e.Path
				if !slices.ContainsFunc(final, func(in instruction) bool { return in.cmd == "COPY" && in.args == want }) {
					t.Errorf("final stage has no COPY %s", want)
				}
				if !slices.ContainsFunc(builder, func(in instruction) bool {
					return in.cmd == "RUN" && strings.Contains(in.args, "-o /out/"+e.Source+" ")
				}) {
					t.Errorf("builder makes no /out/%s", e.Source)
				}
			}
			if u := last(final, "USER"); u != c.User {
				t.Errorf("final USER %q, want %q (the image mkimage builds)", u, c.User)
			}
			var ep []string
			if err := json.Unmarshal([]byte(last(final, "ENTRYPOINT")), &ep); err != nil ||
				!slices.Equal(ep, c.Entrypoint()) {
				t.Errorf("final ENTRYPOINT %q (%v): want exec form %q", last(final, "ENTRYPOINT"), err, c.Entrypoint())
			}
			if w := last(final, "WORKDIR"); w != "/" {
				t.Errorf("final WORKDIR %q, want /", w)
			}
		})
	}
	// No Dockerfile without an image: every file in build/ is a component's.
	ents, err := os.ReadDir(buildDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".Dockerfile") && !slices.Contains(names, e.Name()) {
			t.Errorf("build/%s builds no component of Components()", e.Name())
		}
	}
}

func TestParseDockerfile(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want [][]instruction
	}{
		{
			name: "stages, comments, continuations",
			in: "# c\nARG V=1\nFROM a:${V} AS b\nRUN x \\\n    y\n\n# d\nfrom s:1\nUSER 1:1\n" +
				`ENTRYPOINT ["/x"]` + "\n",
			want: [][]instruction{
				{{"FROM", "a:${V} AS b"}, {"RUN", "x y"}},
				{{"FROM", "s:1"}, {"USER", "1:1"}, {"ENTRYPOINT", `["/x"]`}},
			},
		},
		{name: "empty", in: "# nothing\n", want: nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := parseDockerfile(t, tc.in)
			if len(got) != len(tc.want) {
				t.Fatalf("stages = %v, want %v", got, tc.want)
			}
			for i := range got {
				if !slices.Equal(got[i], tc.want[i]) {
					t.Errorf("stage %d = %v, want %v", i, got[i], tc.want[i])
				}
			}
		})
	}
}
