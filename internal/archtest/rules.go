package archtest

// A Layer is what the packages placed in it may import. Imports of the
// standard library are always allowed; imports of the project are allowed
// when the imported package's layer is listed; imports of other modules
// are allowed when External is nil or lists a prefix of the import path.
type Layer struct {
	// May lists the layers that the layer's non-test files may import.
	May []string
	// TestMay lists the layers that its test files may import besides May
	// (test support, which non-test files must not import).
	TestMay []string
	// External, when non-nil, lists the import path prefixes of the only
	// modules outside the standard library that the layer's files (test
	// files too) may import. nil: any.
	External []string
}

// A Place puts the packages matching Pattern into Layer. Pattern is a
// package path relative to the project's root module: "x" is package x
// alone, "x/..." is x and every package below it. Of the patterns that
// match a package, the longest wins.
type Place struct {
	Pattern string
	Layer   string
}

// An Interim is an arrow allowed until the package Until exists: a step of
// a restructuring in progress, which the rules of the finished structure
// would forbid. From and To are package paths relative to the root module.
type Interim struct {
	From, To, Until string
	// Why says what the arrow is and what ends it.
	Why string
}

// A Confinement keeps a concept in the packages that own it: no non-test
// file of a package placed in one of the Outside layers may declare a
// top-level identifier (type, func, method, const or var) whose name
// contains Word, in any case, nor embed a file whose name does. (Fields
// are not declarations of the package: a key name in a struct may stay.)
type Confinement struct {
	Word    string
	Outside []string
	// Why says whose the concept is.
	Why string
}

// Layer names.
const (
	library  = "library"
	natsq    = "natsq"     // natsq: the NATS JetStream broker, a module of its own
	testenv  = "testenv"   // internal/testenv: private servers for tests
	vocab    = "chat"      // the app's vocabulary
	presence = "presence"  // chat/presence: the live processes of a consumer group, their consumer names
	tele     = "telemetry" // chat/telemetry: OpenTelemetry tracing, trace context in event headers
	tracecmd = "trace"     // chat/trace: a message's path across both services, for `outboxchat trace`
	schema   = "schema"    // chat/schema
	lease    = "lease"     // chat/lease: partition leases of the relay processes
	auth     = "auth"      // chat/auth
	store    = "store"     // chat/store
	receive  = "receive"   // chat/receive
	gateway  = "gateway"   // chat/gateway
	status   = "status"    // chat/status
	http     = "http"      // chat/httpapi and chat/web
	server   = "server"    // chat/server
	chattest = "chattest"  // test support of the app
	lab      = "lab"
	labtest  = "labtest" // test support of the binaries that run the lab
	deploy   = "deploy"
	cmd      = "cmd"
	archtest = "archtest"
)

// libraryModules are the only modules outside the standard library that
// the library may import, tests included, so that a service importing
// outbox, redisq and inbox pulls little more than the two clients.
var libraryModules = []string{
	"github.com/jackc/pgx/v5",
	"github.com/redis/go-redis/v9",
	"github.com/google/uuid",
	"go.uber.org/goleak",
}

// app is every layer of the app, bottom to top.
var app = []string{vocab, presence, tele, schema, lease, auth, store, receive, gateway, status, tracecmd, http, server}

// Layers is the architecture: which layer may import which.
var Layers = map[string]Layer{
	library: {May: []string{library}, TestMay: []string{testenv}, External: libraryModules},
	testenv: {May: []string{library}, External: libraryModules},
	// The second broker: the library's interfaces, and nats.go, which no
	// other layer of the library module may import (the lean-module test
	// checks the module graph); the chat's server and the lab dial it for
	// natsq.
	natsq: {May: []string{library}, TestMay: []string{testenv}, External: append([]string{"github.com/nats-io/nats.go"}, libraryModules...)},

	vocab: {May: []string{library}, TestMay: []string{testenv, chattest}},
	// Presence keeps the queue's presence set (redisq.Keys.Presence) and
	// deletes idle consumers through redisq; it knows nothing of the chat.
	presence: {May: []string{library}, TestMay: []string{testenv}},
	// The library carries headers as a plain map; OpenTelemetry stays here.
	tele:   {May: []string{}, TestMay: []string{library, testenv, chattest}},
	schema: {May: []string{library, vocab}, TestMay: []string{testenv, chattest}},
	// Leases need the database only; its tests make the tables with schema.
	lease:   {May: []string{library, vocab}, TestMay: []string{testenv, chattest, schema}},
	auth:    {May: []string{library, vocab}, TestMay: []string{testenv, chattest}},
	store:   {May: []string{library, vocab, schema, auth}, TestMay: []string{testenv, chattest, store}}, // its tests prune (chat/store/prune) between sends
	receive: {May: []string{library, vocab, schema, auth, store}, TestMay: []string{testenv, chattest}},
	gateway: {May: []string{library, vocab, schema, auth}, TestMay: []string{testenv, chattest}},
	status:  {May: []string{library, natsq, vocab, schema, auth, presence}, TestMay: []string{testenv, chattest}},
	// The trace command's queries read what status reads, per message.
	tracecmd: {May: []string{library, vocab, schema, auth}, TestMay: []string{testenv, chattest}},
	// The HTTP surface depends on small interfaces that the server fills
	// with the parts, not on store, receive or gateway themselves.
	http:     {May: []string{library, vocab, schema, auth, status, http}, TestMay: []string{testenv, chattest}},
	server:   {May: join([]string{library, natsq}, app), TestMay: []string{testenv, chattest}},
	chattest: {May: join([]string{library, testenv}, app)},

	lab:     {May: join([]string{library, natsq, lab}, app), TestMay: []string{testenv, labtest}},
	labtest: {May: join([]string{library, testenv, lab}, app)},
	deploy:  {May: join([]string{library, lab}, app), TestMay: []string{testenv, labtest}},
	// The binary wires either broker: its operator commands read natsq's
	// dead letters as they read redisq's.
	cmd: {May: join([]string{library, natsq, lab, cmd}, app), TestMay: []string{testenv, labtest}},

	archtest: {External: []string{}},
}

// Places puts every package of the project into a layer.
var Places = []Place{
	{"outbox/...", library},
	{"redisq/...", library},
	{"inbox/...", library},
	{"outboxtest/...", library},
	{"brokertest/...", library},
	{"natsq/...", natsq},
	{"internal/...", library}, // service, notifier, pgproc, redisproc, pgbouncerproc, spawn, devca, …
	{"internal/testenv/...", testenv},
	{"internal/archtest", archtest},

	{"chat", vocab},
	{"chat/presence/...", presence},
	{"chat/schema/...", schema},
	{"chat/lease/...", lease},
	{"chat/auth/...", auth},
	{"chat/store/...", store},
	{"chat/receive/...", receive},
	{"chat/gateway/...", gateway},
	{"chat/live/...", gateway},
	{"chat/status/...", status},
	{"chat/telemetry/...", tele},
	{"chat/trace/...", tracecmd},
	{"chat/httpapi/...", http},
	{"chat/web/...", http},
	{"chat/server/...", server},
	{"chat/internal/...", chattest},
	// A JSON scanner of the standard library alone, for chat and chat/store.
	{"chat/internal/jsonscan", library},
	// JSON appending of the standard library alone, for chat's encoders.
	{"chat/internal/jsonenc", library},

	{"lab/...", lab},
	{"lab/labtest/...", labtest},
	{"deploy/...", deploy},
	{"cmd/...", cmd},
}

// Confinements are the concepts kept out of layers that are not theirs.
var Confinements = []Confinement{{
	Word:    "presence",
	Outside: []string{library, natsq, testenv},
	Why:     "which processes are live under which consumer name is the app's (chat/presence); the queue library only names the key (redisq.Keys.Presence) and grants it (redisq.ACLRules)",
}}

// Interims are the arrows of a restructuring in progress (none now).
var Interims []Interim

func join(a, b []string) []string { return append(append([]string(nil), a...), b...) }
