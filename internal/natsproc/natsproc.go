// Package natsproc runs private, throw-away NATS servers with JetStream for
// tests and the lab. A server listens only on 127.0.0.1 on a free (or
// chosen) port, keeps its JetStream store in a temp directory, and never
// touches a system server on port 4222.
//
// The server is started in its own process group with a parent-death signal
// of SIGKILL, so it does not outlive the Go process (internal/spawn). It
// imports no NATS client: readiness is read off the server's INFO line, so
// the root module's graph stays free of nats.go.
package natsproc

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
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

	"github.com/outboxchat/outboxchat/internal/spawn"
)

const defaultStartTimeout = 30 * time.Second

// Options configures Start. The zero value (or a nil *Options) is valid.
type Options struct {
	// Port is the client port; 0 picks a free one.
	Port int
	// Dir holds the JetStream store and the log; "" makes a temp dir that
	// Close removes.
	Dir string
	// Binary is the nats-server executable; "" finds nats-server on PATH,
	// else /usr/sbin/nats-server (the Debian package's).
	Binary string
	// StartTimeout bounds each launch's wait for the server to serve
	// (default 30 s).
	StartTimeout time.Duration
	// Logger receives start, stop and restart lines (default: discarded).
	Logger *slog.Logger
}

// Server is a running (or stopped) private NATS server with JetStream. All
// methods are safe for concurrent use; lifecycle methods (Stop, Kill,
// Restart, Close) are serialized.
type Server struct {
	port         int
	dir          string
	logPath      string
	binary       string
	name         string
	startTimeout time.Duration
	log          *slog.Logger
	// route is the server's place in a Cluster (StartCluster), nil alone.
	route *route

	life spawn.Server
}

// route is a cluster member's clustering settings.
type route struct {
	cluster   string // the cluster's name
	port, mon int    // cluster (route) port and monitoring port
	routes    []string
}

// program is nats-server on PATH, else /usr/sbin/nats-server.
var program = spawn.Program{Owner: "natsproc", Name: "nats-server", Fallback: "/usr/sbin/nats-server"}

// Available reports why Start with default Options cannot run on this
// machine: nil when a nats-server executable is found. It starts nothing.
func Available() error { return program.Available() }

// Start runs nats-server -js on 127.0.0.1 and waits until it answers a
// client connection with its INFO line (under the server name it was given,
// so another server on the port is not mistaken for it). ctx bounds the
// whole start; on error everything started is torn down and a temp dir is
// removed. The error includes the tail of the server log.
func Start(ctx context.Context, opts *Options) (*Server, error) {
	if opts == nil {
		opts = &Options{}
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	s, err := newServer(opts, "natsproc-"+hex.EncodeToString(rnd[:]))
	if err != nil {
		return nil, err
	}
	if _, err := spawn.OnFreePort(ctx, opts.Port, "natsproc", s.log, func(port int) error {
		s.port, s.life.Port = port, port
		return s.life.Start(ctx)
	}); err != nil {
		_ = s.Close()
		return nil, err
	}
	s.log.Info("natsproc: started", "port", s.port, "dir", s.dir)
	return s, nil
}

// newServer is a Server named name with opts's settings and dir (made
// here), not started.
func newServer(opts *Options, name string) (*Server, error) {
	set := program.WithDefaults(spawn.Settings{Logger: opts.Logger, StartTimeout: opts.StartTimeout, Binary: opts.Binary}, defaultStartTimeout)
	s := &Server{log: set.Logger, binary: set.Binary, startTimeout: set.StartTimeout, name: name}
	s.life = spawn.Server{Name: "natsproc", Log: s.log, Launch: s.launch, StopSignal: syscall.SIGTERM}
	var err error
	if s.dir, s.life.Dir, err = spawn.Dir("natsproc", opts.Dir, s.log); err != nil {
		return nil, err
	}
	s.logPath = filepath.Join(s.dir, "nats.log")
	return s, nil
}

// launch starts nats-server and waits until it serves (for spawn.Server,
// with its lock held).
func (s *Server) launch(ctx context.Context) (*spawn.Proc, error) {
	var logOff int64
	if st, err := os.Stat(s.logPath); err == nil {
		logOff = st.Size()
	}
	cmd := exec.Command(s.binary,
		"-a", "127.0.0.1",
		"-p", strconv.Itoa(s.port),
		"--server_name", s.name,
		"-js",
		"-sd", filepath.Join(s.dir, "jetstream"),
		"-l", s.logPath)
	if r := s.route; r != nil {
		cmd.Args = append(cmd.Args, "--cluster_name", r.cluster,
			"--cluster", "nats://127.0.0.1:"+strconv.Itoa(r.port), "--routes", strings.Join(r.routes, ","),
			"-m", strconv.Itoa(r.mon))
	}
	cmd.Dir = s.dir
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	if err := spawn.Start(cmd); err != nil {
		return nil, fmt.Errorf("natsproc: start nats-server: %w", err)
	}
	r := spawn.Watch(cmd)
	err := r.WaitReady(ctx, s.startTimeout, 10*time.Millisecond, s.ping)
	if err != nil {
		logTail := spawn.TailSince(s.logPath, logOff)
		if strings.Contains(logTail, "address already in use") {
			err = fmt.Errorf("%w %d: %v", spawn.ErrBind, s.port, err)
		}
		return r, fmt.Errorf("natsproc: nats on port %d not ready: %w; log: %s", s.port, err, logTail)
	}
	return r, nil
}

// ping connects, reads the server's INFO line and checks that it is ours
// and has JetStream on.
func (s *Server) ping(ctx context.Context) error {
	d := net.Dialer{Timeout: time.Second}
	c, err := d.DialContext(ctx, "tcp", s.Addr())
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	var info struct {
		Name      string `json:"server_name"`
		JetStream bool   `json:"jetstream"`
	}
	body, ok := strings.CutPrefix(strings.TrimSpace(line), "INFO ")
	if !ok || json.Unmarshal([]byte(body), &info) != nil {
		return fmt.Errorf("port %d: not a NATS INFO line: %.80q", s.port, line)
	}
	if info.Name != s.name {
		return fmt.Errorf("port %d is served by another nats-server (%s)", s.port, info.Name)
	}
	if !info.JetStream {
		return fmt.Errorf("port %d: JetStream not on yet", s.port)
	}
	return nil
}

// Name returns the server's name (its server_name, which JetStream's
// cluster info names a stream's leader by).
func (s *Server) Name() string { return s.name }

// URL returns "nats://127.0.0.1:PORT".
func (s *Server) URL() string { return "nats://" + s.Addr() }

// Addr returns "127.0.0.1:PORT".
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Port returns the client port.
func (s *Server) Port() int { return s.port }

// Dir returns the server's directory (the store is under jetstream/).
func (s *Server) Dir() string { return s.dir }

// LogPath returns the server's log file.
func (s *Server) LogPath() string { return s.logPath }

// Running reports whether the server's process is alive.
func (s *Server) Running() bool { return s.life.Running() }

// PID is the running nats-server's pid, 0 when it is not running (for the
// lab's CPU figures).
func (s *Server) PID() int { return s.life.PID() }

// Stop shuts the server down gracefully (SIGTERM) and waits until it is
// gone; its store stays for Start. Stopping a stopped server is a no-op.
func (s *Server) Stop(ctx context.Context) error { return s.life.Stop(ctx, syscall.SIGTERM) }

// Start launches a stopped server again on the same port and store.
func (s *Server) Start(ctx context.Context) error { return s.life.Start(ctx) }

// Kill SIGKILLs the server (a crash) and waits until it is gone.
func (s *Server) Kill() error { return s.life.Kill() }

// Restart stops the server gracefully and starts it again on the same
// port and store.
func (s *Server) Restart(ctx context.Context) error { return s.life.Restart(ctx) }

// Close stops the server and removes a temp dir Start made. Later calls
// return nil.
func (s *Server) Close() error { return s.life.Close(10 * time.Second) }
