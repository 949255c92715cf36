package schema

import "testing"

func TestSetsPoolMaxConns(t *testing.T) {
	for _, c := range []struct {
		url  string
		want bool
	}{
		{"postgres://u@h/db", false},
		{"postgres://u@h/db?pool_max_conns=2", true},
		{"postgresql://u@h/db?sslmode=disable&pool_max_conns=40", true},
		{"postgres://u@h/db?xpool_max_conns=2", false},
		{"host=h user=u pool_max_conns=3", true},
		{"host=h user=u pool_max_conns = 3", true},
		{"host=h user=u application_name=pool_max_conns", false},
	} {
		if got := setsPoolMaxConns(c.url); got != c.want {
			t.Errorf("setsPoolMaxConns(%q) = %v, want %v", c.url, got, c.want)
		}
	}
	for _, bad := range []string{"postgres://u@h/db?pool_max_conns=0", "postgres://u@h/db?pool_max_conns=x"} {
		if _, err := PoolConfig(bad); err == nil {
			t.Errorf("PoolConfig(%q) accepted", bad)
		}
	}
	if pc, err := PoolConfig("postgres://u@h/db?pool_max_conns=2"); err != nil || pc.MaxConns != 2 {
		t.Errorf("poolConfig with pool_max_conns=2: %v, %v", pc, err)
	}
	if pc, err := PoolConfig("postgres://u@h/db"); err != nil || pc.MaxConns != DefaultPoolMaxConns {
		t.Errorf("poolConfig without pool_max_conns: %v, %v", pc, err)
	}
}
