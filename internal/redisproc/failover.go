package redisproc

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Role is what a cluster node is now, as it says itself (the "myself" line
// of its CLUSTER NODES).
type Role struct {
	// ID is the node's cluster node id.
	ID string
	// Master is true for a master, false for a replica.
	Master bool
	// MasterID is a replica's master's node id ("" for a master).
	MasterID string
}

// Role returns what node s of c is now. It fails when s does not answer
// (stopped, or paused until the client's 3 s read timeout).
func (c *Cluster) Role(ctx context.Context, s *Server) (Role, error) {
	var r Role
	err := withClient(ctx, s, func(rc *redis.Client) error {
		out, err := rc.ClusterNodes(ctx).Result()
		if err != nil {
			return err
		}
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) < 4 || !strings.Contains(","+f[2]+",", ",myself,") {
				continue
			}
			r = Role{ID: f[0], Master: strings.Contains(f[2], "master")}
			if !r.Master && f[3] != "-" {
				r.MasterID = f[3]
			}
			return nil
		}
		return errors.New("no myself line in CLUSTER NODES")
	})
	if err != nil {
		return Role{}, fmt.Errorf("redisproc: role of %s: %w", s.Addr(), err)
	}
	return r, nil
}

// Masters returns the running nodes that are masters now, in Nodes order.
func (c *Cluster) Masters(ctx context.Context) ([]*Server, error) {
	var out []*Server
	for _, s := range c.Nodes {
		if !s.Running() {
			continue
		}
		r, err := c.Role(ctx, s)
		if err != nil {
			return nil, err
		}
		if r.Master {
			out = append(out, s)
		}
	}
	return out, nil
}

// ReplicasOf returns the running nodes that replicate master now, in
// Nodes order.
func (c *Cluster) ReplicasOf(ctx context.Context, master *Server) ([]*Server, error) {
	id := c.id(master)
	var out []*Server
	for _, s := range c.Nodes {
		if !s.Running() || s == master {
			continue
		}
		r, err := c.Role(ctx, s)
		if err != nil {
			return nil, err
		}
		if !r.Master && r.MasterID == id {
			out = append(out, s)
		}
	}
	return out, nil
}

// id returns node s's cluster node id ("" for a server not of c).
func (c *Cluster) id(s *Server) string {
	for i, n := range c.Nodes {
		if n == s {
			return c.ids[i]
		}
	}
	return ""
}

// WaitSynced waits until every running replica's link to its master is up
// (INFO replication: master_link_status:up), polling every 10 ms; ctx's
// error when it ends first.
func (c *Cluster) WaitSynced(ctx context.Context) error {
	err := poll(ctx, func() (string, bool) {
		for _, s := range c.Nodes {
			if !s.Running() {
				continue
			}
			var info string
			err := withClient(ctx, s, func(rc *redis.Client) (err error) {
				info, err = rc.Info(ctx, "replication").Result()
				return err
			})
			if err != nil {
				return s.Addr() + ": " + err.Error(), false
			}
			if strings.Contains(info, "role:slave") && !strings.Contains(info, "master_link_status:up") {
				return s.Addr() + ": " + info, false
			}
		}
		return "", true
	})
	if err != nil {
		return fmt.Errorf("redisproc: replicas not in sync: %w", err)
	}
	return nil
}

// Failover is one master's failover as a crash brings it about, step by
// step: StartFailover picks the master's replica; HoldBack (optional)
// freezes the replica and cuts its replication link, so that what the
// master takes from then on never reaches it (replication is
// asynchronous: a crash loses that much), or SyncReplica (optional) makes
// sure the replica has everything; KillMaster kills the master
// (SIGKILL) and waits until the cluster has promoted the replica; Rejoin
// starts the old master again, which comes back as the new master's
// replica. Its methods are not meant for concurrent use.
type Failover struct {
	c *Cluster
	// Master is the master that fails, Replica the replica promoted in
	// its place.
	Master, Replica *Server
	// Slot is a slot Master served: the promoted replica serves it after.
	Slot int
	held bool
}

// StartFailover prepares master's failover: it picks master's first
// running replica and one of its slots. It fails when master is not a
// running master of c or has no running replica.
func (c *Cluster) StartFailover(ctx context.Context, master *Server) (*Failover, error) {
	if c.id(master) == "" || !master.Running() {
		return nil, fmt.Errorf("redisproc: failover of %s: not a running node of this cluster", master.Addr())
	}
	reps, err := c.ReplicasOf(ctx, master)
	if err != nil {
		return nil, err
	}
	if len(reps) == 0 {
		return nil, fmt.Errorf("redisproc: failover of %s: no running replica", master.Addr())
	}
	f := &Failover{c: c, Master: master, Replica: reps[0], Slot: -1}
	err = withClient(ctx, master, func(rc *redis.Client) error {
		shards, err := rc.ClusterShards(ctx).Result()
		if err != nil {
			return err
		}
		for _, sh := range shards {
			for _, n := range sh.Nodes {
				if n.ID == c.id(master) && n.Role == "master" && len(sh.Slots) > 0 {
					f.Slot = int(sh.Slots[0].Start)
				}
			}
		}
		return nil
	})
	if err == nil && f.Slot < 0 {
		err = errors.New("it serves no slot")
	}
	if err != nil {
		return nil, fmt.Errorf("redisproc: failover of %s: %w", master.Addr(), err)
	}
	return f, nil
}

// HoldBack freezes the replica (SIGSTOP) and cuts its replication link
// (CLIENT KILL TYPE replica on the master): the master's writes from now
// on reach it never, since KillMaster kills the master before it resumes
// the replica. Release undoes it without a failover.
func (f *Failover) HoldBack(ctx context.Context) error {
	if err := f.Replica.Pause(); err != nil {
		return fmt.Errorf("redisproc: hold back %s: %w", f.Replica.Addr(), err)
	}
	f.held = true
	err := withClient(ctx, f.Master, func(rc *redis.Client) error {
		return rc.ClientKillByFilter(ctx, "TYPE", "replica").Err()
	})
	if err != nil {
		return errors.Join(fmt.Errorf("redisproc: cut the replication link of %s: %w", f.Master.Addr(), err), f.Release())
	}
	return nil
}

// Release resumes a replica held back (SIGCONT); a no-op otherwise.
func (f *Failover) Release() error {
	if !f.held {
		return nil
	}
	f.held = false
	return f.Replica.Resume()
}

// KillMaster kills the master (SIGKILL), resumes the replica if held back,
// and waits (WaitPromoted) until the replica is promoted.
func (f *Failover) KillMaster(ctx context.Context) error {
	if err := f.Master.Kill(); err != nil {
		return errors.Join(fmt.Errorf("redisproc: kill %s: %w", f.Master.Addr(), err), f.Release())
	}
	if err := f.Release(); err != nil {
		return err
	}
	return f.WaitPromoted(ctx)
}

// WaitPromoted waits until the replica says it is a master, every running
// node says it serves Slot, and every running node reports
// cluster_state:ok, polling every 10 ms; ctx's error when it ends first.
// With cluster-node-timeout T this takes about 2T to 3T after the kill:
// the masters agree the old master failed, then elect the replica.
func (f *Failover) WaitPromoted(ctx context.Context) error {
	err := poll(ctx, func() (string, bool) {
		r, err := f.c.Role(ctx, f.Replica)
		if err != nil {
			return err.Error(), false
		}
		if !r.Master {
			return f.Replica.Addr() + " is still a replica", false
		}
		for _, s := range f.c.Nodes {
			if !s.Running() {
				continue
			}
			var addr string
			err := withClient(ctx, s, func(rc *redis.Client) (err error) {
				addr, _, err = slotOwner(ctx, rc, f.Slot)
				return err
			})
			if err != nil {
				return s.Addr() + ": " + err.Error(), false
			}
			if addr != f.Replica.Addr() {
				return fmt.Sprintf("%s: slot %d on %s", s.Addr(), f.Slot, addr), false
			}
		}
		return f.c.stateIs(ctx, "ok")
	})
	if err != nil {
		return fmt.Errorf("redisproc: %s not promoted in place of %s: %w", f.Replica.Addr(), f.Master.Addr(), err)
	}
	return nil
}

// Rejoin restarts the killed master (same ports, its AOF and nodes.conf)
// and waits until it has turned into a replica of the promoted one with
// its link up (it drops whatever the promoted replica never had) and the
// cluster is ok.
func (f *Failover) Rejoin(ctx context.Context) error {
	if err := f.Master.Restart(ctx); err != nil {
		return err
	}
	want := f.c.id(f.Replica)
	err := poll(ctx, func() (string, bool) {
		r, err := f.c.Role(ctx, f.Master)
		if err != nil {
			return err.Error(), false
		}
		return fmt.Sprintf("role %+v", r), !r.Master && r.MasterID == want
	})
	if err == nil {
		err = f.c.WaitState(ctx, "ok")
	}
	if err == nil {
		err = f.c.WaitSynced(ctx)
	}
	if err != nil {
		return fmt.Errorf("redisproc: %s rejoining as a replica of %s: %w", f.Master.Addr(), f.Replica.Addr(), err)
	}
	return nil
}

// SyncReplica makes the coming KillMaster lose nothing: it pauses the
// master's writes (CLIENT PAUSE WRITE, at most pause; clients wait, they
// get no error) and waits until the replica has acknowledged the master's
// whole replication stream (INFO replication on the master: the replica's
// offset equals master_repl_offset), polling every 10 ms. A crash of a
// master whose replica is in sync, the failover without a loss. On error
// the writes are unpaused.
func (f *Failover) SyncReplica(ctx context.Context, pause time.Duration) error {
	port := "port=" + strconv.Itoa(f.Replica.Port()) + ","
	err := withClient(ctx, f.Master, func(rc *redis.Client) error {
		if err := rc.Do(ctx, "CLIENT", "PAUSE", pause.Milliseconds(), "WRITE").Err(); err != nil {
			return err
		}
		err := poll(ctx, func() (string, bool) {
			info, err := rc.Info(ctx, "replication").Result()
			if err != nil {
				return err.Error(), false
			}
			var master, replica string
			for _, line := range strings.Split(info, "\n") {
				line = strings.TrimSpace(line)
				if v, ok := strings.CutPrefix(line, "master_repl_offset:"); ok {
					master = v
				}
				if strings.HasPrefix(line, "slave") && strings.Contains(line, port) {
					for _, kv := range strings.Split(line, ",") {
						if v, ok := strings.CutPrefix(kv, "offset="); ok {
							replica = v
						}
					}
				}
			}
			return info, master != "" && master == replica
		})
		if err != nil {
			_ = rc.Do(ctx, "CLIENT", "UNPAUSE").Err()
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("redisproc: sync %s with %s: %w", f.Replica.Addr(), f.Master.Addr(), err)
	}
	return nil
}
