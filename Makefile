# computeql — the two commands that matter are `make run` and `make test`.
GO ?= go
PKGS := ./...

.PHONY: run test vet fmt-check generate generate-check bench bench-compile lint

## run: the whole system in one process with an embedded in-memory Redis and demo data.
run:
	$(GO) run .

## test: everything CI checks: formatting, vet, generated code current, all tests with -race,
## and every benchmark compiled and run once so none rots.
test: fmt-check vet generate-check
	$(GO) test -race -count=1 $(PKGS)
	$(MAKE) bench-compile

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

bench-compile:
	$(GO) test -run='^$$' -bench=. -benchtime=1x $(PKGS)

## bench: the benchmarks with enough iterations to read figures from.
bench:
	$(GO) test -run='^$$' -bench=. -benchmem -benchtime=2s $(PKGS)

lint: fmt-check vet
