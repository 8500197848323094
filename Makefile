# rds-csi — see README.md. Two commands matter on a fresh machine:
#   make demo   a volume's life on a real control plane with the driver and the RDS simulator
#   make test   the whole test suite (what CI runs)
SHELL := /bin/bash
GO ?= go
BIN := bin
CACHE := .cache
# The version every binary, the image tag and the chart carry, from
# hack/version.sh (the file VERSION and git; docs/release.md), once per make.
ifeq ($(origin VERSION),undefined)
VERSION := $(shell hack/version.sh)
endif
ifeq ($(VERSION),)
$(error hack/version.sh printed no version)
endif
export VERSION
# The build flags of every binary the repository ships: no build paths
# (-trimpath), nothing of the checkout's git state but the version
# (-buildvcs=false: a source archive and a clone of one commit build the
# same bytes). The e2e test TestReleaseArtifacts holds the release to it.
GOBUILDFLAGS := -trimpath -buildvcs=false
LDFLAGS := -X github.com/srvlab/rds-csi/pkg/version.Version=$(VERSION)
# Inputs per fuzz target: a count, not a time, so a slow machine runs the
# same work and the fuzz runner's deadline race (golang/go#75804) cannot hit.
FUZZCOUNT ?= 20000
PKGS := ./...
# A go test command (the second argument) whose output goes to the terminal
# and to .cache/logs/NAME.log (the first); when it fails, what failed is
# printed again at the end (hack/test-failures.sh), where a CI page that
# shows only a log's tail sees it.
logged = set -o pipefail; mkdir -p $(CACHE)/logs; { $(2); } 2>&1 | tee $(CACHE)/logs/$(1).log || { hack/test-failures.sh $(CACHE)/logs/$(1).log; exit 1; }

.PHONY: all build test unit sanity-loop fuzz lint bench bench-publish bench-scale demo demo-rds clean e2e e2e-nvme e2e-kubelet

all: build

build:
	$(GO) build $(GOBUILDFLAGS) -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/...

# Every test the repo has: unit and integration tests with the race detector
# (the RDS simulator over real SSH, loop devices where root; the documented
# commands, ./docs), csi-sanity
# against the shipped binaries, then each fuzz target briefly, then the e2e
# suite on a real control plane (the release and upgrade tests among it),
# then the kubelet tier on real nodes; the NVMe/TCP tier in a VM runs
# beside them (below).
# test-host is all of it but the VM tier: what the pull request workflow
# runs on every runner (docs/release.md).
# The VM tier keeps one core busy (TCG: one vCPU) while the e2e and kubelet
# tiers mostly wait, so make test starts it beside the rest once the unit
# tests pass, its output in .cache/logs/e2e-nvme.out, and waits for it at
# the end: it fails if either side failed, and a make test stopped from its
# terminal (hang-up, Ctrl-C, Ctrl-\, a TERM to its process group) stops it.
test: lint unit deps
	@set -u; mkdir -p $(CACHE)/logs; out=$(CACHE)/logs/e2e-nvme.out; \
	  setsid -w $(MAKE) --no-print-directory e2e-nvme >"$$out" 2>&1 & vm=$$!; \
	  trap 'kill -TERM -- -'$$vm' 2>/dev/null; wait '$$vm'; exit 1' HUP INT QUIT TERM; \
	  echo "make test: the NVMe/TCP VM tier (make e2e-nvme) runs beside the rest from here; its output: $$out"; \
	  status=0; $(MAKE) --no-print-directory test-host-rest || status=1; \
	  echo "make test: waiting for the NVMe/TCP VM tier"; \
	  if wait $$vm; then grep -E '^ +nvme_test.go:[0-9]+: (boot|accelerator|kernel)|^(--- |ok|PASS)' "$$out"; \
	  else status=1; echo "make test: the NVMe/TCP VM tier failed; the end of $$out:"; tail -n 80 "$$out"; fi; \
	  exit $$status
test-host: lint unit test-host-rest
test-host-rest: packaging sanity-loop model fuzz e2e e2e-kubelet
.PHONY: test-host test-host-rest

unit:
	$(call logged,unit,$(GO) test -race -count=1 $(PKGS))

# The commands of the Markdown files run as written against the simulator
# (docs/commands_test.go; part of `unit` through ./...), alone, every
# relative link and every fence's language checked. The blocks marked
# cluster and install run against a real kube-apiserver in `e2e`
# (docs/cluster_test.go, build tag e2e):
# go test -tags e2e -count=1 -v -run TestDocumentedClusterCommands ./docs
.PHONY: docs-test
docs-test:
	$(GO) test -count=1 -v -run 'TestDocumentedCommands|TestGeneratedKeysAreIgnored|TestMarkdownLinksResolve|TestEveryFenceHasALanguage' ./docs

# The publish model check (pkg/csi/publish_model_test.go) at full size
# without the race detector: two controller replicas with adversarially
# lagging watch streams, 100000 operations, every answer checked. `unit`
# runs a tenth of it under -race. `soak` runs SOAK_OPS (default 2000000);
# RDS_CSI_MODEL_SEED=N reruns one failing seed.
.PHONY: model soak
model:
	set -o pipefail; $(GO) test -count=1 -run '^TestPublishModel$$' -v ./pkg/csi | grep -E '^(=== RUN|--- |ok|FAIL|PASS)|publish_model_test'

SOAK_OPS ?= 2000000
soak:
	set -o pipefail; RDS_CSI_MODEL_OPS=$(SOAK_OPS) $(GO) test -count=1 -timeout 3h -run '^TestPublishModel$$' -v ./pkg/csi | grep -E '^(=== RUN|--- |ok|FAIL|PASS)|publish_model_test'

# Host tools the node tests and benchmarks run for real (mkfs.ext4,
# mkfs.xfs, resize2fs, xfs_growfs, losetup, blkid); installs only what is
# missing (apt, as root).
.PHONY: deps
deps:
	./hack/install-deps.sh

unit bench sanity-loop: deps

# The standalone csi-sanity command (csi-test at go.mod's version, built
# once into .cache/bin) against bin/rds-csi-driver --mode=all
# --node-connector=loop and bin/rds-sim as processes: the Node specs on loop
# devices, then a check that nothing stayed mounted or attached
# (hack/sanity-loop.sh). ~6 s warm; csi-sanity's first build ~10 s with
# Go's caches warm. Needs root; skips without it outside CI.
sanity-loop: build
	./hack/sanity-loop.sh

fuzz:
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for target in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "fuzz $$pkg $$target ($(FUZZCOUNT) inputs)"; \
	    if ! out=$$($(GO) test -run='^$$' -fuzz="^$$target\$$" -fuzztime=$(FUZZCOUNT)x $$pkg 2>&1); then \
	      echo "$$out"; echo "FAIL: fuzz $$pkg $$target"; exit 1; \
	    fi; \
	  done; \
	done

# End-to-end: a real kube-apiserver/kube-controller-manager, the csi
# sidecars, the driver binary and the RDS simulator (e2e/, build tag e2e, so
# `unit` does not run it), and the documented kubectl and helm commands
# against it (docs/cluster_test.go). The first build of the control plane
# takes ~10 min.
# Most scenarios wait (heartbeat windows, grace periods, leases) and run
# side by side (t.Parallel), E2E_PARALLEL at a time; their control planes
# start two at a time (RDS_CSI_E2E_STARTS; e2e/README.md).
E2E_PARALLEL ?= 6
e2e:
	./hack/build-controlplane.sh
	$(GO) vet -tags e2e ./e2e/... ./docs
	$(call logged,e2e,$(GO) test -tags e2e -count=1 -timeout 40m -parallel $(E2E_PARALLEL) ./e2e/... ./docs)

# The kubelet tier (e2e/kubelet, build tag kubelet): the driver as users
# run it, installed from the chart's render with the image of `make image`
# (the test runs it once)
# on two real nodes of this machine (kubelet and containerd built from
# their Go modules, Debian's runc and CNI plugins; hack/build-kubelet-tier.sh,
# e2e/README.md), against the RDS simulator with the loop connector, and
# Kubernetes' storage e2e suite for external drivers there (e2e.test with
# e2e/kubelet/testdata/storage-testdriver.yaml). Needs root; skips with
# the reason outside CI, fails in CI. Each test builds a lab of its own
# (control plane, real nodes, simulator) and mostly waits, so the tests run
# side by side, E2E_KUBELET_PARALLEL labs at a time, the storage suite
# first (RDS_CSI_KUBELET_LABS; go test's -parallel is set above the number
# of tests so that the tests' own line orders them; e2e/README.md).
E2E_KUBELET_PARALLEL ?= 3
e2e-kubelet: deps
	$(GO) vet -tags kubelet ./e2e/kubelet
	@if [ "$$(id -u)" != 0 ] && [ -z "$$CI" ]; then echo "e2e-kubelet: skipped (needs root: namespaces, cgroups, mounts, loop devices)"; else \
	  set -e; ./hack/build-controlplane.sh && ONLY="kubelet kube-scheduler containerd debs images e2e.test ginkgo" ./hack/build-kubelet-tier.sh && \
	  { $(call logged,e2e-kubelet,RDS_CSI_KUBELET_LABS=$(E2E_KUBELET_PARALLEL) $(GO) test -tags kubelet -count=1 -timeout 60m -parallel 64 -v ./e2e/kubelet); }; fi

# The NVMe/TCP tier (e2e/nvme, build tag nvmevm): a Debian kernel under
# QEMU (hack/nvme-vm.sh downloads it into .cache/nvme-vm/, never /boot),
# booted three times (6.12 with nvme_core.multipath Y and N, then 6.1), runs the node tests and
# csi-sanity against the kernel's nvmet target and nvme-tcp initiator.
# ~9 min warm under TCG on 2 cores (docs/BENCHMARKS.md). Needs root; skips
# with the reason outside CI when it cannot run, fails in CI. Works from any
# checkout path (under /tmp, with spaces). RDS_CSI_VM_KVM=auto (default: KVM
# only if a probe boot reaches the guest's /init within 30 s, else TCG,
# logged), on or off, e.g. `make e2e-nvme RDS_CSI_VM_KVM=off`.
e2e-nvme: deps
	$(GO) vet -tags nvmevm ./pkg/nvme ./pkg/csi ./e2e/nvme ./e2e/vm
	$(call logged,e2e-nvme,$(GO) test -tags nvmevm -count=1 -timeout 40m -v -run TestNVMeTCPInVM ./e2e/nvme)

# The driver's container image without a container engine
# (hack/build-image.sh): the static driver and the Debian bookworm packages
# of the node tools it runs, unpacked with dpkg-deb (downloads cached in
# .cache/image), written as one OCI archive per architecture that docker
# load, ctr images import and kind load image-archive accept: amd64 in
# IMAGE_ARCHIVE, arm64 (Debian's arm64 packages unpacked, the driver
# cross-compiled; no emulator) in IMAGE_ARCHIVE_ARM64. IMAGE is tagged with
# VERSION; manifests/ and the chart deploy the release's tag (VERSION's
# file). image-test checks both archives: the amd64 one runs the driver
# (its --version is the tag) and each node tool in the unpacked root
# filesystem (chroot, root only); in the arm64 one every executable is an
# arm64 ELF whose interpreter and libraries are there. ~25 s warm per
# architecture; cold, each CGO_ENABLED=0 build of the driver adds ~3.5 min
# and the packages (~26 MB) a few seconds (docs/BENCHMARKS.md).
IMAGE_REPO ?= ghcr.io/srvlab/rds-csi-driver
IMAGE ?= $(IMAGE_REPO):$(VERSION)
IMAGE_ARCHIVE ?= bin/rds-csi-driver-image.tar
IMAGE_ARCHIVE_ARM64 ?= bin/rds-csi-driver-image-arm64.tar
.PHONY: image image-arm64 image-test chart chart-test packaging
image:
	IMAGE='$(IMAGE)' ARCH=amd64 ./hack/build-image.sh '$(IMAGE_ARCHIVE)'

image-arm64:
	IMAGE='$(IMAGE)' ARCH=arm64 ./hack/build-image.sh '$(IMAGE_ARCHIVE_ARM64)'

image-test:
	@if [ "$$(id -u)" != 0 ] && [ -z "$$CI" ]; then echo "image-test: skipped (needs root: apt's cache, owners, chroot)"; else \
	  $(MAKE) --no-print-directory image image-arm64 && cd hack/tools && \
	  RDS_CSI_IMAGE_ARCHIVE='$(abspath $(IMAGE_ARCHIVE))' RDS_CSI_IMAGE_ARCHIVE_ARM64='$(abspath $(IMAGE_ARCHIVE_ARM64))' \
	  $(GO) test -count=1 -v -run '^(TestImage|TestWrite)' ./image/; fi

# The Helm chart (charts/rds-csi) rendered by the Helm SDK in hack/tools, a
# module of its own so that Helm stays out of the driver's go.mod; `chart`
# prints the default render, chart-test checks it equals manifests/ object
# for object (and the values against their kustomize equivalents), and
# the release's chart package, krew manifest and notes (hack/tools/release).
chart:
	@cd hack/tools && $(GO) run ./cmd/render helm '$(CURDIR)/charts/rds-csi'

chart-test:
	cd hack/tools && $(GO) vet ./... && $(GO) test -count=1 ./render/ ./release/

packaging: chart-test image-test

lint: lint-workflows
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.cache/*')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

# The GitHub workflows (.github/workflows), which cannot run here, linted
# by actionlint (pinned in hack/release-tools, built once into
# .cache/bin; shellcheck checks their scripts where it is installed).
.PHONY: lint-workflows
lint-workflows:
	@set -e; v=$$(cd hack/release-tools && $(GO) list -m -f '{{.Version}}' github.com/rhysd/actionlint); \
	  bin='$(abspath $(CACHE))'/bin/actionlint-$$v; \
	  if [ ! -x "$$bin" ]; then mkdir -p "$$(dirname "$$bin")"; \
	    (cd hack/release-tools && $(GO) build -o "$$bin.tmp.$$$$" github.com/rhysd/actionlint/cmd/actionlint) && mv "$$bin.tmp.$$$$" "$$bin"; fi; \
	  "$$bin" -no-color .github/workflows/*.yml && echo "actionlint $$v: .github/workflows clean"

# Go benchmarks, then the controller's start-up at scale (bench-scale); the
# numbers in docs/BENCHMARKS.md come from this target.
bench:
	$(GO) test -run='^$$' -bench=. -benchtime=$(or $(BENCHTIME),200x) ./pkg/...
	$(MAKE) --no-print-directory bench-scale

# The controller's start-up against an API already holding its volumes
# (e2e/scalebench_test.go): for each of BENCH_SCALES (10k: 10k PVs, 10k
# attached VolumeAttachments, 1k Nodes; 100k: 100k/100k/5k; 1k: a smoke
# run) one control plane is filled once, with a few bad objects of each
# kind, then the driver starts BENCH_RUNS times: ready time, its RSS at
# ready and once indexed, live heap per volume, kube-apiserver's RSS, the
# initial sync path (watch-list or LIST); a markdown table per size with
# median [min-max] (docs/BENCHMARKS.md). Heavy: 100k takes ~30 min on
# the shared 2 cores (filling the API ~19 of them), kube-apiserver then
# holds ~2.8 GiB; 10k alone takes ~5 min: `make bench-scale BENCH_SCALES=10k`.
BENCH_SCALES ?= 10k 100k
BENCH_RUNS ?= 3
bench-scale:
	./hack/build-controlplane.sh
	set -o pipefail; RDS_CSI_E2E_BENCH=1 RDS_CSI_E2E_BENCH_SCALES='$(BENCH_SCALES)' RDS_CSI_E2E_BENCH_RUNS='$(BENCH_RUNS)' \
	  $(GO) test -tags e2e -count=1 -timeout 180m -run 'TestScaleStartBench$$' -v ./e2e/ | grep -E '^(\||[0-9]+k[:,] |ok|FAIL|--- |panic)'

# Publish latency on the e2e control plane (real kube-apiserver,
# csi-attacher, the simulator at 1 ms per RouterOS command): 600 publishes
# per test, p50/p90/p99 in the test log (docs/BENCHMARKS.md): fencing off,
# storage fencing, and a healthy box's publishes with another RDS box
# answering or frozen (issue 36). About 11 minutes warm.
bench-publish:
	./hack/build-controlplane.sh
	RDS_CSI_E2E_BENCH=1 $(GO) test -tags e2e -count=1 -timeout 30m -run 'TestPublishLatency(StorageFencing|OtherBoxHealthy|OtherBoxHanging)?$$' -v ./e2e/ | grep -E 'publishes: p50|^(ok|FAIL|---)'

# The driver on a real control plane (hack/demo.sh, e2e/cmd/demo):
# provision, attach, node failure, fenced handoff, snapshot, unattended
# failover, cleanup. hack/demo.sh builds bin/ (`make build`) and the demo
# program while the control plane builds in the background when missing
# (estimate printed up front; seconds warm). It needs none of the host tools
# of `deps`. DEMO_ARGS=-v prints every timeline line.
demo:
	./hack/demo.sh $(DEMO_ARGS)

# The RDS simulator alone, over SSH (hack/demo-rds.sh).
demo-rds: build
	./hack/demo-rds.sh

# A release into DIST (hack/release.sh, docs/release.md): from a clean
# tree, as root (the images), the image archives (amd64, arm64), the
# chart package, kubectl-rds for linux and darwin on amd64 and arm64 with
# the krew manifest of their sums, an SBOM of each binary and image,
# the release notes from CHANGELOG.md and SHA256SUMS. The e2e test
# TestReleaseArtifacts makes one and checks every file.
DIST ?= dist
.PHONY: release
release:
	IMAGE_REPO='$(IMAGE_REPO)' ./hack/release.sh '$(DIST)'

clean:
	rm -rf $(BIN) $(DIST)
