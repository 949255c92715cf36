package schema

import (
	"slices"
	"strings"
	"testing"
)

// The ACL of a partitioned deployment adds, per further partition, the
// selectors of its outbound and inbound queues; one partition is
// RedisACL's.
func TestRedisACLPartitions(t *testing.T) {
	one, err := RedisACL("consumers", "p:", "u", "pw")
	if err != nil {
		t.Fatal(err)
	}
	same, err := RedisACLPartitions("consumers", "p:", "u", "pw", 1)
	if err != nil || !slices.Equal(one, same) {
		t.Fatalf("RedisACLPartitions(…, 1) = %v, %v; want RedisACL's %v", same, err, one)
	}
	three, err := RedisACLPartitions("consumers", "p:", "u", "pw", 3)
	if err != nil {
		t.Fatal(err)
	}
	line := strings.Join(three, " ")
	for _, k := range []string{"~p:q:{consumers-to-workers.p2}:stream", "~p:q:{workers-to-consumers.p2}:stream",
		"~p:q:{consumers-to-workers.p1}:dedupe*", "~p:q:{workers-to-consumers.p1}:dead"} {
		if !strings.Contains(line, k) {
			t.Errorf("ACL of 3 partitions lacks %s: %s", k, line)
		}
	}
	if strings.Count(line, "resetkeys") != 1 {
		t.Errorf("the partitions' rules must not reset the user again: %s", line)
	}
	if _, err := RedisACLPartitions("consumers", "p:", "u", "pw", 0); err == nil {
		t.Error("0 partitions accepted")
	}
}
