// Package schema owns each service's Postgres schema and its connections:
// the embedded, numbered migrations (Bootstrap creates the role and schema
// named after the service, Migrate applies what is missing, under an
// advisory lock), the pool settings (PoolConfig), the check that refuses a
// transaction-mode pooler the pool cannot work through (CheckPooler), the
// LISTEN connection's settings (ListenConnConfig), the advisory lock keys
// of a chat's sends and of its inbox (ChatLockSQL, InboxLockSQL), and the
// Redis ACL user of a service (RedisACL). A shipped migration is never
// edited.
package schema
