# Understory — see README.md. `make demo` and `make test` do all set-up themselves.
SHELL := /bin/bash
GO ?= go
BIN := bin
export GOFLAGS ?= -buildvcs=false
# go-nvml's header marks calls deprecated that it still wraps; the warnings are noise.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations
# The images' tag (`make images`): the file VERSION, the one version source; the
# manifests name understory/<name>:<the same> (a test keeps them equal;
# docs/images.md). `make images VERSION=v1.2.0` overrides it for one build.
ifeq ($(origin VERSION),undefined)
VERSION := $(shell cat VERSION)
endif

.PHONY: all build demo test vet tracefs k8s-bins helm-bin kueue-bin fuzz bpf-generate bench-colo bench-colo-variants bench-gpu bench-gpu-real bench-gpu-real-build bench-gpu-model bench-openb bench-openb-short bench-openb-lookahead bench-openb-search bench-extender bench-scheduler bench-cluster bench-cluster-kueue test-realnode clean

all: build

# Every binary pure Go (static), then the agent again with cgo: NVML (GPU telemetry and
# throttling) needs it. bin/koordlet-nogpu is the pure-Go agent, GPU features off.
build:
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/ ./cmd/...
	mv $(BIN)/koordlet $(BIN)/koordlet-nogpu
	CGO_ENABLED=1 $(GO) build -trimpath -o $(BIN)/koordlet ./cmd/koordlet

# One OCI image per deployed binary, without a Docker engine (images/, cmd/mkimage on
# go-containerregistry; the agent's also carries the time-slice shim, tsg-shim):
# $(BIN)/images/<name>.tar tagged understory/<name>:$(VERSION),
# and $(BIN)/images/images.json listing them. For `ctr -n k8s.io images import`,
# `docker load`, `kind load image-archive`, `crane push`. Dockerfiles: build/.
.PHONY: images
images: build tsg-shim
	$(BIN)/mkimage project -version $(VERSION) -bin $(BIN) -out $(BIN)/images

# A release into dist/ (scripts/release.sh): install.yaml, the Helm chart and its index,
# multi-platform OCI archives with SBOMs, the kubectl plugin with a krew manifest,
# SHA256SUMS. Tags are VERSION on a tagged clean tree, else VERSION-g<commit>.
.PHONY: release push cross
release: tsg-shim helm-bin k8s-bins cross
	scripts/release.sh

# Debian's arm64 cross compiler (the release's GPU agent for arm64), when missing.
cross:
	scripts/cross.sh

# The release in dist/ to REGISTRY (scripts/push.sh): the images, each a multi-platform
# index, and the chart (OCI). INSECURE=1: plain HTTP.
push: helm-bin
	scripts/push.sh

# The co-location demo on this machine: first memory pressure (an LS key-value service
# and batch jobs that size their heap to what they see, without and with the agent), then
# an LS web service and CPU-hungry batch pods alone, under kubelet's plain BestEffort
# settings and under the agent (tier, in-place) in rounds of changing order, each phase
# with its median and noise band (bench/colo).
demo: build
	$(BIN)/colo demo

# Every test: vet, then the whole module under the race detector, including the
# real-cgroup tests and the integration tests on a real control plane, then the
# real-node end-to-end tests (test/e2e/realnode, see e2e) on their own: they own the
# machine's kubepods cgroups and need the CPU to themselves, so they run after the rest;
# last the cgroup v2 + systemd node in a VM (test/e2e/nodev2, see test-node-v2).
REALNODE_PKG := ./test/e2e/realnode/
NODEV2_PKG := ./test/e2e/nodev2/
test: vet k8s-bins helm-bin kueue-bin e2e-deps tracefs nodev2-image cross
	$(GO) test -race -count=1 -timeout 40m $$($(GO) list ./... | grep -v -e '/test/e2e/realnode$$' -e '/test/e2e/nodev2$$')
	$(GO) test -race -count=1 -timeout 40m $(REALNODE_PKG)
	$(GO) test -count=1 -timeout 30m $(NODEV2_PKG)

# The cgroup v2 + systemd node (test/e2e/nodev2, docs/real-node.md): a Debian bookworm
# root by debootstrap with the cloud kernel, booted under qemu's software emulation,
# cached outside the repo (scripts/nodev2/build.sh; about a minute cold). Root.
.PHONY: nodev2-image test-node-v2
nodev2-image:
	@if [ "$$(id -u)" = 0 ]; then scripts/nodev2/build.sh >/dev/null; \
	else echo "nodev2-image: not root: the cgroup v2 node tests (test/e2e/nodev2) will skip, or fail under CI=true"; fi

# The cgroup v2 + systemd node on its own: the real-cgroup test binaries in the VM, and
# the VM joined as a node (kubelet's systemd driver) with the agent installed by Helm.
test-node-v2: e2e-deps nodev2-image
	$(GO) test -count=1 -timeout 30m -v $(NODEV2_PKG)

vet:
	$(GO) vet ./...

# The eBPF probe's classic-tracepoint fallback (koordlet/signals/runqlat) and its real test
# need tracefs; a fresh machine may not mount it. Root only: others skip those tests.
tracefs:
	@if [ "$$(id -u)" = 0 ] && ! mountpoint -q /sys/kernel/tracing; then \
	  mount -t tracefs tracefs /sys/kernel/tracing; fi

# kube-apiserver, kube-scheduler, kube-controller-manager and kubectl v1.37.2 built from the Go
# module proxy (cached outside the repo), and Debian's etcd.
k8s-bins:
	scripts/k8s-binaries.sh --with kube-controller-manager,kubectl

# helm v3.22.0 built from the Go module proxy (cached outside the repo, like k8s-bins): the
# chart's tests (test/helmchart) and the real-node install (test/e2e/realnode) run it.
helm-bin:
	scripts/helm.sh

# Kueue v0.17.0's manager and CRDs built from the Go module proxy (cached outside the repo):
# the Kueue tests (test/e2e/kueue_test.go, docs/kueue.md) run it in front of the extender.
kueue-bin:
	scripts/kueue.sh

# The cluster benchmark (issue 23, docs/cluster-bench.md): kwok nodes, the real control
# plane, scheduler, extender and admission webhook, the agents' own qos code for every
# node; a 20-node smoke check first. Writes bench/out/cluster.json and docs/img/cluster-bench.png.
CLUSTER_SIZES ?= 500,1000,2000,5000
bench-cluster: k8s-bins
	scripts/kwok.sh >/dev/null
	$(GO) test ./bench/clusterbench -run '^$$' -bench '^BenchmarkClusterSmoke$$' -benchtime 1x -timeout 20m
	$(GO) test ./bench/clusterbench -run '^$$' -bench '^BenchmarkCluster$$' -benchtime 1x -timeout 4h \
	  -args -clusterbench.sizes $(CLUSTER_SIZES)

# The same benchmark with Kueue in front (docs/cluster-bench.md, "Kueue in front"): Jobs in
# the shipped tenant queues, Kueue's manager, the Job controller and the quota follower.
# Writes bench/out/cluster-kueue.json and docs/img/cluster-bench-kueue.png.
KUEUE_CLUSTER_SIZES ?= 500,1000
bench-cluster-kueue: k8s-bins kueue-bin
	scripts/kwok.sh >/dev/null
	$(GO) test ./bench/clusterbench -run '^$$' -bench '^BenchmarkCluster$$' -benchtime 1x -timeout 2h \
	  -args -clusterbench.sizes $(KUEUE_CLUSTER_SIZES) -clusterbench.kueue=true \
	  -clusterbench.out $(CURDIR)/bench/out/cluster-kueue.json -clusterbench.png $(CURDIR)/docs/img/cluster-bench-kueue.png

# Regenerates the committed eBPF objects (koordlet/signals/runqlat/runqlat_bpfel.{go,o}) from
# bpf/runqlat.c with bpf2go at go.mod's cilium/ebpf version. Needs clang, llvm-strip and
# libbpf's headers (Debian: clang llvm libbpf-dev; bpftool to dump a kernel's BTF into
# bpf/vmlinux.h); installs them when missing. Building never needs them.
bpf-generate:
	@command -v clang >/dev/null && command -v llvm-strip >/dev/null && [ -e /usr/include/bpf/bpf_helpers.h ] \
	  && command -v bpftool >/dev/null || { apt-get update && apt-get install -y clang llvm libbpf-dev bpftool; }
	$(GO) generate ./koordlet/signals/runqlat/

# A short run of every fuzz target (the seed corpora also run in `make test`).
FUZZTIME ?= 10s
fuzz:
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg 2>/dev/null | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; done

# The whole co-location benchmark (docs/bench-colo.md; ~38 min on 2 CPUs): the paired
# rounds, reaction, sweep, overhead, memory pressure, batch-cpu stability, then every
# scenario variant under every signal path (ebpf, psi, sampling) with the issue's target
# checks, all in bench/out/colo.json.
bench-colo: build
	$(BIN)/colo bench -out bench/out/colo.json

# The variants and signal paths alone (~27 min): bench/out/colo-variants.json. Narrow it
# with e.g. COLO_VARIANTS=base,bursty COLO_PATHS=psi; a quick check of the wiring:
# COLO_VARIANT_FLAGS="-variant-rounds 1 -variant-phase 1s -path-steps 2 -path-overhead 2s".
COLO_VARIANTS ?= base,ls-heavy,small-batch,membw,bursty
COLO_PATHS ?= ebpf,psi,sampling
COLO_VARIANT_FLAGS ?=
bench-colo-variants: build
	$(BIN)/colo bench -rounds 0 -steps 0 -sweep "" -overhead 0 -trace "" -memory=false \
	  -variants $(COLO_VARIANTS) -signal-paths $(COLO_PATHS) $(COLO_VARIANT_FLAGS) -out bench/out/colo-variants.json

# GPU throttling (docs/gpu.md): reaction from an LS step on a mock GPU to frozen batch
# through the real collector, loop, duty cycle and freezer; duty error at 25/50/75 % on
# the real v1 freezer and v2 cgroup.freeze; the collector's cost per device; the whole
# agent's CPU with 8 mock GPUs and 110 pods (60 s with GPU features on, 60 s off). Root,
# cgo, ~5 min.
bench-gpu:
	CGO_ENABLED=1 $(GO) run ./cmd/gpu-bench -out bench/out/gpu.json

# The real-GPU benchmark (issue 20; docs/benchmarks.md, "Real GPU"): PyTorch LS and batch
# stand-ins on one NVIDIA GPU, alone, with nothing done, with the agent's freeze lever and
# with MPS, in kubelet-style cgroups with NRI; prints the table and the issue's targets and
# writes bench/out/gpu-real.json. Root, ~6 min, GPU machine only: elsewhere it stops at
# once. That machine has no Go: bench-gpu-real-build makes bin/koordlet (cgo, stripped),
# bin/gpureal-bench (cmd/gpu-real) and bin/gpureal-bundle.tar.gz (the two, to carry there).
GPUREAL_FLAGS ?=
bench-gpu-real:
	GPUREAL_FLAGS="$(GPUREAL_FLAGS)" scripts/bench-gpu-real.sh

bench-gpu-real-build:
	BIN=$(BIN) scripts/bench-gpu-real.sh build

# The model of the GPU's time-slicing for the weeks without one (bench/gpumodel; docs/benchmarks.md,
# "GPU time-slice model"): fitted to the real run's rows, then predicts the per-context
# timeslice and launch-gate rows, labelled model. Pure Go, no GPU, seconds; writes
# bench/out/gpu-model.json.
bench-gpu-model:
	$(GO) run ./cmd/gpu-model -out bench/out/gpu-model.json

# The per-context time-slice shim (docs/gpu.md, "Per-context time slices"): an LD_PRELOAD
# library, built here and carried to the GPU machine (no compiler there), where
# bench/gpureal/probe-timeslice.sh runs the go/no-go probe with it; the agent's image
# carries it (images), build/koordlet.Dockerfile builds it the same way.
.PHONY: tsg-shim
tsg-shim:
	@mkdir -p $(BIN)
	gcc -shared -fPIC -O2 -Wall -Wextra -o $(BIN)/libunderstory-tsg.so koordlet/gpu/timeslice/shim/understory_tsg.c \
	  -Wl,--no-as-needed -l:libdl.so.2

# The FGD paper's openb experiment replayed through the extender's placement code
# (every workload of the paper's table, 4 policies, seeds 42-51; ~10-20 min on 2 cores).
OPENB_DIR ?= ../shared/traces/openb
bench-openb:
	$(GO) run ./cmd/openb-replay -trace-dir $(OPENB_DIR) -workloads all \
	  -policy random,bestfit,fgd,understory -seeds 42-51 -out bench/out/openb.json

# Two workloads, one seed: a seconds-long sanity check of the same harness.
bench-openb-short:
	$(GO) run ./cmd/openb-replay -trace-dir $(OPENB_DIR) \
	  -workloads openb_pod_list_default,openb_pod_list_gpushare40 -policy fgd,understory \
	  -seeds 42 -out bench/out/openb-short.json

# How much a clairvoyant rule could still win over understory late in the
# replays (docs/benchmarks-openb.md): seed 42, every workload, ~20 min on 2 cores.
bench-openb-lookahead:
	$(GO) run ./cmd/openb-replay -trace-dir $(OPENB_DIR) -workloads all -policy understory \
	  -seeds 42 -lookahead 4,500,0.8 -compare bench/out/openb.json -out bench/out/openb-lookahead.json

# How much a clairvoyant search over the whole replay finds above understory
# (docs/benchmarks-openb.md): seed 42, every workload, 80 tries each, ~30 min on 2 cores.
bench-openb-search:
	$(GO) run ./cmd/openb-replay -trace-dir $(OPENB_DIR) -workloads all -policy understory \
	  -seeds 42 -search 80,4,20,0,1.3 -compare bench/out/openb.json -out bench/out/openb-search.json

# Extender filter + prioritize over real HTTP against 5 000 nodes (nodeCacheCapable), the index's
# write-lock holds while a 1 000-member gang waits, and the RSS at 5 000 nodes and 100 000 pods
# (-runs latency,lockhold,memory; a few minutes on 2 cores). Then, printed only (docs/benchmarks.md
# records them): one plan of a 1 000-member gang over 5 000 nodes (goal <= 100 ms), and the
# hand-written ExtenderArgs decoder against encoding/json in filter and prioritize (~20 s).
bench-extender:
	$(GO) run ./cmd/extender-bench -out bench/out/extender.json
	$(GO) test ./scheduler-extender/gang -run '^$$' -bench '^BenchmarkGangPlan1000x5000$$' -benchtime 10x
	$(GO) test ./scheduler-extender -run '^$$' -bench '^BenchmarkDecode5000$$' -benchtime 300x

# kube-scheduler binding throughput on a real control plane: alone, with a do-nothing
# extender, and with Understory's extender.
bench-scheduler: k8s-bins
	$(GO) test ./test/e2e/schedbench -run '^$$' -bench SchedulerThroughput -benchtime 1x -timeout 40m \
	  -args -schedbench.rounds 5

# What the real-node tests need: the project's images (make images) and the node's
# binaries and images, built and cached outside the repo (scripts/realnode/build.sh).
# Not root: nothing to build; the tests then skip (fail under CI=true) and say why.
.PHONY: e2e e2e-deps
# The second scheduler's image (manifests/components/second-scheduler) for a node without
# network: upstream's name, registry.k8s.io/kube-scheduler:<the tested version>, built from
# the cached kube-scheduler binary (k8s-bins).
K8S_VERSION := $(shell sed -n 's/^K8S_VERSION=//p' scripts/k8s-binaries.sh)
e2e-deps: images k8s-bins
	$(BIN)/mkimage binary -ref registry.k8s.io/kube-scheduler:$(K8S_VERSION) \
	  -bin "$$(scripts/k8s-binaries.sh --print-bin-dir)/kube-scheduler" \
	  -entrypoint /usr/local/bin/kube-scheduler -out $(BIN)/images/kube-scheduler.tar
	@if [ "$$(id -u)" = 0 ]; then scripts/realnode/build.sh >/dev/null; \
	else echo "e2e-deps: not root: the real-node tests (test/e2e/realnode) will skip, or fail under CI=true"; fi

# The end-to-end tests on a REAL node (docs/real-node.md): kubelet + containerd + runc +
# kube-proxy + a bridge pod network + the control plane, Understory's images imported
# and installed with `helm install` of charts/understory and its realnode values
# (TestInstall, second-scheduler mode), and
# the agent's assumptions about kubelet (TestRealNode). Root.
e2e: e2e-deps
	$(GO) test -race -count=1 -timeout 40m -v $(REALNODE_PKG)

# The agent's assumptions alone (TestRealNode). Root; ~10 min cold.
test-realnode: e2e-deps
	$(GO) test -count=1 -timeout 20m -v -run TestRealNode $(REALNODE_PKG)

# The Grafana dashboards (manifests/grafana, docs/dashboards.md) on real data: the agent on
# this machine's cgroups, a GPU node on go-nvml's mock, the extender and the second
# scheduler on a real control plane, the Kueue quota follower (Kueue's CRDs: kueue-bin),
# scraped by Debian's Prometheus (scripts/prometheus.sh installs it); every panel must show
# data, and docs/img/dashboards/*.png are rendered from the run. Root, cgo; about 2 min.
.PHONY: dashboards
dashboards: k8s-bins kueue-bin
	$(GO) test -count=1 -timeout 10m -v -run '^TestDashboardsOnPrometheus$$' ./test/e2e/dashboards/ \
	  -args -dashboards.png=$(CURDIR)/docs/img/dashboards

clean:
	rm -rf $(BIN)
