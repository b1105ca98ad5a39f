//go:build !cgo

package gpubench

import (
	"context"
	"errors"
	"io"
)

// haveCgo: this build has no NVML, so the reaction, collect and agent_cpu parts cannot run.
const haveCgo = false

var errNoCgo = errors.New("built without cgo, which the NVML collector needs: " +
	"build with CGO_ENABLED=1, or run only -parts duty")

func runAgentCPU(context.Context, AgentCPUConfig, func(string, ...any)) (*agentCPURun, error) {
	return nil, errNoCgo
}

func runAgentNode(context.Context, string, io.Writer) error { return errNoCgo }

func runReaction(context.Context, ReactionConfig, func(string, ...any)) (*reactionResult, error) {
	return nil, errNoCgo
}

func runCollect(context.Context, CollectConfig, func(string, ...any)) (*collectRun, error) {
	return nil, errNoCgo
}
