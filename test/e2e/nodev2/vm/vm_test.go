package vm

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"net"
	"path/filepath"
	"testing"
	"time"
)

// serveJSON accepts one connection on a unix socket, writes first, then reads JSON
// requests ({"execute": ..., "arguments": ...}) and writes the lines answer returns for
// each, until the client goes.
func serveJSON(t *testing.T, sock string, first []any, answer func(execute string, args map[string]any) []any) {
	t.Helper()
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		write := func(lines []any) {
			for _, v := range lines {
				b, _ := json.Marshal(v)
				_, _ = c.Write(append(b, '\n'))
			}
		}
		write(first)
		dec := json.NewDecoder(bufio.NewReader(c))
		for {
			var req struct {
				Execute   string         `json:"execute"`
				Arguments map[string]any `json:"arguments"`
			}
			if dec.Decode(&req) != nil {
				return
			}
			write(answer(req.Execute, req.Arguments))
		}
	}()
}

// fakeAgent answers the qemu guest agent's protocol on a unix socket: first an error
// reply nobody asked for (what an abandoned request leaves behind), then guest-sync,
// guest-exec and guest-exec-status (running once, then exited).
func fakeAgent(t *testing.T, sock string) {
	t.Helper()
	polls := 0
	serveJSON(t, sock, []any{map[string]any{"error": map[string]any{"class": "GenericError", "desc": "stale"}}},
		func(execute string, args map[string]any) []any {
			var reply any
			switch execute {
			case "guest-sync":
				reply = map[string]any{"return": args["id"]}
			case "guest-exec":
				reply = map[string]any{"return": map[string]any{"pid": 42}}
			case "guest-exec-status":
				if polls++; polls == 1 {
					reply = map[string]any{"return": map[string]any{"exited": false}}
				} else {
					reply = map[string]any{"return": map[string]any{"exited": true, "exitcode": 3,
						"out-data": base64.StdEncoding.EncodeToString([]byte("out\n")),
						"err-data": base64.StdEncoding.EncodeToString([]byte("err\n"))}}
				}
			default:
				reply = map[string]any{"error": map[string]any{"class": "CommandNotFound", "desc": execute}}
			}
			return []any{reply}
		})
}

func TestRunThroughGuestAgent(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	sock := filepath.Join(dir, "qga.sock")
	fakeAgent(t, sock)
	v := &VM{dir: dir, done: make(chan struct{})}
	t.Cleanup(func() {
		if v.conn != nil {
			v.conn.Close()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := v.connect(ctx, sock); err != nil {
		t.Fatalf("connect past a stale error reply: %v", err)
	}
	r, err := v.Run(ctx, "echo out; echo err >&2; exit 3")
	if err != nil {
		t.Fatal(err)
	}
	if r.Stdout != "out\n" || r.Stderr != "err\n" || r.ExitCode != 3 {
		t.Fatalf("Run = %+v, want stdout \"out\\n\", stderr \"err\\n\", exit 3", r)
	}
	if err := v.call(ctx, "guest-nothing", nil, nil); err == nil {
		t.Fatal("an error reply was not an error")
	}
}
