// Package queuescript holds redisq's Lua scripts, one per file, each with
// a header stating its KEYS, ARGV and reply: add.lua (add or re-add a
// batch of jobs), trim.lua (delete acknowledged entries and their dedupe
// marks), replay.lua (put a dead letter back on its stream) and
// delete_idle.lua (delete idle consumers with nothing pending); and
// add.lua's calling convention. redis.NewScript computes each SHA1
// locally; callers use EVALSHA and fall back (EVAL, or SCRIPT LOAD and
// retry once) when the server answers NOSCRIPT, e.g. after a restart
// emptied its cache. The scripts are safe for concurrent use.
package queuescript

import (
	_ "embed"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/internal/streamentry"
)

var (
	//go:embed add.lua
	addSource string
	//go:embed trim.lua
	trimSource string
	//go:embed replay.lua
	replaySource string
	//go:embed delete_idle.lua
	deleteIdleSource string
)

// The scripts.
var (
	Add        = redis.NewScript(addSource)
	Trim       = redis.NewScript(trimSource)
	Replay     = redis.NewScript(replaySource)
	DeleteIdle = redis.NewScript(deleteIdleSource)
)

// AddArgs returns add.lua's ARGV for jobs: the dedupe TTL in ms, token ("":
// add; else the re-add's token, unique per call), then per job its id,
// name, payload, signature and encoded headers ("" for none).
func AddArgs(ttlMS int64, token string, jobs []streamentry.Fields) []any {
	args := make([]any, 2, 2+5*len(jobs))
	args[0], args[1] = ttlMS, token
	for _, j := range jobs {
		args = append(args, j.ID, j.Name, j.Payload, j.Sig, streamentry.EncodeHeaders(j.Headers))
	}
	return args
}

// AddReply decodes add.lua's reply {added, failed, err}: how many jobs it
// added, the 1-based index of the job whose XADD failed (0: none) and that
// XADD's error reply; ok is false for a reply of another shape.
func AddReply(reply []any) (added, failed int, msg string, ok bool) {
	if len(reply) != 3 {
		return 0, 0, "", false
	}
	a, ok1 := reply[0].(int64)
	f, ok2 := reply[1].(int64)
	m, ok3 := reply[2].(string)
	return int(a), int(f), m, ok1 && ok2 && ok3
}

// JobReply is the error reply a script got for one job's command (the
// script returns it as text, not as its own error, to say which job).
type JobReply string

// Error returns the reply.
func (e JobReply) Error() string { return string(e) }

// JobFault reports whether e is the job's own fault: a plain "ERR ..."
// reply (a command error from the job's arguments), not the ACL's refusal
// of a command or key (a configuration error of the user, the same for
// every job).
func (e JobReply) JobFault() bool {
	s := string(e)
	return strings.HasPrefix(s, "ERR ") &&
		!strings.HasPrefix(s, "ERR The user executing the script can't") &&
		!strings.HasPrefix(s, "ERR ACL failure")
}
