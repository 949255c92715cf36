// Package pgproc runs private, throw-away PostgreSQL servers for tests and
// the lab. A server listens only on 127.0.0.1 on a free (or chosen) port,
// keeps its data in a temp directory, and never touches the system server on
// port 5432.
//
// When the current process runs as root, initdb and postgres (which refuse to
// run as root) are run as the "postgres" user, or "nobody" if that user does
// not exist; the data directory is chowned to that user.
//
// Every server process is started in its own process group (so a Ctrl-C on
// the controlling terminal does not reach it) with a parent-death signal of
// SIGKILL, so it does not outlive the Go process; internal/spawn says why
// this is reliable.
package pgproc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/internal/spawn"
)

// DefaultDatabase is the database that Start creates on every server.
const DefaultDatabase = "outboxchat"

// defaultStartTimeout bounds readiness waits when ctx has no deadline.
const defaultStartTimeout = 60 * time.Second

// Options configures Start. The zero value (or a nil *Options) is valid.
type Options struct {
	// Dir is the base directory of the server. The cluster lives in
	// Dir/data and the server log in Dir/postgres.log. If Dir/data already
	// holds a cluster it is reused (no initdb). "" (default) creates a new
	// temp directory that Close removes; a caller-provided Dir is never
	// removed. When running as root Dir must be traversable by the
	// postgres user (Start chmods a temp dir to 0755 itself).
	Dir string
	// Port is the TCP port on 127.0.0.1. 0 (default) picks a free port;
	// Start then retries with another port if it loses a bind race.
	Port int
	// Logger receives lifecycle messages. nil (default) discards them.
	Logger *slog.Logger
	// Fsync sets the postgres fsync parameter. The default false makes
	// tests fast, and data still survives a postgres crash (Kill) because
	// the OS page cache survives; it only risks data on an OS crash or
	// power loss. Set true to measure realistic commit latency.
	Fsync bool
	// BinDir is the directory holding initdb and postgres. "" (default)
	// searches PATH, then the newest /usr/lib/postgresql/*/bin.
	BinDir string
	// StartTimeout bounds how long Start and Restart wait for the server to
	// accept connections when ctx has no deadline. 0 means 60s.
	StartTimeout time.Duration
	// TLSCertFile and TLSKeyFile (PEM), when both set, turn TLS on
	// (ssl = on): clients may then connect with sslmode=require or
	// verify-full; plain connections are still accepted. Start copies them
	// into Dir (readable by the server's user). Default "": no TLS.
	TLSCertFile, TLSKeyFile string
	// StandbyOf, when set, makes the new server an asynchronous streaming
	// replica (a hot standby) of that running server instead of a new
	// cluster: its data dir is a pg_basebackup of StandbyOf (-X stream -R),
	// it follows StandbyOf's WAL, accepts read-only connections, and
	// Promote makes it a primary. Ignored when Dir/data already holds a
	// cluster. Default nil: a new primary.
	StandbyOf *Server
	// Env is extra environment for the postgres server process (not initdb
	// or pg_basebackup), as "KEY=VALUE" strings added to the minimal one
	// Start gives it (PATH, LC_ALL=C, LANG=C, TZ=UTC). Tests use it to
	// preload a fault into the server, such as libfaketime to step its
	// wall clock. Default nil: nothing added.
	Env []string
	// Settings are extra server parameters, each "name=value", passed as
	// -c options after the defaults (so they override them), e.g.
	// "shared_preload_libraries=pg_stat_statements". Default nil: none.
	Settings []string
}

// Server is a running (or stopped) private PostgreSQL server. All methods are
// safe for concurrent use; lifecycle methods (Stop, Kill, Restart, Close) are
// serialized.
type Server struct {
	port         int
	dir          string
	dataDir      string
	logPath      string
	fsync        bool
	binDir       string
	startTimeout time.Duration
	log          *slog.Logger
	cred         *syscall.Credential
	tls          bool // Dir/server.crt and Dir/server.key serve TLS
	env          []string
	settings     []string

	life spawn.Server // the postmaster; SIGINT (fast shutdown) stops it
}

// Start creates (initdb: trust auth, UTF8, superuser "postgres") or reuses a
// cluster, starts postgres listening on 127.0.0.1 only, waits until it
// accepts connections and creates the database DefaultDatabase ("outboxchat")
// if missing. ctx bounds the whole start; on error everything started is torn
// down and a temp dir is removed. The error includes the tail of the server
// log when postgres exits early.
func Start(ctx context.Context, opts *Options) (*Server, error) {
	if opts == nil {
		opts = &Options{}
	}
	// The binaries are found by findBinDir: the zero Program.
	set := spawn.Program{}.WithDefaults(spawn.Settings{Logger: opts.Logger, StartTimeout: opts.StartTimeout}, defaultStartTimeout)
	s := &Server{
		fsync:        opts.Fsync,
		settings:     slices.Clone(opts.Settings),
		log:          set.Logger,
		startTimeout: set.StartTimeout,
		env:          slices.Clone(opts.Env),
	}
	var err error
	if s.binDir, err = findBinDir(opts.BinDir); err != nil {
		return nil, err
	}
	if os.Geteuid() == 0 {
		if s.cred, err = spawn.UnprivilegedCred(); err != nil {
			return nil, fmt.Errorf("pgproc: %w", err)
		}
	}
	s.life = spawn.Server{Name: "pgproc", Log: s.log, Launch: s.launch, KillProc: s.kill, StopSignal: syscall.SIGINT}
	if s.dir, s.life.Dir, err = spawn.Dir("pgproc", opts.Dir, s.log); err != nil {
		return nil, err
	}
	s.dataDir = filepath.Join(s.dir, "data")
	s.logPath = filepath.Join(s.dir, "postgres.log")
	ok := false
	defer func() {
		if !ok {
			_ = s.Close()
		}
	}()
	if s.life.Dir != "" { // a temp dir of ours
		if err := os.Chmod(s.dir, 0o755); err != nil {
			return nil, fmt.Errorf("pgproc: chmod dir: %w", err)
		}
	}
	if opts.StandbyOf != nil {
		if err := s.baseBackup(ctx, opts.StandbyOf); err != nil {
			return nil, err
		}
	} else if err := s.initdb(ctx); err != nil {
		return nil, err
	}
	if opts.TLSCertFile != "" && opts.TLSKeyFile != "" {
		if err := s.installTLS(opts.TLSCertFile, opts.TLSKeyFile); err != nil {
			return nil, err
		}
	}

	if _, err := spawn.OnFreePort(ctx, opts.Port, "pgproc", s.log, func(port int) error {
		s.port, s.life.Port = port, port
		return s.life.Start(ctx)
	}); err != nil {
		return nil, err
	}
	if opts.StandbyOf == nil {
		if err := s.createDB(ctx, DefaultDatabase); err != nil {
			return nil, err
		}
	}
	ok = true
	s.log.Info("pgproc: started", "port", s.port, "dir", s.dir)
	return s, nil
}

// installTLS copies the certificate and key into s.dir as server.crt and
// server.key (0600, owned by the server's user: postgres refuses a key
// others can read).
func (s *Server) installTLS(certFile, keyFile string) error {
	for _, f := range []struct{ from, to string }{{certFile, "server.crt"}, {keyFile, "server.key"}} {
		b, err := os.ReadFile(f.from)
		if err != nil {
			return fmt.Errorf("pgproc: tls: %w", err)
		}
		to := filepath.Join(s.dir, f.to)
		if err := os.WriteFile(to, b, 0o600); err != nil {
			return fmt.Errorf("pgproc: tls: %w", err)
		}
		if s.cred != nil {
			if err := os.Chown(to, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
				return fmt.Errorf("pgproc: tls: %w", err)
			}
		}
	}
	s.tls = true
	return nil
}

// Available reports why Start with default Options cannot run on this
// machine: nil when the initdb and postgres binaries are found (on PATH or
// in /usr/lib/postgresql/*/bin) and, when running as root, an unprivileged
// user (postgres or nobody) exists to run them as. It starts nothing and is
// safe for concurrent use.
func Available() error {
	if _, err := findBinDir(""); err != nil {
		return err
	}
	if os.Geteuid() == 0 {
		if _, err := spawn.UnprivilegedCred(); err != nil {
			return fmt.Errorf("pgproc: %w", err)
		}
	}
	return nil
}

func findBinDir(dir string) (string, error) {
	if dir != "" {
		return dir, nil
	}
	if p, err := exec.LookPath("postgres"); err == nil {
		if _, err := exec.LookPath("initdb"); err == nil {
			return filepath.Dir(p), nil
		}
	}
	m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	sort.Slice(m, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(m[i]))))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(m[j]))))
		return vi > vj
	})
	if len(m) > 0 {
		return filepath.Dir(m[0]), nil
	}
	return "", errors.New("pgproc: postgres binaries not found on PATH or in /usr/lib/postgresql/*/bin")
}

func (s *Server) command(name string, args ...string) *exec.Cmd {
	if !filepath.IsAbs(name) {
		name = filepath.Join(s.binDir, name)
	}
	cmd := exec.Command(name, args...)
	cmd.Dir = s.dir
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "LC_ALL=C", "LANG=C", "TZ=UTC"}
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	return cmd
}

// The first Start in a process runs initdb once into a template cluster;
// every new cluster is then a copy of it (cp -a, preserving ownership),
// which is several times faster than initdb. The template dir carries an
// owner file, so reapStale removes it once the process is gone;
// RemoveTemplate removes it earlier.
var tmpl struct {
	mu     sync.Mutex
	dir    string
	binDir string
	cred   *syscall.Credential
}

// RemoveTemplate deletes this process's cached template cluster, if any. A
// later Start recreates it. Call it when the process is done starting
// servers (testenv.Main does); otherwise the next process reaps it. Safe for
// concurrent use.
func RemoveTemplate() error {
	tmpl.mu.Lock()
	defer tmpl.mu.Unlock()
	if tmpl.dir == "" {
		return nil
	}
	err := os.RemoveAll(tmpl.dir)
	tmpl.dir = ""
	return err
}

// templateData returns the template's data dir, creating it if needed.
func (s *Server) templateData(ctx context.Context) (string, error) {
	tmpl.mu.Lock()
	defer tmpl.mu.Unlock()
	if tmpl.dir != "" {
		if tmpl.binDir == s.binDir && tmpl.cred == s.cred {
			return filepath.Join(tmpl.dir, "data"), nil
		}
		return "", nil // different binaries or user: no template
	}
	d, err := spawn.TempDir("pgproc-")
	if err != nil {
		return "", err
	}
	if err := os.Chmod(d, 0o755); err != nil {
		_ = os.RemoveAll(d)
		return "", err
	}
	t := &Server{dir: d, dataDir: filepath.Join(d, "data"), binDir: s.binDir, cred: s.cred, log: s.log}
	if err := t.runInitdb(ctx); err != nil {
		_ = os.RemoveAll(d)
		return "", err
	}
	tmpl.dir, tmpl.binDir, tmpl.cred = d, s.binDir, s.cred
	return t.dataDir, nil
}

// initdb creates the cluster unless Dir/data already holds one, by copying
// the process-wide template (see tmpl).
func (s *Server) initdb(ctx context.Context) error {
	if _, err := os.Stat(filepath.Join(s.dataDir, "PG_VERSION")); err == nil {
		s.log.Debug("pgproc: reusing cluster", "dir", s.dataDir)
		return nil
	}
	src, err := s.templateData(ctx)
	if err != nil {
		return fmt.Errorf("pgproc: template cluster: %w", err)
	}
	if src != "" {
		if _, err := os.Stat(s.dataDir); err == nil {
			if err := os.Remove(s.dataDir); err != nil { // must be empty
				return fmt.Errorf("pgproc: data dir exists and is not a cluster: %w", err)
			}
		}
		out, err := exec.CommandContext(ctx, "cp", "-a", src, s.dataDir).CombinedOutput()
		if err != nil {
			return fmt.Errorf("pgproc: copy template cluster: %w: %s", err, out)
		}
		return nil
	}
	return s.runInitdb(ctx)
}

// runInitdb runs initdb into s.dataDir.
func (s *Server) runInitdb(ctx context.Context) error {
	if err := s.makeDataDir(); err != nil {
		return err
	}
	start := time.Now()
	if err := s.runTool(ctx, "initdb", "initdb.log", "-D", s.dataDir, "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"); err != nil {
		return err
	}
	s.log.Debug("pgproc: initdb done", "dir", s.dataDir, "took", time.Since(start))
	return nil
}

// makeDataDir creates s.dataDir (0700), owned by the server's user.
func (s *Server) makeDataDir() error {
	if err := os.MkdirAll(s.dataDir, 0o700); err != nil {
		return fmt.Errorf("pgproc: create data dir: %w", err)
	}
	if s.cred != nil {
		if err := os.Chown(s.dataDir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return fmt.Errorf("pgproc: chown data dir: %w", err)
		}
	}
	return nil
}

// runTool runs the server's tool name (a path, or a name in the bin dir)
// with args as the server's user, its output in Dir/logName, until it exits
// or ctx ends (then its process group is killed). The error names the tool
// and carries the log's tail.
func (s *Server) runTool(ctx context.Context, name, logName string, args ...string) error {
	cmd := s.command(name, args...)
	out, err := os.Create(filepath.Join(s.dir, logName))
	if err != nil {
		return fmt.Errorf("pgproc: %w", err)
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	tool := filepath.Base(name)
	if err := spawn.Start(cmd); err != nil {
		return fmt.Errorf("pgproc: start %s: %w", tool, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		return fmt.Errorf("pgproc: %s: %w", tool, ctx.Err())
	}
	if err != nil {
		return fmt.Errorf("pgproc: %s: %w: %s", tool, err, spawn.TailFile(out.Name(), 2048))
	}
	return nil
}

// launch starts the postmaster and waits until it accepts connections (for
// spawn.Server, with its lock held).
func (s *Server) launch(ctx context.Context) (*spawn.Proc, error) {
	fsync := "off"
	if s.fsync {
		fsync = "on"
	}
	cmd := s.command("postgres", "-D", s.dataDir, "-p", strconv.Itoa(s.port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=",
		"-c", "max_connections=300",
		"-c", "shared_buffers=128MB",
		"-c", "fsync="+fsync,
		"-c", "synchronous_commit=on",
		"-c", "log_min_messages=warning",
		"-c", "logging_collector=off",
		"-c", "log_destination=stderr",
		"-c", "TimeZone=UTC",
	)
	cmd.Env = append(cmd.Env, s.env...)
	for _, kv := range s.settings {
		cmd.Args = append(cmd.Args, "-c", kv)
	}
	if s.tls {
		cmd.Args = append(cmd.Args, "-c", "ssl=on",
			"-c", "ssl_cert_file="+filepath.Join(s.dir, "server.crt"),
			"-c", "ssl_key_file="+filepath.Join(s.dir, "server.key"))
	}
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("pgproc: open log: %w", err)
	}
	defer logf.Close() // the child keeps its own copy of the descriptor
	st, _ := logf.Stat()
	var logOff int64
	if st != nil {
		logOff = st.Size()
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := spawn.Start(cmd); err != nil {
		return nil, fmt.Errorf("pgproc: start postgres: %w", err)
	}
	r := spawn.Watch(cmd)
	if err := r.WaitReady(ctx, s.startTimeout, 20*time.Millisecond, s.ping); err != nil {
		logTail := spawn.TailSince(s.logPath, logOff)
		if strings.Contains(logTail, "could not bind") || strings.Contains(logTail, "Address already in use") {
			err = fmt.Errorf("%w %d: %v", spawn.ErrBind, s.port, err)
		}
		return r, fmt.Errorf("pgproc: postgres on port %d not ready: %w; log: %s", s.port, err, logTail)
	}
	return r, nil
}

// ping connects once and checks that the answering server is ours, not
// another one that happens to own the port.
func (s *Server) ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.URL("postgres")+"&connect_timeout=2")
	if err != nil {
		return err
	}
	var dataDir string
	err = conn.QueryRow(ctx, "SHOW data_directory").Scan(&dataDir)
	_ = conn.Close(ctx)
	if err == nil && dataDir != s.dataDir {
		err = fmt.Errorf("port %d is served by another postgres (data_directory %s)", s.port, dataDir)
	}
	return err
}

func (s *Server) createDB(ctx context.Context, name string) error {
	conn, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return fmt.Errorf("pgproc: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return fmt.Errorf("pgproc: check database: %w", err)
	}
	if exists {
		return nil
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("pgproc: create database %s: %w", name, err)
	}
	return nil
}

// URL returns a connection URL for database db as the superuser, e.g.
// "postgres://postgres@127.0.0.1:PORT/db?sslmode=disable". No password is
// needed (trust auth).
func (s *Server) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, url.PathEscape(db))
}

// AdminURL returns URL(DefaultDatabase).
func (s *Server) AdminURL() string { return s.URL(DefaultDatabase) }

// Port returns the TCP port on 127.0.0.1. It does not change across Restart.
func (s *Server) Port() int { return s.port }

// Dir returns the base directory (data in Dir()/data, log in
// Dir()/postgres.log).
func (s *Server) Dir() string { return s.dir }

// LogPath returns the path of the server log file.
func (s *Server) LogPath() string { return s.logPath }

// Running reports whether the postmaster process is currently alive.
func (s *Server) Running() bool { return s.life.Running() }

// Stop shuts the server down cleanly using fast mode (SIGINT: open
// transactions are rolled back, a checkpoint is written) and waits for the
// postmaster and its children to exit. If ctx ends first, the process group
// is SIGKILLed and ctx's error returned. Stopping a stopped server is a no-op.
func (s *Server) Stop(ctx context.Context) error { return s.life.Stop(ctx, syscall.SIGINT) }

// StopImmediate shuts the server down in immediate mode (SIGQUIT: the
// children exit at once without a checkpoint, so the next start runs crash
// recovery), and waits as Stop does. Stopping a stopped server is a no-op.
func (s *Server) StopImmediate(ctx context.Context) error { return s.life.Stop(ctx, syscall.SIGQUIT) }

// Kill simulates a crash: it SIGKILLs the postmaster's whole process group
// and waits until the postmaster is reaped and no member of the group is
// alive, so Restart can reuse the data directory immediately. Killing a
// stopped server is a no-op. It returns an error only if processes survive
// for more than 10s.
func (s *Server) Kill() error { return s.life.Kill() }

// kill is the server's spawn.Server.KillProc. Postgres children call
// setsid(), so they are not in the postmaster's process group: it freezes
// the postmaster (it cannot fork while stopped), collects its descendants,
// then SIGKILLs all of them.
func (s *Server) kill(r *spawn.Proc) error {
	pid := r.Cmd.Process.Pid
	_ = syscall.Kill(pid, syscall.SIGSTOP)
	procs := append(spawn.Descendants(pid), pid)
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	for _, p := range procs {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	<-r.Exited()
	deadline := time.Now().Add(10 * time.Second)
	for _, p := range procs {
		for spawn.Alive(p) {
			if time.Now().After(deadline) {
				return fmt.Errorf("server process %d still alive after SIGKILL", p)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	spawn.WaitGroupGone(pid, time.Second)
	// The whole server is dead, so its lock file is stale. Remove it so a
	// recycled pid cannot make postgres refuse to start on Restart.
	_ = os.Remove(filepath.Join(s.dataDir, "postmaster.pid"))
	return nil
}

// Restart starts the server again on the same port and data directory and
// waits until it accepts connections (after a Kill this includes crash
// recovery). A running server is stopped first. Restart after Close fails.
func (s *Server) Restart(ctx context.Context) error { return s.life.Restart(ctx) }

// Close stops the server if it is running (fast shutdown, SIGKILL after
// 15s) and removes the directory if Start created it. It is idempotent and
// safe to call concurrently; later calls return nil.
func (s *Server) Close() error { return s.life.Close(15 * time.Second) }
