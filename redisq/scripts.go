package redisq

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// The Lua scripts, one per file under scripts/, each with a header stating
// KEYS, ARGV and return values. redis.NewScript computes the SHA1 locally;
// callers use EVALSHA and fall back (EVAL, or SCRIPT LOAD and retry once)
// when the server answers NOSCRIPT, e.g. after a restart emptied its cache.
var (
	//go:embed scripts/add.lua
	addSource string
	//go:embed scripts/trim.lua
	trimSource string
	//go:embed scripts/replay.lua
	replaySource string
	//go:embed scripts/delete_idle.lua
	deleteIdleSource string

	addScript        = redis.NewScript(addSource)
	trimScript       = redis.NewScript(trimSource)
	replayScript     = redis.NewScript(replaySource)
	deleteIdleScript = redis.NewScript(deleteIdleSource)
)
