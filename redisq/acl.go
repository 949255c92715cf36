package redisq

import "github.com/outboxchat/outboxchat/internal/redisglob"

// ACLRules returns the Redis ACL rules (the arguments of ACL SETUSER after
// the user name, without a password rule) that let one service do exactly
// what redisq needs and no more, under key prefix prefix:
//
//   - on its outbound queue out: add jobs (add.lua: XADD, the dedupe marks'
//     sorted set: ZADD, ZSCORE, ZREM, the re-add tokens' hash: HGET, HSET,
//     HSETNX, HDEL; SET, GET and DEL of the key-per-job dedupe keys of
//     earlier versions, for a rolling upgrade), nothing else;
//   - on its inbound queue in, as a consumer-group member: read, claim,
//     acknowledge and trim (XREADGROUP, XAUTOCLAIM, XACK, XPENDING, XINFO,
//     XRANGE, XTRIM, XGROUP CREATE, XINFO GROUPS and CONSUMERS, trim.lua), delete
//     its idle consumers (delete_idle.lua: XGROUP DELCONSUMER of a consumer with
//     nothing pending), keep its processes' presence in the presence set
//     (Keys.Presence: ZADD, ZREM, ZRANGE, ZRANGEBYSCORE, ZREMRANGEBYSCORE,
//     PTTL, PEXPIRE and scripts declaring it, TIME; for the application
//     that keeps it, such as chat/presence), delete the dedupe marks and re-add tokens of
//     trimmed entries and expired marks (ZRANGE, ZREM, HDEL), and XADD to the dead-letter stream (XTRIM to cap it,
//     XLEN for the gauges) — but never XADD
//     to the inbound stream itself, so a service cannot forge messages to
//     itself;
//   - no other key, and no FLUSHALL, CONFIG, KEYS or other administrative
//     command (INFO, PING, HELLO, SELECT, MULTI/EXEC, SCRIPT LOAD, TIME and
//     CLIENT INFO are allowed: they touch no key; so are CLUSTER SLOTS and
//     ASKING, which a Redis Cluster client needs, and WAIT, which
//     PublisherConfig.ReplicaAcks needs).
//
// Key rules are in Redis 7.0 selectors ("(…)"), one per group of keys, so a
// command allowed on one key is not thereby allowed on another. Commands
// run inside Lua scripts are checked against the same rules. The caller
// prefixes "reset" or a password rule as it needs.
func ACLRules(prefix, out, in string) []string {
	o, i := NewKeys(prefix, out), NewKeys(prefix, in)
	return []string{
		"on", "resetkeys", "resetchannels", "-@all",
		// Connection and transaction commands: no keys.
		"+ping", "+hello", "+select", "+info", "+multi", "+exec", "+discard", "+script|load", "+time", "+client|info",
		// An add's wait for its replicas (PublisherConfig.ReplicaAcks).
		"+wait",
		// A cluster client's topology, command table and ASK
		// redirections: no keys. Without COMMAND go-redis's cluster
		// client asks for the table again before every command, of up to
		// three random nodes: a round trip each, and a stalled node
		// (even a replica) stalls every command.
		"+cluster|slots", "+command", "+asking",
		// Outbound: add jobs only (a re-add reads its token back: HGET).
		// The dedupe keys by pattern, with SET, GET and DEL: a process of
		// an earlier version, with a key per job, keeps adding during a
		// rolling upgrade.
		"(" + redisglob.KeyRule(o.Stream) + " " + redisglob.KeyRule(o.dedupeAll) +
			" +evalsha +eval +xadd +zadd +zscore +zrem +hget +hset +hsetnx +hdel +set +get +del)",
		// Inbound stream: consume, never add. The presence set is in the
		// same selector because the prune script of earlier versions
		// declares both keys (a command must match one selector with all
		// its keys): their processes keep pruning during a rolling upgrade.
		"(" + redisglob.KeyRule(i.Stream) + " " + redisglob.KeyRule(i.Presence) + " +xreadgroup +xack +xautoclaim +xpending +xgroup|create +xinfo|groups +xinfo|consumers" +
			" +xgroup|delconsumer +xrange +xtrim +xlen +exists +evalsha +eval" +
			" +zadd +zrem +zrange +zrangebyscore +zremrangebyscore +pttl +pexpire)",
		// Inbound dedupe marks: deleted with trimmed entries (trim.lua,
		// which declares the stream and the marks' keys: its EVALSHA
		// must match one selector with all of them; the commands inside
		// are checked one by one against the selectors above).
		// (DEL and the pattern: the trim of a process of an earlier
		// version, as above.)
		"(" + redisglob.KeyRule(i.dedupeAll) + " +zrange +zrem +hdel +del)",
		"(" + redisglob.KeyRule(i.Stream) + " " + redisglob.KeyRule(i.dedupeAll) + " +evalsha +eval)",
		// Inbound dead letters: added, capped (DeadLetterMax) and counted
		// (the gauges); reading, replaying and dropping them is the
		// operator's (an admin user).
		"(" + redisglob.KeyRule(i.Dead) + " +xadd +xtrim +xlen)",
	}
}
