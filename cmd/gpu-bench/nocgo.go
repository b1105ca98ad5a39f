//go:build !cgo

package main

import (
	"context"
	"errors"
)

// haveCgo: this build has no NVML, so the reaction and collect parts cannot run.
const haveCgo = false

var errNoCgo = errors.New("built without cgo, which the NVML collector needs: " +
	"build with CGO_ENABLED=1, or run only -parts duty")

func runReaction(context.Context, reactionConfig, func(string, ...any)) (*reactionResult, error) {
	return nil, errNoCgo
}

func runCollect(context.Context, collectConfig, func(string, ...any)) (*collectRun, error) {
	return nil, errNoCgo
}
