# outboxchat: `make demo` runs the lab's demo; `make test` runs every test.
# Both install PostgreSQL and Redis with apt-get when they are missing;
# `make test` (through `make deps`) also PgBouncer, promtool, libfaketime and Chromium,
# which only the tests use: see scripts/install-deps.sh.

GO ?= go
BIN := bin/outboxchat
# Every package of every module of the workspace (go.work): the library
# module at the root, and the app, lab, CLI and deploy modules under it.
PKGS = $(shell $(GO) list -m -f '{{.Dir}}/...')
UPFLAGS ?=
TESTFLAGS ?= -race -count=1 -timeout 12m

.PHONY: all build demo up test lint deps bench clean tidy

all: build

deps:
	./scripts/install-deps.sh --test --browser

build:
	$(GO) build -o $(BIN) ./cmd/outboxchat

demo: build
	./scripts/install-deps.sh
	./$(BIN) lab demo

# make up UPFLAGS="--consumers-addr 8080 --workers-addr 8081 --keep-logs"
# exec: the lab replaces the recipe's shell, so it is make's own child and
# gets the SIGTERM that make passes on to its children (kill <make's pid>
# stops the lab cleanly). Ctrl-C reaches it from the terminal. GNU make does
# not pass on a SIGINT sent to its pid alone: send that to the lab's pid.
up: build
	./scripts/install-deps.sh
	exec ./$(BIN) lab up $(UPFLAGS)

test: deps
	$(GO) vet $(PKGS)
	$(GO) test $(TESTFLAGS) $(PKGS)

bench: deps
	$(GO) test -run '^$$' -bench . -benchtime 2s $(PKGS)

STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }
	$(GO) vet $(PKGS)
	$(GO) run $(STATICCHECK) $(PKGS)

clean:
	rm -rf bin

# tidy each module's go.mod on its own (go mod tidy does not read go.work).
tidy:
	for d in $$($(GO) list -m -f '{{.Dir}}'); do (cd $$d && GOWORK=off $(GO) mod tidy) || exit 1; done
