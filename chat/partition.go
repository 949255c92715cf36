package chat

import (
	"fmt"
	"slices"
	"strconv"
)

// Partitions split each direction into N lanes (Serve's --partitions N,
// the same N on both services). Each partition has its own outbox table,
// relay, Redis stream and consumer; a chat belongs to exactly one
// partition, so its events (messages, edits, deletes, read receipts, seq
// floors) take one lane and keep their order. Delivery receipts are the
// exception: cumulative per chat and applied in any order, those of the
// batches that share an inbox transaction go back as one receipt, in the
// first batch's lane. N = 1 is the single lane: partition 0 uses the names of a
// deployment without partitions ("<service>.outbox", QueueName(service),
// OutboxChannel(service)).

// DefaultPartitions is the number of partitions per direction unless
// configured otherwise: one lane, as before partitions existed.
const DefaultPartitions = 1

// MaxPartitions bounds the number of partitions per direction: each one is
// an outbox table, a relay loop, a stream and a blocking consumer read per
// process.
const MaxPartitions = 256

// Partition returns the partition of chatID among n partitions:
// chatID mod n (chat ids are positive). It is stable (it depends on the
// chat id and n only, so every process of both services agrees), cheap,
// and an operator can compute it by hand or in SQL (chat_id % n). Chat ids
// handed out in sequence spread evenly; ids that are all multiples of a
// common factor of n would not (a hash would avoid that at the price of
// the by-hand check). n ≤ 1 gives 0.
func Partition(chatID int64, n int) int {
	if n <= 1 {
		return 0
	}
	p := chatID % int64(n)
	if p < 0 { // not a valid chat id; keep it in range all the same
		p += int64(n)
	}
	return int(p)
}

// CheckPartitions returns nil for 1 ≤ n ≤ MaxPartitions and an error
// otherwise.
func CheckPartitions(n int) error {
	if n < 1 || n > MaxPartitions {
		return fmt.Errorf("chat: partitions %d out of range (want 1 to %d)", n, MaxPartitions)
	}
	return nil
}

// PartitionQueue is the Redis queue of partition p of the direction from
// service from: QueueName(from) for p = 0, "<QueueName(from)>.p<p>"
// otherwise. redisq puts every key of a queue under the hash tag
// "{<queue>}", so each partition's keys share one Redis Cluster slot and
// different partitions hash to different slots (spread over the masters).
func PartitionQueue(from string, p int) string {
	if p == 0 {
		return QueueName(from)
	}
	return QueueName(from) + ".p" + strconv.Itoa(p)
}

// OutboxTable is the outbox table of partition p of service:
// "<service>.outbox" for p = 0, "<service>.outbox_p<p>" otherwise
// (schema.EnsurePartitions creates those like the first).
func OutboxTable(service string, p int) string {
	if p == 0 {
		return service + ".outbox"
	}
	return service + ".outbox_p" + strconv.Itoa(p)
}

// PartitionOutboxChannel is the NOTIFY channel of partition p's outbox of
// service: OutboxChannel(service) for p = 0, "<service>_outbox_p<p>"
// otherwise. A relay listens on its partition's channel only.
func PartitionOutboxChannel(service string, p int) string {
	if p == 0 {
		return OutboxChannel(service)
	}
	return OutboxChannel(service) + "_p" + strconv.Itoa(p)
}

// SplitByPartition splits items by the partition of their chat among n
// partitions: out[p] holds, in their order, the items whose chat (chatOf of
// the item's index) is in partition p; len(out) is n (at least 1).
func SplitByPartition[T any](n int, items []T, chatOf func(i int) int64) [][]T {
	out := make([][]T, max(n, 1))
	for i, it := range items {
		p := Partition(chatOf(i), n)
		out[p] = append(out[p], it)
	}
	return out
}

// PartitionsOf returns the partitions (among n) of ms's chats, each once,
// in the order of their first message.
func PartitionsOf(ms []Message, n int) []int {
	var parts []int
	for _, m := range ms {
		if p := Partition(m.ChatID, n); !slices.Contains(parts, p) {
			parts = append(parts, p)
		}
	}
	return parts
}
