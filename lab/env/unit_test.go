package env

import (
	"slices"
	"testing"
)

func TestWithoutFlag(t *testing.T) {
	got := WithoutFlag([]string{"--a", "1", "--fault", "k:2", "--b", "x"}, "--fault")
	if want := []string{"--a", "1", "--b", "x"}; !slices.Equal(got, want) {
		t.Fatalf("withoutFlag = %q, want %q", got, want)
	}
}

func TestInfoField(t *testing.T) {
	info := "# Memory\r\nused_memory:1048576\r\nused_memory_human:1.00M\r\n"
	for _, tc := range []struct {
		key, want string
		ok        bool
	}{
		{"used_memory", "1048576", true}, {"used_memory_human", "1.00M", true}, {"maxmemory", "", false},
	} {
		if got, ok := infoField(info, tc.key); got != tc.want || ok != tc.ok {
			t.Errorf("infoField(%q) = %q, %v; want %q, %v", tc.key, got, ok, tc.want, tc.ok)
		}
	}
}
