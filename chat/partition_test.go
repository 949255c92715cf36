package chat

import (
	"slices"
	"testing"
)

func TestPartition(t *testing.T) {
	for _, c := range []struct {
		chat int64
		n    int
		want int
	}{{1, 1, 0}, {7, 0, 0}, {8, 4, 0}, {9, 4, 1}, {11, 4, 3}, {1<<63 - 1, 16, 15}, {-5, 4, 3}} {
		if got := Partition(c.chat, c.n); got != c.want {
			t.Errorf("Partition(%d, %d) = %d, want %d", c.chat, c.n, got, c.want)
		}
	}
	for n := 1; n <= 9; n++ {
		for chat := int64(1); chat < 100; chat++ {
			if p := Partition(chat, n); p < 0 || p >= n || p != Partition(chat, n) {
				t.Fatalf("Partition(%d, %d) = %d", chat, n, p)
			}
		}
	}
}

// Partition 0 keeps the names of a deployment without partitions; the
// others' names differ per partition (each queue its own hash tag).
func TestPartitionNames(t *testing.T) {
	if PartitionQueue(Consumers, 0) != QueueName(Consumers) || OutboxTable(Workers, 0) != "workers.outbox" ||
		PartitionOutboxChannel(Consumers, 0) != OutboxChannel(Consumers) {
		t.Fatal("partition 0 must keep the names without partitions")
	}
	if got := PartitionQueue(Consumers, 3); got != "consumers-to-workers.p3" {
		t.Errorf("PartitionQueue(consumers, 3) = %q", got)
	}
	if got := OutboxTable(Consumers, 3); got != "consumers.outbox_p3" {
		t.Errorf("OutboxTable(consumers, 3) = %q", got)
	}
	if got := PartitionOutboxChannel(Workers, 2); got != "workers_outbox_p2" {
		t.Errorf("PartitionOutboxChannel(workers, 2) = %q", got)
	}
	for _, n := range []int{0, MaxPartitions + 1} {
		if CheckPartitions(n) == nil {
			t.Errorf("CheckPartitions(%d) = nil", n)
		}
	}
}

// TestSplitByPartition: items go to their chat's partition in their order;
// PartitionsOf names each partition of a batch once, first seen first.
func TestSplitByPartition(t *testing.T) {
	chats := []int64{5, 2, 9, 6, 1, 13}
	got := SplitByPartition(4, chats, func(i int) int64 { return chats[i] })
	want := [][]int64{nil, {5, 9, 1, 13}, {2, 6}, nil}
	if len(got) != len(want) {
		t.Fatalf("SplitByPartition = %v, want %v", got, want)
	}
	for p := range want {
		if !slices.Equal(got[p], want[p]) {
			t.Fatalf("SplitByPartition = %v, want %v", got, want)
		}
	}
	if one := SplitByPartition(1, chats, func(i int) int64 { return chats[i] }); len(one) != 1 || !slices.Equal(one[0], chats) {
		t.Fatalf("one partition: %v", one)
	}
	ms := []Message{{ChatID: 6}, {ChatID: 5}, {ChatID: 2}, {ChatID: 9}}
	if got := PartitionsOf(ms, 4); !slices.Equal(got, []int{2, 1}) {
		t.Fatalf("PartitionsOf = %v, want [2 1]", got)
	}
}
