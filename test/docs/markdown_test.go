package docs_test

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// errNoSection is returned by section for a heading that is missing or has no text.
var errNoSection = errors.New("no such heading with text under it")

// heading reports whether line is a Markdown ATX heading, with its level and title.
func heading(line string) (level int, title string, ok bool) {
	level = len(line) - len(strings.TrimLeft(line, "#"))
	if level == 0 || level > 6 || !strings.HasPrefix(line[level:], " ") {
		return 0, "", false
	}
	return level, strings.TrimSpace(line[level:]), true
}

// section returns the text under the heading title (any level) down to the next heading
// of the same or a higher level. Fenced code is text: a '#' comment in it is no heading.
func section(page []byte, title string) (string, error) {
	var b strings.Builder
	in, level, fenced := false, 0, false
	for _, line := range strings.SplitAfter(string(page), "\n") {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
		}
		if l, ti, ok := heading(strings.TrimRight(line, "\n")); ok && !fenced {
			switch {
			case !in && ti == title:
				in, level = true, l
				continue
			case in && l <= level:
				in = false
			}
		}
		if in {
			b.WriteString(line)
		}
	}
	if strings.TrimSpace(b.String()) == "" {
		return "", fmt.Errorf("%q: %w", title, errNoSection)
	}
	return b.String(), nil
}

// anchors returns the fragment of every heading of page as GitHub makes it (slug), with
// -1, -2, ... for repeated ones.
func anchors(page []byte) []string {
	var out []string
	seen := map[string]int{}
	fenced := false
	for _, line := range strings.Split(string(page), "\n") {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
		}
		if _, title, ok := heading(line); ok && !fenced {
			a := slug(title)
			if n := seen[a]; n > 0 {
				out = append(out, fmt.Sprintf("%s-%d", a, n))
			} else {
				out = append(out, a)
			}
			seen[a]++
		}
	}
	return out
}

// slug is GitHub's anchor of a heading: lower case, letters, digits, '-' and '_' kept,
// spaces turned into '-', everything else (backquotes, punctuation, symbols) dropped.
func slug(title string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(title) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// inlineLink matches a Markdown link or image: [text](target) or ![alt](target).
var inlineLink = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)\)`)

// links returns the targets of the inline links of page, outside fenced code and code
// spans.
func links(page []byte) []string {
	var out []string
	fenced := false
	for _, line := range strings.Split(string(page), "\n") {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		parts := strings.Split(line, "`")
		for i := 0; i < len(parts); i += 2 { // even parts are outside code spans
			for _, m := range inlineLink.FindAllStringSubmatch(parts[i], -1) {
				out = append(out, m[1])
			}
		}
	}
	return out
}

// lineCount counts the lines of b as an editor shows them: a last line without a
// newline counts too.
func lineCount(b []byte) int {
	n := bytes.Count(b, []byte("\n"))
	if len(b) > 0 && b[len(b)-1] != '\n' {
		n++
	}
	return n
}

func TestSection(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, page, title, want string
		ok                      bool
	}{
		{name: "between headings", page: "# T\n## A\na\n## Layout\n`x/` y\n## B\nb\n", title: "Layout",
			want: "`x/` y\n", ok: true},
		{name: "last section", page: "## Layout\nl\n", title: "Layout", want: "l\n", ok: true},
		{name: "whole page", page: "# Layout\nintro\n## Part\n`x/`\n", title: "Layout",
			want: "intro\n## Part\n`x/`\n", ok: true},
		{name: "code is text", page: "## Install\na\n```sh\n# comment\n```\n### Sub\nb\n## Next\nc\n",
			title: "Install", want: "a\n```sh\n# comment\n```\n### Sub\nb\n", ok: true},
		{name: "no newline at the end", page: "## Install\nx", title: "Install", want: "x", ok: true},
		{name: "not a heading", page: "#Layout\nx\n", title: "Layout"},
		{name: "missing", page: "## Other\n", title: "Layout"},
		{name: "empty", page: "# Layout\n\n# Next\nx\n", title: "Layout"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := section([]byte(tc.page), tc.title)
			if (err == nil) != tc.ok || got != tc.want {
				t.Fatalf("section = %q, %v; want %q, ok %t", got, err, tc.want, tc.ok)
			}
			if !tc.ok && !errors.Is(err, errNoSection) {
				t.Fatalf("error %v is not errNoSection", err)
			}
		})
	}
}

func TestAnchors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, page string
		want       []string
	}{
		{name: "punctuation and code", page: "## The cgroup v2 + systemd node (`make test-node-v2`)\n",
			want: []string{"the-cgroup-v2--systemd-node-make-test-node-v2"}},
		{name: "dash and apostrophe", page: "# A1 — co-location\n## Changing the agent's configuration\n",
			want: []string{"a1--co-location", "changing-the-agents-configuration"}},
		{name: "repeated", page: "## Results\n## Results\n## Results\n", want: []string{"results", "results-1", "results-2"}},
		{name: "fenced code is no heading", page: "```sh\n# not a heading\n```\n## Yes\n", want: []string{"yes"}},
		{name: "underscore and unicode", page: "## snake_case Größe\n", want: []string{"snake_case-größe"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := anchors([]byte(tc.page)); !slices.Equal(got, tc.want) {
				t.Fatalf("anchors = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestLinks(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, page string
		want       []string
	}{
		{name: "link and image", page: "see [a](a.md#x) and ![p](img/p.png).\n", want: []string{"a.md#x", "img/p.png"}},
		{name: "code span and fence skipped", page: "`[x](no.md)` [y](yes.md)\n```\n[z](no.md)\n```\n",
			want: []string{"yes.md"}},
		{name: "none", page: "plain [text] (not a link)\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := links([]byte(tc.page)); !slices.Equal(got, tc.want) {
				t.Fatalf("links = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestLineCount(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want int
	}{
		{"", 0},
		{"a", 1},
		{"a\n", 1},
		{"a\nb", 2},
		{"a\n\n", 2},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%q", tc.in), func(t *testing.T) {
			t.Parallel()
			if got := lineCount([]byte(tc.in)); got != tc.want {
				t.Fatalf("lineCount(%q) = %d, want %d", tc.in, got, tc.want)
			}
		})
	}
}
