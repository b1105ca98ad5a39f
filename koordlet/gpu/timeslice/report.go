package timeslice

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// ReportVersion starts every report line of this format.
const ReportVersion = "tsg/1"

// MaxLineBytes bounds a report line; the shim's are far shorter.
const MaxLineBytes = 512

var (
	// ErrMalformed: a line that is not a well-formed report line of ReportVersion.
	ErrMalformed = errors.New("malformed time-slice report line")
	// ErrVersion: a line of another report version.
	ErrVersion = errors.New("unknown time-slice report version")
)

// Kind is what the shim saw.
type Kind string

const (
	// KindAlloc: the process allocated a channel group (a CUDA context's TSG).
	KindAlloc Kind = "alloc"
	// KindAppSet: the process issued its own SET_TIMESLICE.
	KindAppSet Kind = "app-set"
)

// Mode is what the shim did about it.
type Mode string

const (
	// ModeSet: the configured slice went to the driver (after an alloc, or in place of
	// the application's value) and was read back.
	ModeSet Mode = "set"
	// ModeReport: no slice configured; nothing changed.
	ModeReport Mode = "report"
	// ModeBadConfig: the configured slice is not a decimal in 1..MaxTimesliceUS;
	// nothing changed.
	ModeBadConfig Mode = "badconfig"
	// ModeUnsupported: the driver's version is unknown or of an unsupported branch;
	// nothing changed.
	ModeUnsupported Mode = "unsupported"
	// ModeSkip: an application's SET_TIMESLICE whose parameters the shim cannot read
	// (serialized, or not the plain 8-byte block); passed through unchanged.
	ModeSkip Mode = "skip"
)

// Result is one driver call: the SET that reached the driver, or the read-back.
type Result struct {
	// Done: the call was made.
	Done bool
	// Errno is the ioctl's error, 0 when it returned 0.
	Errno int
	// Status is the resource manager's status (StatusOK is success), when Errno is 0.
	Status uint32
	// ValueUS is the slice read back, for a read-back whose Errno and Status are 0.
	ValueUS uint64
}

// OK says the call was made and the driver answered success.
func (r Result) OK() bool { return r.Done && r.Errno == 0 && r.Status == StatusOK }

// Event is one report line.
type Event struct {
	UnixNano int64
	PID      int
	Kind     Kind
	Mode     Mode
	// Driver is the kernel module's version as the shim got it, "" where it did not
	// ask (no slice configured) or got none.
	Driver         string
	Client, Object uint32
	// AskedUS is the slice the shim sent (HasAsked: only in ModeSet).
	AskedUS  uint64
	HasAsked bool
	// AppUS is what the application asked in its own SET_TIMESLICE (HasApp).
	AppUS  uint64
	HasApp bool
	// Set is the SET_TIMESLICE that reached the driver: the shim's own after an alloc,
	// the application's (rewritten or not) for KindAppSet.
	Set Result
	// Readback is the GET_TIMESLICE after it (ModeSet only).
	Readback Result
}

// ClaimsApplied says the report claims the configured slice was set and read back
// equal. The claim comes from inside the tenant's process: it is never confirmation on
// its own (docs/gpu.md, "Per-context time slices").
func (e Event) ClaimsApplied() bool {
	return e.Mode == ModeSet && e.HasAsked && e.Set.OK() && e.Readback.OK() && e.Readback.ValueUS == e.AskedUS
}

// reportKeys returns a line's fields after the version, in their order.
func reportKeys() [14]string {
	return [...]string{"t", "pid", "ev", "mode", "drv", "client", "object", "asked", "app", "rc",
		"status", "rb", "rbrc", "rbstatus"}
}

// String formats the event as the shim writes it (without the newline).
func (e Event) String() string {
	var b strings.Builder
	b.WriteString(ReportVersion)
	field := func(k, v string) {
		b.WriteByte(' ')
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(v)
	}
	opt := func(has bool, v uint64) string {
		if !has {
			return "-"
		}
		return strconv.FormatUint(v, 10)
	}
	field("t", strconv.FormatInt(e.UnixNano, 10))
	field("pid", strconv.Itoa(e.PID))
	field("ev", string(e.Kind))
	field("mode", string(e.Mode))
	field("drv", orDash(e.Driver))
	field("client", fmt.Sprintf("0x%08x", e.Client))
	field("object", fmt.Sprintf("0x%08x", e.Object))
	field("asked", opt(e.HasAsked, e.AskedUS))
	field("app", opt(e.HasApp, e.AppUS))
	field("rc", opt(e.Set.Done, uint64(e.Set.Errno)))
	field("status", statusText(e.Set))
	field("rb", opt(e.Readback.OK(), e.Readback.ValueUS))
	field("rbrc", opt(e.Readback.Done, uint64(e.Readback.Errno)))
	field("rbstatus", statusText(e.Readback))
	return b.String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func statusText(r Result) string {
	if !r.Done || r.Errno != 0 {
		return "-"
	}
	return "0x" + strconv.FormatUint(uint64(r.Status), 16)
}

// ParseLine parses one report line (without its newline). The format is strict: the
// version, then every field once in the shim's order, each value canonical, so that a
// parsed event formats back to the same line.
func ParseLine(line string) (Event, error) {
	var e Event
	if len(line) > MaxLineBytes {
		return e, fmt.Errorf("%w: %d bytes", ErrMalformed, len(line))
	}
	parts := strings.Split(line, " ")
	if parts[0] != ReportVersion {
		if strings.HasPrefix(parts[0], "tsg/") {
			return e, fmt.Errorf("%w: %q", ErrVersion, parts[0])
		}
		return e, fmt.Errorf("%w: no %s prefix", ErrMalformed, ReportVersion)
	}
	keys := reportKeys()
	if len(parts) != 1+len(keys) {
		return e, fmt.Errorf("%w: %d fields, want %d", ErrMalformed, len(parts)-1, len(keys))
	}
	v := make(map[string]string, len(keys))
	for i, k := range keys {
		key, val, ok := strings.Cut(parts[i+1], "=")
		if !ok || key != k || val == "" {
			return e, fmt.Errorf("%w: field %d is %q, want %s=", ErrMalformed, i+1, parts[i+1], k)
		}
		v[k] = val
	}
	var err error
	bad := func(k string, cause error) (Event, error) {
		return Event{}, fmt.Errorf("%w: %s=%q: %w", ErrMalformed, k, v[k], cause)
	}
	t, err := decimal(v["t"])
	if err != nil || t > 1<<63-1 {
		return bad("t", errors.Join(err, errors.New("out of range")))
	}
	e.UnixNano = int64(t)
	pid, err := decimal(v["pid"])
	if err != nil || pid == 0 || pid > 1<<31-1 {
		return bad("pid", errors.Join(err, errors.New("not a process ID")))
	}
	e.PID = int(pid)
	switch k := Kind(v["ev"]); k {
	case KindAlloc, KindAppSet:
		e.Kind = k
	default:
		return bad("ev", errors.New("unknown event"))
	}
	switch m := Mode(v["mode"]); m {
	case ModeSet, ModeReport, ModeBadConfig, ModeUnsupported, ModeSkip:
		e.Mode = m
	default:
		return bad("mode", errors.New("unknown mode"))
	}
	if d := v["drv"]; d != "-" {
		if !validDriver(d) {
			return bad("drv", errors.New("not a version"))
		}
		e.Driver = d
	}
	if e.Client, err = handle(v["client"]); err != nil {
		return bad("client", err)
	}
	if e.Object, err = handle(v["object"]); err != nil {
		return bad("object", err)
	}
	if e.AskedUS, e.HasAsked, err = optDecimal(v["asked"]); err != nil {
		return bad("asked", err)
	}
	if e.AppUS, e.HasApp, err = optDecimal(v["app"]); err != nil {
		return bad("app", err)
	}
	if e.Set, err = result(v["rc"], v["status"], "-", false); err != nil {
		return bad("rc", err)
	}
	if e.Readback, err = result(v["rbrc"], v["rbstatus"], v["rb"], true); err != nil {
		return bad("rb", err)
	}
	if err := e.consistent(); err != nil {
		return Event{}, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return e, nil
}

// consistent checks what the shim never writes.
func (e Event) consistent() error {
	switch {
	case e.HasAsked != (e.Mode == ModeSet):
		return errors.New("asked is given exactly in mode set")
	case e.HasAsked && (e.AskedUS == 0 || e.AskedUS > MaxTimesliceUS):
		return errors.New("asked out of range")
	case e.Kind == KindAlloc && e.HasApp:
		return errors.New("an alloc carries no application value")
	case e.Kind == KindAppSet && e.HasApp == (e.Mode == ModeSkip):
		return errors.New("an application's set carries its value unless skipped")
	case e.Kind == KindAlloc && e.Set.Done != (e.Mode == ModeSet):
		return errors.New("after an alloc the shim sets only in mode set")
	case e.Kind == KindAppSet && !e.Set.Done:
		return errors.New("an application's set reached the driver")
	case e.Readback.Done != (e.Mode == ModeSet):
		return errors.New("a read-back is made exactly in mode set")
	case e.Driver != "" && (e.Mode == ModeReport || e.Mode == ModeBadConfig || e.Mode == ModeSkip):
		return errors.New("the driver is asked only when a slice is configured")
	case e.Mode == ModeSet && !DriverSupported(e.Driver):
		return errors.New("mode set on a driver not supported")
	case e.Mode == ModeUnsupported && DriverSupported(e.Driver):
		return errors.New("mode unsupported on a supported driver")
	}
	return nil
}

// decimal parses a canonical unsigned decimal (no sign, no leading zero).
func decimal(s string) (uint64, error) {
	if s == "" || len(s) > 20 || (len(s) > 1 && s[0] == '0') || strings.TrimLeft(s, "0123456789") != "" {
		return 0, errors.New("not a canonical decimal")
	}
	return strconv.ParseUint(s, 10, 64)
}

func optDecimal(s string) (uint64, bool, error) {
	if s == "-" {
		return 0, false, nil
	}
	n, err := decimal(s)
	return n, err == nil, err
}

// handle parses an RM handle as the shim writes it: 0x and eight lower-case hex digits.
func handle(s string) (uint32, error) {
	if len(s) != 10 || !strings.HasPrefix(s, "0x") || strings.TrimLeft(s[2:], "0123456789abcdef") != "" {
		return 0, errors.New("not 0x and eight hex digits")
	}
	n, err := strconv.ParseUint(s[2:], 16, 32)
	return uint32(n), err
}

// status parses an RM status as the shim writes it: 0x and the shortest lower-case hex.
func status(s string) (uint32, error) {
	h, ok := strings.CutPrefix(s, "0x")
	if !ok || h == "" || len(h) > 8 || (len(h) > 1 && h[0] == '0') || strings.TrimLeft(h, "0123456789abcdef") != "" {
		return 0, errors.New("not a canonical hex status")
	}
	n, err := strconv.ParseUint(h, 16, 32)
	return uint32(n), err
}

// result parses an errno, a status and a value ("-" where there is none) into a Result,
// with the shim's rules: no call, all "-"; an ioctl error, no status; a value (for a
// call that returns one) exactly where errno and status are both 0.
func result(rc, st, val string, returnsValue bool) (Result, error) {
	var r Result
	if rc == "-" {
		if st != "-" || val != "-" {
			return r, errors.New("a status or value without a call")
		}
		return r, nil
	}
	errno, err := decimal(rc)
	if err != nil || errno > 4095 {
		return r, errors.Join(err, errors.New("not an errno"))
	}
	r.Done, r.Errno = true, int(errno)
	if r.Errno != 0 {
		if st != "-" || val != "-" {
			return r, errors.New("a status or value after a failed ioctl")
		}
		return r, nil
	}
	if r.Status, err = status(st); err != nil {
		return r, err
	}
	if !returnsValue || r.Status != StatusOK {
		if val != "-" {
			return r, errors.New("a value where the call returned none")
		}
		return r, nil
	}
	r.ValueUS, err = decimal(val)
	return r, err
}

// validDriver: the shim writes 1..63 characters of [0-9A-Za-z._-].
func validDriver(s string) bool {
	if len(s) == 0 || len(s) > 63 {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// ParseReport reads report lines from r, at most maxBytes of it (a report file is
// written by the tenant: bounded and never trusted). Lines that do not parse are
// counted in bad, not returned; err is a read error only.
func ParseReport(r io.Reader, maxBytes int64) (events []Event, bad int, err error) {
	sc := bufio.NewScanner(io.LimitReader(r, maxBytes))
	sc.Buffer(make([]byte, 0, 1024), MaxLineBytes+1)
	for sc.Scan() {
		e, perr := ParseLine(sc.Text())
		if perr != nil {
			bad++
			continue
		}
		events = append(events, e)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			// A line past the bound: count it and stop (the rest cannot be framed).
			return events, bad + 1, nil
		}
		return events, bad, fmt.Errorf("read time-slice report: %w", err)
	}
	return events, bad, nil
}
