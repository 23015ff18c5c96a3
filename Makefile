# Berth. `make demo` runs the whole system on the GitHub simulator;
# `make test` runs every test. Both work on a fresh machine with Go 1.26.
SHELL := /bin/bash
GO ?= go
BIN := $(CURDIR)/bin
export PATH := $(BIN):$(PATH)
NATSCLI_VERSION := v0.5.0
TEST_FLAGS ?= -race -count=1 -timeout 15m

.PHONY: demo test tools build schemas vet fmt-check clean images bench bench-smoke help

## demo: 200 jobs through embedded NATS, dispatcher, watchdog, two exec agents and the GitHub simulator
## (prints the operator's page address; DEMO_FLAGS=-help lists its flags)
demo:
	@echo "building the demo into $(BIN)/demo (the first build compiles nats-server, go-github, the AWS SDK and Berth: a few minutes on a cold cache, seconds after)"
	$(GO) build -o $(BIN)/demo ./tests/cmd/demo
	$(BIN)/demo $(DEMO_FLAGS)

## help: the targets and what each does
help:
	@awk '/^## [a-z-]+:/{sub(/^## /, ""); print "  " $$0; next} /^## /{sub(/^## /, ""); print "      " $$0}' $(firstword $(MAKEFILE_LIST))

## test: unit, property, fuzz-seed, end-to-end, fault-scenario, crash-point, compose, browser and nats-CLI tests
test: tools
	$(GO) vet ./events/... ./services/... ./tests/...
	$(GO) test $(TEST_FLAGS) ./events/... ./services/... ./tests/...
	@echo "== 3 dispatchers, 1,000 jobs at once; 1,000 jobs through a scale set losing messages (without the race detector, which slows them tenfold)"
	BERTH_SCALESET_JOBS=1000 $(GO) test -count=1 -timeout 15m -run 'TestThreeDispatchersNeverOverbook|TestScaleSetIntakeServesEveryJobOnceThroughFaults' ./tests/e2e/

## bench: the full bench suite, about 10 minutes on 2 cores: prints a table and appends a
## dated section to BENCHMARKS.md (BENCH_FLAGS=-no-write to only print; -h lists sizes)
bench:
	@mkdir -p $(BIN)
	$(GO) run ./tests/cmd/bench -cpuprofile $(BIN)/bench-throughput.pprof -invoked-as "make bench$(if $(BENCH_FLAGS), BENCH_FLAGS='$(BENCH_FLAGS)')" $(BENCH_FLAGS)

## bench-smoke: the same suite at tiny sizes, under a minute, so it stays runnable
bench-smoke:
	$(GO) run ./tests/cmd/bench -smoke -invoked-as "make bench-smoke$(if $(BENCH_FLAGS), BENCH_FLAGS='$(BENCH_FLAGS)')" $(BENCH_FLAGS)

## chaos: the chaos test at full size: 2000 jobs through the real service processes on a
## 3-node NATS cluster while a random part is SIGKILLed and restarted every few seconds (CHAOS_JOBS,
## and BERTH_CHAOS_SEED to replay a run's choices; CHAOS_JOBS=150 is the short run)
CHAOS_JOBS ?= 2000
.PHONY: chaos
chaos:
	BERTH_CHAOS_JOBS=$(CHAOS_JOBS) $(GO) test -count=1 -v -run TestChaos ./tests/chaos/ -timeout 60m

## tools: the nats CLI the inspection tests use, installed into ./bin
tools: $(BIN)/nats
$(BIN)/nats:
	@echo "installing natscli $(NATSCLI_VERSION) into $(BIN) (takes a minute the first time)"
	GOBIN=$(BIN) $(GO) install github.com/nats-io/natscli/nats@$(NATSCLI_VERSION)

## build: the berth command and the simulator into ./bin
build:
	$(GO) build -o $(BIN)/berth ./services/cmd/berth
	$(GO) build -o $(BIN)/ghsim ./tests/cmd/ghsim

## schemas: regenerate schemas/ from the event types (a test fails when they are stale)
schemas:
	$(GO) run ./services/cmd/schemagen schemas

## vet: go vet over every module (make test runs it too)
vet:
	$(GO) vet ./events/... ./services/... ./tests/...

## tidy-check: every module is tidy (go mod tidy changes nothing) and the tests module builds and
## vets on its own (GOWORK=off, through its replace directives)
.PHONY: tidy-check
tidy-check:
	@for m in events services tests; do \
		(cd $$m && cp go.mod go.mod.tidy-check && cp go.sum go.sum.tidy-check && $(GO) mod tidy && \
		 cmp -s go.mod go.mod.tidy-check && cmp -s go.sum go.sum.tidy-check; s=$$?; \
		 mv go.mod.tidy-check go.mod; mv go.sum.tidy-check go.sum; \
		 test $$s = 0 || { echo "$$m: go mod tidy changes go.mod or go.sum: run it and commit"; exit 1; }) || exit 1; \
	done
	cd tests && GOWORK=off $(GO) build ./... && GOWORK=off $(GO) vet ./...

## fmt-check: every Go file is gofmt'd (CI runs it)
fmt-check:
	@test -z "$$(gofmt -l events services tests)" || (gofmt -l events services tests; echo "run gofmt -w"; exit 1)

## clean: remove ./bin and ./data (berth dev's state)
clean:
	rm -rf $(BIN) data

## images: berth, nats and demo (berth + the GitHub simulator) images FROM scratch, from static binaries built here
## (linux binaries for the host's CPU, also when make runs on macOS)
IMAGE_DIR := $(BIN)/images
images:
	mkdir -p $(IMAGE_DIR)/berth $(IMAGE_DIR)/nats $(IMAGE_DIR)/demo
	@echo "images 1/6: static linux berth (CGO off, -trimpath: a full rebuild of every package, minutes the first time)"
	CGO_ENABLED=0 GOOS=linux $(GO) build -trimpath -o $(IMAGE_DIR)/berth/berth ./services/cmd/berth
	@echo "images 2/6: static linux ghsim, the GitHub simulator the demo image runs"
	CGO_ENABLED=0 GOOS=linux $(GO) build -trimpath -o $(IMAGE_DIR)/demo/ghsim ./tests/cmd/ghsim
	cp $(IMAGE_DIR)/berth/berth $(IMAGE_DIR)/demo/
	@echo "images 3/6: static linux nats-server, at the version services/go.mod pins"
	cd services && CGO_ENABLED=0 GOOS=linux GOWORK=off $(GO) build -trimpath -o $(IMAGE_DIR)/nats/nats-server github.com/nats-io/nats-server/v2
	cp deploy/nats/nats.conf $(IMAGE_DIR)/nats/
	@echo "images 4/6: docker build berth/berth:local (FROM scratch: seconds)"
	docker build -q -t berth/berth:local -f deploy/docker/berth.Dockerfile $(IMAGE_DIR)/berth
	@echo "images 5/6: docker build berth/nats:local"
	docker build -q -t berth/nats:local -f deploy/docker/nats.Dockerfile $(IMAGE_DIR)/nats
	@echo "images 6/6: docker build berth/demo:local"
	docker build -q -t berth/demo:local -f deploy/docker/demo.Dockerfile $(IMAGE_DIR)/demo

## darwin-check: on any OS, type-check the vz backend's darwin/arm64 cgo build (its darwin files
## against github.com/Code-Hex/vz/v3) with go/types; C itself needs a Mac (make vz-test). Also
## part of make test.
.PHONY: darwin-check
darwin-check:
	$(GO) test -count=1 -run TestDarwinBuildTypeChecks -v ./services/internal/crosscheck/

## vz-test: on a Mac with Apple silicon: lint the plists, vet and test the vz backend against
## Virtualization.framework (the test binary is signed so it may run guests; each guest in a
## helper process, the test binary re-executed), and build a signed bin/berth.
## BERTH_VZ_BASE_IMAGE=DIR (a base image with deploy/guest installed, docs/macos.md) also boots
## a real guest and stops it.
.PHONY: vz-test
vz-test:
	@test "$$(uname -s)/$$(uname -m)" = Darwin/arm64 || { echo "vz-test needs macOS on Apple silicon"; exit 1; }
	plutil -lint deploy/launchd/berth.entitlements deploy/launchd/ci.berth.agent.plist deploy/guest/ci.berth.guest.plist
	CGO_ENABLED=1 $(GO) vet ./services/vmagent/backends/vz/...
	CGO_ENABLED=1 $(GO) test -count=1 -skip TestRealGuest ./services/vmagent/backends/vz/... ./services/install/
	@mkdir -p $(BIN)
	CGO_ENABLED=1 $(GO) test -c -o $(BIN)/vz.test ./services/vmagent/backends/vz/
	codesign --force --sign - --entitlements deploy/launchd/berth.entitlements $(BIN)/vz.test
	$(BIN)/vz.test -test.count=1 -test.v -test.run 'TestFramework|TestRealGuest' -test.timeout 20m
	CGO_ENABLED=1 $(GO) build -o $(BIN)/berth ./services/cmd/berth
	codesign --force --sign - --entitlements deploy/launchd/berth.entitlements $(BIN)/berth
