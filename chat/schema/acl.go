package schema

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/outboxchat/outboxchat/chat"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/internal/redisglob"
	"github.com/outboxchat/outboxchat/redisq"
)

// RedisACL returns the arguments of the ACL SETUSER command that makes
// user the least-privilege Redis user of service under key prefix prefix
// (the services' --redis-prefix, default "outboxchat:"): it may add to its
// outbound queue and consume its inbound one, nothing else
// (redisq.ACLRules; in particular it cannot add to the stream it reads, so
// it cannot forge messages to itself). The password is stored as its
// SHA-256 ("#<hex>"), so the command can be printed or logged. The rules
// start with "reset": applying them again replaces the user's rights.
func RedisACL(service, prefix, user, password string) ([]string, error) {
	return RedisACLPartitions(service, prefix, user, password, 1)
}

// RedisACLPartitions is RedisACL for a deployment of partitions partitions
// per direction (serve --partitions): the rules of each partition's
// outbound and inbound queues (chat.PartitionQueue), each partition's keys
// in a selector of its own (one cluster slot per partition). Partitions 1
// gives RedisACL's rules. Errors: RedisACL's, partitions out of range.
func RedisACLPartitions(service, prefix, user, password string, partitions int) ([]string, error) {
	if err := chat.CheckService(service); err != nil {
		return nil, err
	}
	if err := chat.CheckPartitions(partitions); err != nil {
		return nil, err
	}
	if user == "" || password == "" {
		return nil, fmt.Errorf("redis acl: a user name and a password are required")
	}
	sum := sha256.Sum256([]byte(password))
	args := []string{"ACL", "SETUSER", user, "reset", "#" + hex.EncodeToString(sum[:])}
	args = append(args, redisq.ACLRules(prefix, chat.QueueName(service), chat.QueueName(chat.Peer(service)))...)
	for p := 1; p < partitions; p++ {
		// ACLRules starts with the user's reset of keys and commands;
		// only its selectors are added for the other partitions.
		for _, r := range redisq.ACLRules(prefix, chat.PartitionQueue(service, p), chat.PartitionQueue(chat.Peer(service), p)) {
			if strings.HasPrefix(r, "(") {
				args = append(args, r)
			}
		}
	}
	// The seq fence's high-water marks (chat/store.Fence): its script
	// reads and raises them, the fence scans them after a failover.
	args = append(args, "(~"+redisglob.Escape(SeqHighWaterKey(prefix, service))+" +eval +evalsha +hget +hset +hscan)")
	// The live channel of typing and presence (package chat/live): publish
	// and subscribe on it alone.
	return append(args, "&"+redisglob.Escape(prefix+"live"), "+publish", "+subscribe", "+unsubscribe"), nil
}

// SeqHighWaterKey is the Redis hash of service's seq high-water marks
// under key prefix prefix: field chat id, value the highest seq of that
// chat the service's relay has published (chat/store.Fence).
func SeqHighWaterKey(prefix, service string) string {
	return prefix + "seq-hwm:" + service
}

// RedisACLLine formats RedisACL's arguments as one redis-cli line (rules
// holding spaces are quoted).
func RedisACLLine(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if strings.ContainsAny(a, " \"") {
			a = `"` + strings.ReplaceAll(a, `"`, `\"`) + `"`
		}
		out[i] = a
	}
	return strings.Join(out, " ")
}

// ApplyRedisACL runs args (RedisACL's) on rdb, an administrator's
// connection, then ACL SAVE when the server has an ACL file (so the user
// survives a restart; without one the error "no ACL file" is ignored and
// the user lives until the server stops). Users are per node in a Redis
// Cluster: on a *redis.ClusterClient it runs on every master and replica
// the client knows (ForEachShard) and returns the first error. Safe for
// concurrent use.
func ApplyRedisACL(ctx context.Context, rdb redis.UniversalClient, args []string) error {
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		return cc.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error {
			if err := ApplyRedisACL(ctx, n, args); err != nil {
				return fmt.Errorf("node %s: %w", n.Options().Addr, err)
			}
			return nil
		})
	}
	cmd := make([]any, len(args))
	for i, a := range args {
		cmd[i] = a
	}
	if err := rdb.Do(ctx, cmd...).Err(); err != nil {
		return fmt.Errorf("redis acl %s: %w", args[2], err)
	}
	if err := rdb.Do(ctx, "ACL", "SAVE").Err(); err != nil && !strings.Contains(err.Error(), "ACL file") {
		return fmt.Errorf("redis acl save: %w", err)
	}
	return nil
}
