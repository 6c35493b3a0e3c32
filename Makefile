# xingmai: one Makefile for installing, testing, running and benchmarking.
#   make run      the main job (see README): TiTa vs DCQCN vs no CC on AI traffic (RUN_ARGS=...)
#   make sim      the short suite on the simulated twin: no root, one process (RUN_ARGS=...)
#   make cli      the same network with Mininet's CLI and the project's commands
#   make doctor   what this machine has and lacks for the testbed
#   make test     installs what is missing, builds the docs, then runs the test suite (root: all of it;
#                 the tests without root on TEST_WORKERS processes, then the root ones one at a time)
#   make docs     the documentation site (mkdocs, strict: a broken link fails it) into site/
#   make test-fast  the tests that need neither root nor long runs (under a minute)
#   make lint     ruff check, ruff format --check, mypy (CI runs it before the tests)
#   make install  apt packages + virtual environment + pinned pip packages (idempotent)
#   make bench    benchmarks, written to results/bench.json
#   make fuzz     fuzz every input surface (FUZZ_CASES each, 10000), counts to results/fuzz.json;
#                 the native switch pipeline and the twin's native NIC against their references
#                 (results/fuzz-native.json, fuzz-nic.json), again built with AddressSanitizer
#                 and UBSan (results/fuzz-*-sanitized.json)
#   make faults   the daemon fault tests (root), their figures to results/faults.json
#   make p4       recompile p4src/ where p4c is installed, refresh p4src/build/ and its stamp,
#                 and regenerate the controller's P4 names (controller/p4names.py)
#   make proto    generate the gRPC stubs of controller/proto/*.proto

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# Debian packages the project uses: mnexec for Mininet, bcc for the eBPF NIC, kernel headers
# for bcc, traffic tools, and the tools the tests drive (ip, tc, ethtool, tcpdump; openssl
# makes the controller's mTLS test certificates; prometheus is the testbed's metrics server;
# chromium and its WebDriver run the fabric page's browser test).
APT_PACKAGES := mininet python3-bpfcc bpfcc-tools libbpfcc linux-headers-amd64 iproute2 \
	ethtool iperf3 tcpdump kmod procps psmisc iputils-ping openssl prometheus chromium \
	chromium-driver
# bcc compiles against kernel headers; when the running kernel ships none, Debian's headers
# are merged into this folder and the agent points BCC_KERNEL_SOURCE at it.
KERNEL_HEADERS := /var/cache/xingmai/kernel-headers
PROTOS := $(wildcard controller/proto/*.proto)
PROTO_OUT := $(PROTOS:.proto=_pb2.py)

.PHONY: install apt venv kernel-headers proto native test test-fast run sim cli doctor bench fuzz faults p4 \
	lint clean p4runtime-shell docs

install: $(STAMP) proto native

# the native switch pipeline of the project's program, compiled into the per-user cache now
# rather than by the first switches of a run (testbed/switch/prebuild.py; quick when cached)
native: $(STAMP) proto
	$(PY) -m testbed.switch.prebuild

$(STAMP): pyproject.toml Makefile
	$(MAKE) apt
	$(MAKE) kernel-headers
	$(MAKE) venv
	touch $@

apt:
	@missing=""; for p in $(APT_PACKAGES); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "apt: installing$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	else echo "apt: all packages present"; fi

kernel-headers:
	@if [ -e /lib/modules/$$(uname -r)/build/include ]; then \
		echo "kernel headers: /lib/modules/$$(uname -r)/build"; \
	elif [ -f $(KERNEL_HEADERS)/.merged ]; then \
		echo "kernel headers: $(KERNEL_HEADERS)"; \
	else \
		common=$$(ls -d /usr/src/linux-headers-*-common | sort -V | tail -1); \
		arch=$${common%-common}-amd64; \
		rm -rf $(KERNEL_HEADERS) && mkdir -p $(KERNEL_HEADERS) && \
		cp -a $$common/. $(KERNEL_HEADERS)/ && cp -a $$arch/. $(KERNEL_HEADERS)/ && \
		basename $$arch > $(KERNEL_HEADERS)/.merged && \
		echo "kernel headers: merged $$common and $$arch into $(KERNEL_HEADERS)"; \
	fi

venv:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,emu,plots,sweep]'
	@# bcc's Python module comes from Debian (python3-bpfcc) and is pure Python over libbcc:
	@# expose just that module to the venv, not all of Debian's dist-packages.
	mkdir -p $(VENV)/debian-bcc
	ln -sfn /usr/lib/python3/dist-packages/bcc $(VENV)/debian-bcc/bcc
	echo "$(abspath $(VENV))/debian-bcc" > $$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/debian-bcc.pth

proto: $(PROTO_OUT)

controller/proto/%_pb2.py: controller/proto/%.proto $(STAMP)
	$(PY) -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. $<

# The tests that need no root share the cores (pytest-xdist, TEST_WORKERS of them); then the
# root tests, the emulation's among them, one at a time: their timing is the machine's.
TEST_WORKERS ?= auto
test: install p4runtime-shell docs
	@rc=0; \
	$(PY) -m pytest -m "not root" -n $(TEST_WORKERS) $(PYTEST_ARGS) || rc=$$?; \
	$(PY) -m pytest -m root $(PYTEST_ARGS) || rc=$$?; \
	exit $$rc

test-fast: install
	$(PY) -m pytest -q -m "not root and not slow" $(PYTEST_ARGS)

run: install
	$(PY) -m testbed run $(RUN_ARGS)

sim: install
	$(PY) -m testbed run --engine sim --quick $(RUN_ARGS)

cli: install
	$(PY) -m testbed cli $(RUN_ARGS)

doctor:
	@if [ -x $(PY) ]; then $(PY) -m testbed doctor; else \
		echo "no $(VENV) yet: make install sets up everything (apt, venv, pinned packages)"; \
		exit 1; fi

bench: install
	mkdir -p results
	$(PY) -m testbed.bench --out results/bench.json

faults: install
	mkdir -p results
	rm -f results/faults.json
	XM_FAULT_FIGURES=results/faults.json $(PY) -m pytest -m fault -p no:cacheprovider $(PYTEST_ARGS)

FUZZ_CASES ?= 10000
# the native switch pipeline against the reference, NATIVE_FUZZ_PACKETS packets per program
# (SANITIZED_FUZZ_PACKETS under the sanitizers); the twin's native NIC, NIC_FUZZ_SEEDS runs per
# law and program; the native transport core, TRANSPORT_FUZZ_SEEDS sequences per configuration
NATIVE_FUZZ_PACKETS ?= 100000
SANITIZED_FUZZ_PACKETS ?= 20000
NIC_FUZZ_SEEDS ?= 30
TRANSPORT_FUZZ_SEEDS ?= 100
# the native code built with AddressSanitizer and UBSan (testbed/switch/native/build.py), their
# runtime loaded first into Python; Python's own allocations are not the leak check's business
SANITIZED := XINGMAI_NATIVE_SANITIZE=address,undefined ASAN_OPTIONS=detect_leaks=0 \
	LD_PRELOAD=$$($${CC:-cc} -print-file-name=libasan.so)
fuzz: install
	mkdir -p results
	$(PY) -m tests.fuzz --cases $(FUZZ_CASES) --out results/fuzz.json
	$(PY) -m tests.fuzz.native --packets $(NATIVE_FUZZ_PACKETS) --out results/fuzz-native.json
	$(SANITIZED) $(PY) -m tests.fuzz.native --packets $(SANITIZED_FUZZ_PACKETS) \
		--out results/fuzz-native-sanitized.json
	$(PY) -m tests.fuzz.nic --seeds $(NIC_FUZZ_SEEDS) --out results/fuzz-nic.json
	$(SANITIZED) $(PY) -m tests.fuzz.nic --seeds $(NIC_FUZZ_SEEDS) --out results/fuzz-nic-sanitized.json
	$(PY) -m tests.fuzz.transport_native --seeds $(TRANSPORT_FUZZ_SEEDS) \
		--out results/fuzz-transport.json
	$(SANITIZED) $(PY) -m tests.fuzz.transport_native --seeds $(TRANSPORT_FUZZ_SEEDS) \
		--out results/fuzz-transport-sanitized.json

p4: install
	$(PY) -m testbed.p4build
	$(PY) -m controller.p4gen

# p4runtime-shell pins protobuf 3.x, which the project's venv cannot share: it gets its own.
P4RT_SHELL_VENV := .venv-p4runtime-shell
P4RT_SHELL_PINS := p4runtime-shell==0.0.6 p4runtime==1.4.1 protobuf==3.20.3 grpcio==1.85.3
p4runtime-shell: $(P4RT_SHELL_VENV)/.stamp
$(P4RT_SHELL_VENV)/.stamp: Makefile
	test -x $(P4RT_SHELL_VENV)/bin/python || $(PYTHON) -m venv $(P4RT_SHELL_VENV)
	$(P4RT_SHELL_VENV)/bin/python -m pip install -q $(P4RT_SHELL_PINS)
	touch $@

# the docs site (mkdocs.yml: docs/ as pages, strict, so a broken link or anchor fails the build)
docs: install
	$(VENV)/bin/mkdocs build --strict --site-dir site

# install builds the gRPC stubs first (proto): mypy checks the code against them
lint: install
	$(VENV)/bin/ruff check controller testbed tests
	$(VENV)/bin/ruff format --check controller testbed tests
	$(VENV)/bin/mypy controller testbed

clean:
	rm -rf $(VENV) $(P4RT_SHELL_VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info site
