# Understory — see README.md. `make demo` and `make test` do all set-up themselves.
SHELL := /bin/bash
GO ?= go
BIN := bin
export GOFLAGS ?= -buildvcs=false

.PHONY: all build demo test vet k8s-bins fuzz bench-colo bench-openb bench-extender bench-scheduler clean

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/ ./cmd/...

# The co-location demo: an LS web service and CPU-hungry batch pods on this machine,
# measured alone, under kubelet's plain BestEffort settings, and under the agent.
demo: build
	$(BIN)/colo demo

# Every test: vet, then the whole module under the race detector, including the
# real-cgroup tests and the integration tests on a real control plane.
test: vet k8s-bins
	$(GO) test -race -count=1 -timeout 40m ./...

vet:
	$(GO) vet ./...

# kube-apiserver and kube-scheduler v1.34.4 built from the Go module proxy (cached
# outside the repo), and Debian's etcd.
k8s-bins:
	scripts/k8s-binaries.sh

# A short run of every fuzz target (the seed corpora also run in `make test`).
FUZZTIME ?= 10s
fuzz:
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; done

bench-colo: build
	$(BIN)/colo bench -out bench/out/colo.json

# Extender filter + prioritize over real HTTP against 5 000 nodes (nodeCacheCapable).
bench-extender:
	$(GO) run ./cmd/extender-bench -out bench/out/extender.json

# kube-scheduler binding throughput on a real control plane: alone, with a do-nothing
# extender, and with Understory's extender.
bench-scheduler: k8s-bins
	$(GO) test ./test/e2e/schedbench -run '^$$' -bench SchedulerThroughput -benchtime 1x -timeout 40m

clean:
	rm -rf $(BIN)
