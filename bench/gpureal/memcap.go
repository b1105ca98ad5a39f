package gpureal

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/understory/understory/qos"
)

// The memory-cap check (phase phMemCap, in the MPS section). With the agent's MPS on, its
// NRI plugin hands the batch stand-in CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, its gpu-milli
// share of the GPU's memory, and the LS stand-in none. The check, one stand-in at a time
// through the protocol's "mem" command (standin.py's Memory; the fakes simulate it):
//
//  1. LS holds memCapLSHoldMiB of device memory, each chunk filled with its own value;
//  2. batch allocates 256 MiB chunks until CUDA refuses (out of memory) and keeps them;
//  3. while batch keeps them, LS checks its chunks (every byte still its value) and
//     allocates its own share again, less what it holds and a headroom (memLSHeadroom);
//  4. both free what they hold.
//
// Met: batch's allocation ended in an out-of-memory error at or below its limit, LS's
// memory was intact and LS's further allocation succeeded. Without the limit batch would
// take every free byte and step 3 would fail: the check tells the two apart.
const (
	memChunkMiB = 256
	// memLSHeadroomMiB, or 1/memLSHeadroomPart of the GPU's memory where that is more,
	// is what LS's further allocation leaves of its share: the contexts, cuBLAS's
	// workspaces, the MPS server's memory, what the driver reserves (615 MiB on an
	// H200). With the bench's 500/500 split batch's limit and LS's share together are the
	// whole GPU: the headroom is what keeps LS's allocation from failing for these.
	memLSHeadroomMiB  = 2048
	memLSHeadroomPart = 20
	// memOpTimeout bounds one "mem" command (a GPU's memory in 256 MiB chunks takes a
	// second or two).
	memOpTimeout = 2 * time.Minute
)

// memOpResult is a stand-in's answer to a "mem" command.
type memOpResult struct {
	Op string `json:"op,omitempty"`
	// HeldMiB is what LS holds (hold, check); GotMiB what the command allocated (grab:
	// batch's, kept; check: LS's further allocation, freed again).
	HeldMiB int `json:"held_mib,omitempty"`
	GotMiB  int `json:"got_mib,omitempty"`
	// OOM: the allocation stopped at an out-of-memory error, OOMError its message.
	OOM      bool   `json:"oom,omitempty"`
	OOMError string `json:"oom_error,omitempty"`
	// Intact (check): every held chunk still holds its value.
	Intact *bool `json:"intact,omitempty"`
	// FreeMiB and TotalMiB are what CUDA reports to the stand-in after the command
	// (torch.cuda.mem_get_info).
	FreeMiB  float64 `json:"free_mib,omitempty"`
	TotalMiB float64 `json:"total_mib,omitempty"`
}

// memCapResult is the check's outcome.
type memCapResult struct {
	Met bool `json:"met"`
	// Verdict is "met", "NOT met: <why>" or "not run: <why>".
	Verdict string `json:"verdict"`
	// BatchLimitEnv is the CUDA_MPS_PINNED_DEVICE_MEM_LIMIT the batch stand-in saw;
	// BatchLimitMiB its device 0's limit.
	BatchLimitEnv string `json:"batchLimitEnv,omitempty"`
	BatchLimitMiB int    `json:"batchLimitMiB,omitempty"`
	// LSFurtherMiB is what LS tried to allocate while batch held what it got.
	LSFurtherMiB int          `json:"lsFurtherMiB,omitempty"`
	LSHold       *memOpResult `json:"lsHold,omitempty"`
	BatchGrab    *memOpResult `json:"batchGrab,omitempty"`
	LSCheck      *memOpResult `json:"lsCheck,omitempty"`
}

// runMemPhase runs the memory-cap check with the section's LS and batch stand-ins.
func (b *bench) runMemPhase(ctx context.Context, ph phaseSpec) (phaseResult, error) {
	s := b.section
	pr := phaseResult{phaseSpec: ph, Start: time.Now()}
	if err := b.ensure(ctx, ph.BatchKind, roleLS); err != nil {
		return pr, err
	}
	res, err := memCapCheck(ctx, s.running[roleLS], s.running[ph.BatchKind], ph.Name, b.o.LSGPUMilli, memCapLSHoldMiB)
	pr.MemCap = &res
	return pr, err
}

// memCapLSHoldMiB is what LS holds through the check.
const memCapLSHoldMiB = 2048

// memCapCheck runs the check (see above) on running stand-ins; lsMilli is LS's gpu-milli
// share (its further allocation). An error is a stand-in's failure, not a verdict.
func memCapCheck(ctx context.Context, ls, batch *workload, phase string, lsMilli, holdMiB int) (memCapResult, error) {
	var res memCapResult
	env := batch.ready.Env
	if pipe := env["CUDA_MPS_PIPE_DIRECTORY"]; pipe == "" || strings.HasPrefix(pipe, "/dev/null/") {
		res.Verdict = "not run: the batch stand-in is no MPS client of the agent (CUDA_MPS_PIPE_DIRECTORY " +
			strconv.Quote(pipe) + ")"
		return res, nil
	}
	res.BatchLimitEnv = env[qos.GPUMPSEnvPinnedDeviceMemLimit]
	limit, ok := memLimitDevice0(res.BatchLimitEnv)
	if !ok {
		res.Verdict = fmt.Sprintf("NOT met: the batch MPS client got no %s for device 0 (%q)",
			qos.GPUMPSEnvPinnedDeviceMemLimit, res.BatchLimitEnv)
		return res, nil
	}
	res.BatchLimitMiB = limit
	op := func(w *workload, c command) (*memOpResult, error) {
		c.Cmd, c.Phase, c.ChunkMiB = "mem", phase, memChunkMiB
		if err := w.send(c); err != nil {
			return nil, err
		}
		ev, err := w.next(ctx, "mem", memOpTimeout)
		if err != nil {
			return nil, err
		}
		return &ev.memOpResult, nil
	}
	// Whatever happens, neither keeps memory for the phases after.
	defer func() {
		for _, w := range []*workload{batch, ls} {
			_, _ = op(w, command{Op: "free"})
		}
	}()
	var err error
	if res.LSHold, err = op(ls, command{Op: "hold", MiB: holdMiB}); err != nil {
		return res, err
	}
	if res.LSHold.OOM {
		res.Verdict = fmt.Sprintf("not run: LS could not hold %d MiB (%s)", holdMiB, res.LSHold.OOMError)
		return res, nil
	}
	if res.BatchGrab, err = op(batch, command{Op: "grab"}); err != nil {
		return res, err
	}
	headroom := max(memLSHeadroomMiB, int(res.LSHold.TotalMiB)/memLSHeadroomPart)
	res.LSFurtherMiB = max(int(float64(lsMilli)/1000*res.LSHold.TotalMiB)-res.LSHold.HeldMiB-headroom, memChunkMiB)
	if res.LSCheck, err = op(ls, command{Op: "check", MiB: res.LSFurtherMiB}); err != nil {
		return res, err
	}
	res.Met, res.Verdict = memCapVerdict(res)
	return res, nil
}

// memCapVerdict judges a check that ran.
func memCapVerdict(r memCapResult) (bool, string) {
	g, c := r.BatchGrab, r.LSCheck
	var why []string
	switch {
	case g == nil || c == nil:
		return false, "not run: a step is missing"
	case !g.OOM:
		why = append(why, fmt.Sprintf("batch allocated %d MiB without an out-of-memory error", g.GotMiB))
	case g.GotMiB > r.BatchLimitMiB:
		why = append(why, fmt.Sprintf("batch allocated %d MiB, past its limit of %d MiB", g.GotMiB, r.BatchLimitMiB))
	}
	if c.Intact == nil || !*c.Intact {
		why = append(why, "LS's memory did not keep its contents")
	}
	if c.OOM || c.GotMiB < r.LSFurtherMiB {
		why = append(why, fmt.Sprintf("LS got %d of %d MiB more (%s)", c.GotMiB, r.LSFurtherMiB, c.OOMError))
	}
	if len(why) > 0 {
		return false, "NOT met: " + strings.Join(why, "; ")
	}
	return true, fmt.Sprintf("met: batch out of memory after %d MiB (limit %d MiB); LS kept its %d MiB and got %d MiB more",
		g.GotMiB, r.BatchLimitMiB, c.HeldMiB, c.GotMiB)
}

// memLimitDevice0 is device 0's limit in a CUDA_MPS_PINNED_DEVICE_MEM_LIMIT value
// ("0=<n>M" or "0=<n>G" among its comma-separated entries), MiB.
func memLimitDevice0(v string) (int, bool) {
	for e := range strings.SplitSeq(v, ",") {
		ord, val, ok := strings.Cut(e, "=")
		if !ok || ord != "0" || len(val) < 2 {
			continue
		}
		scale := 1
		switch val[len(val)-1] {
		case 'M':
		case 'G':
			scale = 1024
		default:
			continue
		}
		if n, err := strconv.Atoi(val[:len(val)-1]); err == nil && n > 0 {
			return n * scale, true
		}
	}
	return 0, false
}
