# computeql — the two commands that matter are `make run` and `make test`.
GO ?= go
PKGS := ./...
# Where make images writes the guest images the libvirt tests boot (ignored by git).
IMAGES_DIR ?= $(CURDIR)/images

.PHONY: run test clients images virt-test openstack-test bench-virt bench-openstack bench-publish cluster-test chaos vet fmt-check generate generate-check bench gobench bench-compile bench-instructions bench-queue fuzz lint

## run: the whole system in one process with an embedded in-memory Redis and demo data.
run:
	$(GO) run .

## test: everything CI checks: formatting, vet, generated code current, all tests with -race
## (with Chromium installed, the browser tests of e2e/ too, their screenshots in
## artifacts/browser/), and every benchmark compiled and run once so none rots.
test: fmt-check vet generate-check clients
	COMPUTEQL_ARTIFACTS=$(CURDIR)/artifacts $(GO) test -race -count=1 -skip '^TestDeploymentOnCluster$$|^TestChaos|^TestLibvirt|^TestOpenStack' $(PKGS)
	@if command -v redis-server >/dev/null; then $(MAKE) cluster-test; else echo "no redis-server: cluster-test not run"; fi
	@if command -v libvirtd >/dev/null && command -v qemu-system-x86_64 >/dev/null; then $(MAKE) virt-test; \
		else echo "no libvirtd or qemu-system-x86_64: virt-test not run"; fi
	@if [ -n "$$CI" ] || command -v nova-api >/dev/null; then $(MAKE) openstack-test; \
		else echo "no OpenStack packages: openstack-test not run (openstacktest/README.md)"; fi
	$(MAKE) chaos CHAOS=small CHAOSFLAGS=
	$(MAKE) bench-compile

## clients: the npm packages of e2e's client suites (e2e/clients_test.go), pinned in
## e2e/clients/package-lock.json, installed with npm ci when missing or older than the lock
## file. Without npm nothing is installed, and those suites skip (under CI they fail).
clients: e2e/clients/node_modules/.package-lock.json

e2e/clients/node_modules/.package-lock.json: e2e/clients/package-lock.json
	@if command -v npm >/dev/null; then npm ci --prefix e2e/clients --no-audit --no-fund; \
		else echo "no npm: the npm client suites of e2e/ will skip"; fi

## images: the guest images of the libvirt tests, built from Debian's packages only (guest/README.md):
## a busybox initramfs guest that boots in seconds, and a Debian 12 image with cloud-init,
## openssh-server and qemu-guest-agent (debootstrap through the machine's Debian mirror). Each
## is rebuilt only when its scripts changed since.
images: $(IMAGES_DIR)/busybox/initrd.img $(IMAGES_DIR)/debian/disk.qcow2

$(IMAGES_DIR)/busybox/initrd.img: guest/build-busybox.sh $(wildcard guest/busybox/*)
	./guest/build-busybox.sh $(IMAGES_DIR)/busybox

$(IMAGES_DIR)/debian/disk.qcow2: guest/build-debian.sh $(shell find guest/debian -type f 2>/dev/null)
	./guest/build-debian.sh $(IMAGES_DIR)/debian

## virt-test: the libvirt region against a real libvirtd and real QEMU guests (software
## emulation where KVM cannot run them), which the tests start themselves in network and mount
## namespaces of their own and remove afterwards; builds the guest images first (make images).
## make test runs it once, here, when libvirtd and QEMU are installed: its run of all packages
## leaves these tests out.
virt-test: images
	COMPUTEQL_IMAGES_DIR=$(IMAGES_DIR) $(GO) test -race -count=1 -timeout 20m -run '^TestLibvirt' ./region/libvirt/ ./e2e/virt/

## openstack-test: the tests of a real OpenStack control plane (openstacktest/README.md:
## MariaDB, RabbitMQ, Keystone, Glance, Placement, Nova with its fake driver or a libvirt
## compute, and neutron-server, from Debian's packages, as processes the tests start on free
## loopback ports and stop), which fail rather than skip when the packages are missing. make
## test runs it once, here, when they are installed (under CI always: .ci/run installs them):
## its run of all packages leaves these tests out. With the harness's own tests, the OpenStack
## region driver's contract (region/openstack) and the end-to-end suite of e2e/openstack (the
## built binary's api and worker processes in front of the control plane whose libvirt
## compute boots the busybox guest of make images, driven through GraphQL); -p 1, since each
## package brings up a control plane of its own.
openstack-test: images
	COMPUTEQL_REQUIRE_OPENSTACK=1 COMPUTEQL_IMAGES_DIR=$(IMAGES_DIR) $(GO) test -race -count=1 -p 1 -timeout 15m -run '^TestOpenStack' ./openstacktest/ ./region/openstack/ ./e2e/openstack/

## cluster-test: the end-to-end suite of e2e/deployment (separate api and worker processes of the
## built binary) on a 3-master Redis Cluster it starts on loopback ports with redis-server
## --cluster-enabled and redis-cli --cluster create, and stops. make test runs it once, here:
## its run of all packages leaves this test out.
cluster-test:
	$(GO) test -race -count=1 -run '^TestDeploymentOnCluster$$' ./e2e/deployment

## chaos: the reliability suite of e2e/chaos (docs/reliability.md): worker kills, Redis
## restarts, an API restart under subscribers, region faults, network blips and a hostile
## tenant against the
## built binary and real redis-servers, each followed by the invariant checker; every scenario
## logs its row of docs/reliability.md's table (REPORT). CHAOS=full is the table's sizes; make test runs
## CHAOS=small, here, once: its run of all packages leaves these tests out. The scenarios run
## at once (-parallel 7): they spend most of their time waiting out the queue's 30 s lease.
CHAOS ?= full
CHAOSFLAGS ?= -v
chaos:
	COMPUTEQL_CHAOS=$(CHAOS) $(GO) test -race -count=1 -parallel 7 -timeout 30m $(CHAOSFLAGS) -run '^TestChaos' ./e2e/chaos

vet:
	$(GO) vet $(PKGS)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

## generate: regenerate gqlgen code from schema.graphqls.
generate:
	$(GO) generate $(PKGS)

## generate-check: fails when `go generate` would change the committed generated code.
generate-check: generate
	@if [ -n "$$(git status --porcelain -- graph gqlgen.yml schema.graphqls)" ]; then \
		echo "generated code is not current; run make generate and commit:"; \
		git status --porcelain -- graph; git diff --stat -- graph; exit 1; fi

## bench-compile: every Go benchmark compiled and run once, and the queue benchmark's module
## (bench/queue, below) built and vetted, so that none rots.
bench-compile:
	$(GO) test -run='^$$' -bench=. -benchtime=1x $(PKGS)
	cd bench/queue && $(GO) build -o /dev/null . && $(GO) vet ./...

## bench-instructions: the instructions one create costs the API and Redis, and one request
## the bare gqlgen handler, counted under valgrind's callgrind: the same from run to run on a
## noisy machine, where CPU times are not (docs/performance.md).
REQUESTS ?= 2000
bench-instructions:
	$(GO) run . bench --instructions $(REQUESTS)

## bench-queue: the work queue beside bare Redis Streams commands and asynq, on one
## redis-server it starts itself on a free loopback port (on CPU 0, the tool on the others):
## 50,000 distinct keys, no-op handlers, 4 and 16 handlers, ROUNDS interleaved rounds (about
## 20 seconds each here), the medians of items/s and Redis CPU per 1,000 items as a markdown
## table (docs/performance.md). bench/queue is a module of its own, so that only it depends on
## asynq; on a fresh machine its first run downloads its modules through the Go module proxy.
ROUNDS ?= 3
bench-queue:
	cd bench/queue && $(GO) run . -rounds $(ROUNDS)

## bench: the load tool at its default sizes (under 3 minutes): the whole system, started with a
## real redis-server, against the machine's limits; writes bench-results/latest.{json,md}
## (ignored by git; make bench-publish updates the committed docs/bench instead). Then, when
## libvirtd and QEMU are installed, its libvirt phase: bench-virt; when the OpenStack packages
## are, its OpenStack phase: bench-openstack.
bench:
	$(GO) run . bench
	@if command -v libvirtd >/dev/null && command -v qemu-system-x86_64 >/dev/null; then $(MAKE) bench-virt; \
		else echo "no libvirtd or qemu-system-x86_64: the libvirt phase (bench-virt) not run"; fi
	@if command -v nova-api >/dev/null; then $(MAKE) bench-openstack; \
		else echo "no OpenStack packages: the OpenStack phase (bench-openstack) not run (openstacktest/README.md)"; fi

## bench-publish: make bench's load tool, writing the committed report docs/bench/latest.*.
bench-publish:
	$(GO) run . bench --out docs/bench

## bench-openstack: seconds from createInstance to RUNNING through computeql (the built
## binary's api and worker) in front of a real OpenStack control plane (openstacktest), for 1
## and 8 instances at once, beside the seconds Nova alone takes to make the same servers
## ACTIVE (docs/performance.md).
bench-openstack:
	COMPUTEQL_BENCH_OPENSTACK=1 COMPUTEQL_REQUIRE_OPENSTACK=1 $(GO) test -run='^$$' -bench=OpenStackCreate -benchtime=3x -timeout 20m ./e2e/openstack/

## bench-virt: seconds from creating a real guest to RUNNING and to its answering HTTP, for 1
## and 4 at once, on a private libvirtd, beside the simulator's figure (docs/libvirt.md).
bench-virt: images
	COMPUTEQL_IMAGES_DIR=$(IMAGES_DIR) $(GO) test -run='^$$' -bench=LibvirtBoot -benchtime=3x ./region/libvirt/

## gobench: the Go benchmarks with enough iterations to read figures from.
gobench:
	$(GO) test -run='^$$' -bench=. -benchmem -benchtime=2s $(PKGS)

## fuzz: every fuzz target for FUZZTIME each. make test already replays their seeds and any
## input saved under a package's testdata/fuzz/, which is where a failing one is written.
## FUZZMINIMIZE caps the time spent shrinking each new input: Go's default of 60s would use
## up a short run. Go 1.26's fuzz coordinator can fail a run with "context deadline exceeded"
## as FUZZTIME ends (go.dev/issue/75804); such a run wrote no failing input and is only reported.
FUZZTIME ?= 20s
FUZZMINIMIZE ?= 2s
FUZZ_TARGETS := ./instance:FuzzName ./instance:FuzzTags ./instance:FuzzUserData \
	./instance:FuzzSourceCIDR ./instance:FuzzInstanceID ./instance:FuzzListCursor \
	./instance:FuzzEventCursor ./auth:FuzzVerify ./region:FuzzParse ./server:FuzzGraphQLDocument \
	./app:FuzzParseFaults ./jsonvalue:FuzzParseDecodesAsEncodingJSON \
	./jsonvalue:FuzzAppendStringIsEncodingJSONs ./region/libvirt/nocloud:FuzzSeed
fuzz:
	@log=$$(mktemp); trap 'rm -f $$log' EXIT; \
	for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t#*:}; corpus=$$pkg/testdata/fuzz/$$name; \
		echo "== $$name ($$pkg)"; \
		before=$$(ls $$corpus 2>/dev/null | wc -l); \
		if $(GO) test -run='^$$' -fuzz="^$$name\$$" -fuzztime=$(FUZZTIME) -fuzzminimizetime=$(FUZZMINIMIZE) $$pkg >$$log 2>&1; then \
			tail -n 3 $$log; continue; \
		fi; \
		cat $$log; \
		if [ "$$(ls $$corpus 2>/dev/null | wc -l)" = "$$before" ] && grep -qx '    context deadline exceeded' $$log; then \
			echo "(no failing input: the coordinator's deadline race, go.dev/issue/75804)"; \
		else \
			exit 1; \
		fi; \
	done

lint: fmt-check vet
