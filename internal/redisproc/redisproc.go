// Package redisproc runs private, throw-away Redis servers for tests and the
// lab. A server listens only on 127.0.0.1 on a free (or chosen) port, keeps
// its append-only file in a temp directory, and never touches the system
// server on port 6379.
//
// The server is started in its own process group with a parent-death signal
// of SIGKILL, so it does not outlive the Go process (internal/spawn).
package redisproc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxchat/outboxchat/internal/spawn"
)

const defaultStartTimeout = 30 * time.Second

// Options configures Start. The zero value (or a nil *Options) is valid.
type Options struct {
	// Dir is the Redis working directory (--dir): the AOF lives in
	// Dir/appendonlydir and the log in Dir/redis.log. An existing AOF is
	// loaded on start. "" (default) creates a new temp directory that Close
	// removes; a caller-provided Dir is never removed.
	Dir string
	// Port is the TCP port on 127.0.0.1. 0 (default) picks a free port;
	// Start then retries with another port if it loses a bind race.
	Port int
	// Logger receives lifecycle messages. nil (default) discards them.
	Logger *slog.Logger
	// Binary is the redis-server executable. "" (default) searches PATH,
	// then /usr/bin/redis-server.
	Binary string
	// StartTimeout bounds how long Start and Restart wait for PING to
	// succeed when ctx has no deadline. 0 means 30s.
	StartTimeout time.Duration
	// ReplicaOf, "host:port", starts the server as a replica of that
	// primary (--replicaof). "" (default): a primary.
	ReplicaOf string
	// Sentinel, when set, starts a Redis Sentinel (redis-server
	// <dir>/sentinel.conf --sentinel) instead of a data server: no AOF, it
	// monitors the given master. ReplicaOf is ignored then.
	Sentinel *SentinelOptions
	// ACLFile keeps the server's ACL users in Dir/users.acl (--aclfile,
	// created empty when missing): users made with ACL SETUSER and saved
	// with ACL SAVE survive restarts. Default false: no ACL file.
	ACLFile bool
	// TLSCertFile and TLSKeyFile (PEM), when both set, make the server
	// speak TLS only (--tls-port on Port, --port 0; clients need no
	// certificate): URL is then rediss://. Not for sentinels. Default "":
	// plain TCP.
	TLSCertFile, TLSKeyFile string
	// Cluster starts the server as a Redis Cluster node (--cluster-enabled
	// yes, its nodes.conf in Dir) with no slots and no peers: StartCluster
	// joins such nodes. Its cluster bus listens on 127.0.0.1 on another
	// free port below the ephemeral range (spawn.FreeStablePort), so that
	// a restart after a crash finds it free (--cluster-port;
	// Server.BusPort). A replica fails over however long it was cut off
	// from its master (--cluster-replica-validity-factor 0): the lab holds
	// replicas back on purpose; and a master sends a replica its data at
	// once (--repl-diskless-sync-delay 0). Not for sentinels. Default false.
	Cluster bool
	// ClusterNodeTimeout is cluster-node-timeout: how long a node may not
	// answer before the others count it as failing. Default 1 s.
	ClusterNodeTimeout time.Duration
	// ClusterReplicas is the number of replicas StartCluster gives each
	// master (CLUSTER REPLICATE); Start ignores it. Default 0: masters
	// only.
	ClusterReplicas int
}

// SentinelOptions configures a sentinel started by Start.
type SentinelOptions struct {
	// MasterName is the name the sentinel knows the primary by. Required.
	MasterName string
	// MasterAddr is the primary's "host:port". Required.
	MasterAddr string
	// Quorum is the number of sentinels that must agree the primary is
	// down. Default 2.
	Quorum int
	// DownAfter is down-after-milliseconds: how long the primary may not
	// answer before it is considered down. Default 1 s.
	DownAfter time.Duration
	// FailoverTimeout is failover-timeout. Default 5 s.
	FailoverTimeout time.Duration
}

// Server is a running (or stopped) private Redis server. All methods are safe
// for concurrent use; lifecycle methods (Stop, Kill, Restart, Close) are
// serialized.
type Server struct {
	replicaOf    string
	sentinel     *SentinelOptions
	port         int
	dir          string
	logPath      string
	binary       string
	startTimeout time.Duration
	log          *slog.Logger
	aclFile      bool
	tlsCert      string
	tlsKey       string
	cluster      bool
	nodeTimeout  time.Duration
	busPort      int

	life spawn.Server // the process; SIGTERM stops it
}

// program is redis-server on PATH, else /usr/bin/redis-server.
var program = spawn.Program{Owner: "redisproc", Name: "redis-server", Fallback: "/usr/bin/redis-server"}

// Available reports why Start with default Options cannot run on this
// machine: nil when a redis-server executable is found on PATH or at
// /usr/bin/redis-server. It starts nothing and is safe for concurrent use.
func Available() error { return program.Available() }

// Start runs redis-server on 127.0.0.1 with appendonly yes, appendfsync
// everysec, no RDB snapshots and maxmemory-policy noeviction, and waits until
// it answers PING. ctx bounds the whole start; on error everything started
// is torn down and a temp dir is removed. The error includes the tail of the
// server log when redis exits early.
func Start(ctx context.Context, opts *Options) (*Server, error) {
	if opts == nil {
		opts = &Options{}
	}
	set := program.WithDefaults(spawn.Settings{Logger: opts.Logger, StartTimeout: opts.StartTimeout, Binary: opts.Binary}, defaultStartTimeout)
	s := &Server{log: set.Logger, binary: set.Binary, startTimeout: set.StartTimeout, replicaOf: opts.ReplicaOf, sentinel: opts.Sentinel, aclFile: opts.ACLFile}
	if opts.TLSCertFile != "" && opts.TLSKeyFile != "" && opts.Sentinel == nil {
		s.tlsCert, s.tlsKey = opts.TLSCertFile, opts.TLSKeyFile
	}
	if so := s.sentinel; so != nil {
		if so.MasterName == "" || so.MasterAddr == "" {
			return nil, errors.New("redisproc: a sentinel needs MasterName and MasterAddr")
		}
		c := *so
		if c.Quorum <= 0 {
			c.Quorum = 2
		}
		if c.DownAfter <= 0 {
			c.DownAfter = time.Second
		}
		if c.FailoverTimeout <= 0 {
			c.FailoverTimeout = 5 * time.Second
		}
		s.sentinel = &c
	}
	s.life = spawn.Server{Name: "redisproc", Log: s.log, Launch: s.launch, StopSignal: syscall.SIGTERM}
	var err error
	if s.dir, s.life.Dir, err = spawn.Dir("redisproc", opts.Dir, s.log); err != nil {
		return nil, err
	}
	s.logPath = filepath.Join(s.dir, "redis.log")
	if s.aclFile {
		f, err := os.OpenFile(filepath.Join(s.dir, "users.acl"), os.O_CREATE|os.O_WRONLY, 0o600)
		if err == nil {
			err = f.Close()
		}
		if err != nil {
			_ = s.Close()
			return nil, fmt.Errorf("redisproc: acl file: %w", err)
		}
	}
	if opts.Cluster && opts.Sentinel == nil {
		s.cluster, s.nodeTimeout = true, opts.ClusterNodeTimeout
		if s.nodeTimeout <= 0 {
			s.nodeTimeout = time.Second
		}
	}
	if _, err := spawn.OnFreePort(ctx, opts.Port, "redisproc", s.log, func(port int) error {
		s.port, s.life.Port = port, port
		if s.cluster {
			// A bus port lost to a bind race fails the start with
			// ErrBind too, and the retry picks both ports again.
			bus, err := spawn.FreeStablePort()
			if err != nil {
				return fmt.Errorf("redisproc: %w", err)
			}
			s.busPort = bus
		}
		return s.life.Start(ctx)
	}); err != nil {
		_ = s.Close()
		return nil, err
	}
	s.log.Info("redisproc: started", "port", s.port, "dir", s.dir)
	return s, nil
}

// launch starts redis-server and waits until it answers PING (for
// spawn.Server, with its lock held).
func (s *Server) launch(ctx context.Context) (*spawn.Proc, error) {
	var logOff int64
	if st, err := os.Stat(s.logPath); err == nil {
		logOff = st.Size()
	}
	args := []string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--appendonly", "yes",
		"--appendfsync", "everysec",
		"--save", "",
		"--maxmemory-policy", "noeviction",
		"--daemonize", "no",
		"--logfile", s.logPath,
	}
	if s.cluster {
		args = append(args, "--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(s.busPort),
			"--cluster-node-timeout", strconv.FormatInt(s.nodeTimeout.Milliseconds(), 10),
			"--cluster-replica-validity-factor", "0",
			"--repl-diskless-sync-delay", "0")
	}
	if s.tlsCert != "" {
		args[1] = "0"
		args = append(args, "--tls-port", strconv.Itoa(s.port),
			"--tls-cert-file", s.tlsCert, "--tls-key-file", s.tlsKey, "--tls-auth-clients", "no")
	}
	if s.replicaOf != "" {
		host, port, err := net.SplitHostPort(s.replicaOf)
		if err != nil {
			return nil, fmt.Errorf("redisproc: ReplicaOf %q: %w", s.replicaOf, err)
		}
		args = append(args, "--replicaof", host, port)
	}
	if so := s.sentinel; so != nil {
		// A sentinel rewrites its config file: it must exist and be
		// writable.
		conf := filepath.Join(s.dir, "sentinel.conf")
		if _, err := os.Stat(conf); err != nil {
			if err := os.WriteFile(conf, nil, 0o644); err != nil {
				return nil, fmt.Errorf("redisproc: sentinel config: %w", err)
			}
		}
		host, port, err := net.SplitHostPort(so.MasterAddr)
		if err != nil {
			return nil, fmt.Errorf("redisproc: sentinel MasterAddr %q: %w", so.MasterAddr, err)
		}
		args = []string{conf, "--sentinel",
			"--port", strconv.Itoa(s.port),
			"--bind", "127.0.0.1",
			"--dir", s.dir,
			"--daemonize", "no",
			"--logfile", s.logPath,
			"--sentinel", "monitor", so.MasterName, host, port, strconv.Itoa(so.Quorum),
			"--sentinel", "down-after-milliseconds", so.MasterName, strconv.FormatInt(so.DownAfter.Milliseconds(), 10),
			"--sentinel", "failover-timeout", so.MasterName, strconv.FormatInt(so.FailoverTimeout.Milliseconds(), 10),
		}
	}
	cmd := exec.Command(s.binary, args...)
	if s.aclFile && s.sentinel == nil {
		cmd.Args = append(cmd.Args, "--aclfile", filepath.Join(s.dir, "users.acl"))
	}
	cmd.Dir = s.dir
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	if err := spawn.Start(cmd); err != nil {
		return nil, fmt.Errorf("redisproc: start redis-server: %w", err)
	}
	r := spawn.Watch(cmd)
	// While the AOF is loading Redis answers LOADING, which counts as not
	// ready.
	err := r.WaitReady(ctx, s.startTimeout, 10*time.Millisecond, func(ctx context.Context) error { return s.ping(ctx, r) })
	if err != nil {
		logTail := spawn.TailSince(s.logPath, logOff)
		if strings.Contains(logTail, "Address already in use") {
			err = fmt.Errorf("%w %d: %v", spawn.ErrBind, s.port, err)
		}
		return r, fmt.Errorf("redisproc: redis on port %d not ready: %w; log: %s", s.port, err, logTail)
	}
	return r, nil
}

// ping sends one PING over a fresh connection and checks, via INFO, that the
// answering server is our process (another server could own the port).
func (s *Server) ping(ctx context.Context, r *spawn.Proc) error {
	// A plain TCP probe first keeps go-redis from logging dial failures
	// while the server is still starting.
	d := net.Dialer{Timeout: time.Second}
	nc, err := d.DialContext(ctx, "tcp", s.Addr())
	if err != nil {
		return err
	}
	_ = nc.Close()
	opts := &redis.Options{
		Addr:            s.Addr(),
		DialTimeout:     time.Second,
		ReadTimeout:     time.Second,
		WriteTimeout:    time.Second,
		MaxRetries:      -1,
		PoolSize:        1,
		DisableIdentity: true,
		Protocol:        2,
	}
	if s.tlsCert != "" {
		// Readiness only: the INFO check below tells our server apart.
		opts.TLSConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec
	}
	c := redis.NewClient(opts)
	defer c.Close()
	if err := c.Ping(ctx).Err(); err != nil {
		return err
	}
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return err
	}
	want := "process_id:" + strconv.Itoa(r.Cmd.Process.Pid)
	if !strings.Contains(info, want+"\r\n") && !strings.Contains(info, want+"\n") {
		return fmt.Errorf("port %d is served by another redis", s.port)
	}
	return nil
}

// URL returns the server URL for database 0, "redis://127.0.0.1:PORT/0"
// ("rediss://…" with TLS), suitable for redis.ParseURL.
func (s *Server) URL() string {
	if s.tlsCert != "" {
		return fmt.Sprintf("rediss://%s/0", s.Addr())
	}
	return fmt.Sprintf("redis://%s/0", s.Addr())
}

// Addr returns "127.0.0.1:PORT".
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Port returns the TCP port on 127.0.0.1. It does not change across Restart.
func (s *Server) Port() int { return s.port }

// BusPort returns the cluster bus port on 127.0.0.1 (Options.Cluster), 0
// for a server that is not a cluster node. It does not change across
// Restart.
func (s *Server) BusPort() int { return s.busPort }

// Dir returns the Redis working directory (AOF and redis.log).
func (s *Server) Dir() string { return s.dir }

// LogPath returns the path of the server log file.
func (s *Server) LogPath() string { return s.logPath }

// Running reports whether the redis-server process is currently alive.
func (s *Server) Running() bool { return s.life.Running() }

// Stop shuts the server down gracefully: SIGTERM makes Redis fsync and close
// the AOF (like SHUTDOWN), then Stop waits for the process to exit. If ctx
// ends first the process is SIGKILLed and ctx's error returned. Stopping a
// stopped server is a no-op.
func (s *Server) Stop(ctx context.Context) error { return s.life.Stop(ctx, syscall.SIGTERM) }

// Kill simulates a crash: SIGKILL to the server's process group, then waits
// until it is reaped. Writes not yet fsynced to the AOF (up to ~1s with
// appendfsync everysec) may be lost only if the OS also crashes; data
// already written to the AOF file survives. Killing a stopped server is a
// no-op. It returns an error only if processes survive for more than 10s.
func (s *Server) Kill() error { return s.life.Kill() }

// Pause freezes the server with SIGSTOP: connections stay open, commands
// hang until Resume (what a stalled Redis looks like to its clients). It
// returns an error if the server is not running.
func (s *Server) Pause() error { return s.life.Signal(syscall.SIGSTOP) }

// Resume undoes Pause with SIGCONT. It returns an error if the server is
// not running.
func (s *Server) Resume() error { return s.life.Signal(syscall.SIGCONT) }

// Start starts a stopped or killed server again on the same port and
// directory (its AOF), and waits until it answers PING.
func (s *Server) Start(ctx context.Context) error { return s.life.Start(ctx) }

// Restart starts the server again on the same port and directory, so the AOF
// is reloaded, and waits until it answers PING. A running server is stopped
// first. Restart after Close fails.
func (s *Server) Restart(ctx context.Context) error { return s.life.Restart(ctx) }

// Close stops the server if running (SIGTERM, SIGKILL after 10s) and removes
// the directory if Start created it. It is idempotent and safe to call
// concurrently; later calls return nil.
func (s *Server) Close() error { return s.life.Close(10 * time.Second) }
