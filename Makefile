# ebs-csi: build, test and demo entry points. Every target installs what it
# needs, idempotently, so a fresh Debian machine needs nothing but this.

CARGO ?= cargo
APT_PACKAGES := e2fsprogs xfsprogs util-linux fdisk mount systemd python3-venv
# Dependencies build without debug info (see Cargo.toml); two jobs fit the
# machine's memory while the AWS SDK compiles.
export CARGO_BUILD_JOBS ?= 2

# moto server (PyPI), the EC2 API the controller tests run against, in a
# git-ignored virtual environment.
MOTO_SPEC := moto[ec2,server]>=5.1,<6
VENV := .venv

.PHONY: all build test demo bench bench-smoke deps moto fuzz fuzz-smoke fuzz-tools lint fmt clean

all: build

## deps: install the Debian packages the tests and the helper need.
deps:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

## moto: install moto into $(VENV) once (a stamp records the spec).
moto: $(VENV)/.moto-installed

$(VENV)/.moto-installed: | deps
	@test -x $(VENV)/bin/python || python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check '$(MOTO_SPEC)'
	@echo '$(MOTO_SPEC)' > $@

build:
	$(CARGO) build --workspace --bins

## test: unit tests, then the root-only integration tests that start the
## real helper and agent over loop devices.
test: deps moto
	$(CARGO) build --workspace --bins
	$(CARGO) test --workspace --no-fail-fast
	$(MAKE) --no-print-directory bench-smoke fuzz-smoke

## bench: speed and footprint against baselines measured in the same run
## (target/bench/report.md and report.json; docs/performance.md explains them).
bench: deps
	$(CARGO) build --release --workspace --bins
	@mkdir -p target/bench
	EBS_CSI_BENCH_EC2=$(CURDIR)/target/bench/ec2.txt $(CARGO) test --quiet --release -p ebs-csi-controller -- --ignored bench_ec2_calls_per_volume
	$(CARGO) run --quiet --release --bin ebs-csi-bench -- --out target/bench --ec2-rows target/bench/ec2.txt

## bench-smoke: the same code with tiny sizes and one repetition, so it cannot rot.
bench-smoke:
	$(CARGO) run --quiet --bin ebs-csi-bench -- --smoke --out target/bench-smoke

# cargo fuzz needs nightly-only compiler flags; RUSTC_BOOTSTRAP lets the
# machine's stable toolchain accept them (no other toolchain can be fetched).
FUZZ := cd fuzz && RUSTC_BOOTSTRAP=1 $(CARGO) fuzz run request corpus/request seeds/request --

fuzz-tools:
	@command -v cargo-fuzz >/dev/null || $(CARGO) install --quiet --locked cargo-fuzz

## fuzz: fuzz the helper's frame decoder and request validation for 10 minutes.
fuzz: fuzz-tools
	@mkdir -p fuzz/corpus/request
	$(FUZZ) -max_total_time=600

## fuzz-smoke: the short bounded run inside `make test`.
fuzz-smoke: fuzz-tools
	@mkdir -p fuzz/corpus/request
	$(FUZZ) -runs=20000 -max_total_time=60

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
