// Package archtest holds the project's import rules and the test that
// checks the real import graph against them.
//
// Every package of every module in the workspace is placed in a layer by
// its path (Places in rules.go: "x" is package x alone, "x/..." is x and
// everything below it; the longest pattern that matches wins). A layer says
// which layers its non-test files may import (May), which more its test
// files may import (TestMay: test support such as internal/testenv), and,
// for the library, which modules outside the standard library it may use
// (External). Each package may import itself (an external test package
// does).
//
// The test fails, naming the arrow, on an import a layer does not allow,
// and on a package that no pattern places: a new package has to be given a
// layer before it can land. It also fails on a top-level declaration or an
// embedded file named for a concept that Confinements keeps out of the
// package's layer (presence, which is the app's chat/presence, out of the
// library). The rules are data; a change of the
// architecture is a change of the tables in rules.go.
//
// The direction, bottom to top: the library (outbox, redisq, inbox,
// outboxtest and internal/...) imports only the library; the app's
// vocabulary chat and chat/presence, then chat/schema and chat/auth, then the parts
// chat/store, chat/receive, chat/gateway and chat/status, then the HTTP
// surface chat/httpapi and chat/web (which talk to the parts through small
// interfaces, not by importing them), then chat/server, which wires
// everything; the lab over the library and the app; cmd over everything;
// deploy's test over the lab. No part of the app imports the lab or cmd.
package archtest
