// Package pgbouncerproc runs private, throw-away PgBouncer connection
// poolers for tests and the lab, in front of a private Postgres
// (internal/pgproc). A pooler listens only on 127.0.0.1 on a free port,
// keeps its config and log in a temp directory, and never touches a system
// pgbouncer (port 6432).
//
// Every database name is forwarded to the upstream server (a "*" fallback
// entry), with trust authentication for the users given in Options.Users:
// the private Postgres trusts every local connection, so the pooler needs
// no passwords either.
//
// PgBouncer refuses to run as root; when the current process is root it
// runs as the "postgres" user (or "nobody"), like pgproc's servers. It is
// started in its own process group with a parent-death signal of SIGKILL
// (internal/spawn), so it does not outlive the Go process.
package pgbouncerproc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/internal/spawn"
)

// Pool modes (PgBouncer's pool_mode).
const (
	// ModeTransaction hands a server connection to a client for one
	// transaction: session state (LISTEN, SET, prepared statements before
	// PgBouncer 1.21) does not survive it. The usual production mode.
	ModeTransaction = "transaction"
	// ModeSession hands a server connection to a client until it
	// disconnects: everything works as on a direct connection.
	ModeSession = "session"
)

// DefaultPoolSize is Options.PoolSize's default: server connections per
// (database, user) pair.
const DefaultPoolSize = 20

const defaultStartTimeout = 30 * time.Second

// Options configures Start.
type Options struct {
	// Upstream is the Postgres server's "host:port". Required.
	Upstream string
	// Mode is ModeTransaction (default) or ModeSession.
	Mode string
	// Users may log in (trust auth; PgBouncer still wants every user
	// listed). Default: "postgres" only.
	Users []string
	// PoolSize is default_pool_size. Default DefaultPoolSize.
	PoolSize int
	// Binary is the pgbouncer executable. "" (default) searches PATH, then
	// /usr/sbin/pgbouncer.
	Binary string
	// Logger receives lifecycle messages. nil (default) discards them.
	Logger *slog.Logger
}

// Server is a running (or closed) private PgBouncer. Its methods are safe
// for concurrent use.
type Server struct {
	mode    string
	port    int
	dir     string
	logPath string
	log     *slog.Logger

	life spawn.Server // the pooler; SIGINT (immediate shutdown) stops it
}

// program is pgbouncer on PATH, else /usr/sbin/pgbouncer
// (scripts/install-deps.sh --test installs Debian's package).
var program = spawn.Program{Owner: "pgbouncerproc", Name: "pgbouncer", Fallback: "/usr/sbin/pgbouncer",
	Hint: "run scripts/install-deps.sh --test"}

// Available reports why Start cannot run on this machine: nil when a
// pgbouncer executable is found on PATH or at /usr/sbin/pgbouncer
// (scripts/install-deps.sh --test installs Debian's package). It starts nothing.
func Available() error { return program.Available() }

// Start writes a config (listen 127.0.0.1 on a free port, pool_mode
// opts.Mode, every database forwarded to opts.Upstream, trust auth for
// opts.Users, no ignore_startup_parameters: what a default install rejects
// is rejected here too), runs pgbouncer and waits until a client gets
// through it to Postgres ("SELECT 1" as the first user on database
// "postgres"). ctx bounds the start (30 s when it has no deadline). On
// error everything is torn down; the error carries the pooler's log tail.
func Start(ctx context.Context, opts *Options) (*Server, error) {
	if opts == nil || opts.Upstream == "" {
		return nil, errors.New("pgbouncerproc: Options.Upstream is required")
	}
	host, uport, err := net.SplitHostPort(opts.Upstream)
	if err != nil {
		return nil, fmt.Errorf("pgbouncerproc: upstream %q: %w", opts.Upstream, err)
	}
	mode := opts.Mode
	if mode == "" {
		mode = ModeTransaction
	}
	if mode != ModeTransaction && mode != ModeSession {
		return nil, fmt.Errorf("pgbouncerproc: unknown mode %q", mode)
	}
	users := opts.Users
	if len(users) == 0 {
		users = []string{"postgres"}
	}
	poolSize := opts.PoolSize
	if poolSize <= 0 {
		poolSize = DefaultPoolSize
	}
	set := program.WithDefaults(spawn.Settings{Logger: opts.Logger, Binary: opts.Binary}, defaultStartTimeout)
	s := &Server{mode: mode, log: set.Logger}
	s.life = spawn.Server{Name: "pgbouncerproc", Log: s.log, StopSignal: syscall.SIGINT}
	if s.dir, s.life.Dir, err = spawn.Dir("pgbouncerproc", "", s.log); err != nil {
		return nil, err
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		if cred, err = spawn.UnprivilegedCred(); err != nil {
			_ = os.RemoveAll(s.dir)
			return nil, fmt.Errorf("pgbouncerproc: %w", err)
		}
		// The pooler writes its log here.
		if err := os.Chown(s.dir, int(cred.Uid), int(cred.Gid)); err != nil {
			_ = os.RemoveAll(s.dir)
			return nil, fmt.Errorf("pgbouncerproc: chown dir: %w", err)
		}
	}
	s.logPath = filepath.Join(s.dir, "pgbouncer.log")
	var authFile strings.Builder
	for _, u := range users {
		fmt.Fprintf(&authFile, "%q \"\"\n", u)
	}
	if err := os.WriteFile(filepath.Join(s.dir, "users.txt"), []byte(authFile.String()), 0o644); err != nil {
		_ = os.RemoveAll(s.dir)
		return nil, fmt.Errorf("pgbouncerproc: write auth file: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, defaultStartTimeout)
	defer cancel()
	_, err = spawn.OnFreePort(ctx, 0, "pgbouncerproc", s.log, func(port int) error {
		s.port, s.life.Port = port, port
		ini := fmt.Sprintf(`[databases]
* = host=%s port=%s
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
default_pool_size = %d
max_client_conn = 1000
server_login_retry = 1
logfile = %s
pidfile =
admin_users = postgres
log_connections = 0
log_disconnections = 0
`, host, uport, s.port, filepath.Join(s.dir, "users.txt"), mode, poolSize, s.logPath)
		conf := filepath.Join(s.dir, "pgbouncer.ini")
		if err := os.WriteFile(conf, []byte(ini), 0o644); err != nil {
			return fmt.Errorf("pgbouncerproc: write config: %w", err)
		}
		cmd := exec.Command(set.Binary, conf)
		cmd.Dir = s.dir
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		if cred != nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		}
		s.life.Launch = func(ctx context.Context) (*spawn.Proc, error) { return s.launch(ctx, cmd, users[0]) }
		return s.life.Start(ctx)
	})
	if err != nil {
		_ = s.Close()
		return nil, err
	}
	s.log.Info("pgbouncerproc: started", "port", s.port, "mode", mode, "upstream", opts.Upstream)
	return s, nil
}

// launch starts cmd and waits until a client gets through the pooler as
// user (for spawn.Server, with its lock held).
func (s *Server) launch(ctx context.Context, cmd *exec.Cmd, user string) (*spawn.Proc, error) {
	if err := spawn.Start(cmd); err != nil {
		return nil, fmt.Errorf("pgbouncerproc: start pgbouncer: %w", err)
	}
	r := spawn.Watch(cmd)
	err := r.WaitReady(ctx, defaultStartTimeout, 20*time.Millisecond, func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, s.URL(user, "postgres"))
		if err != nil {
			return err
		}
		_, err = conn.Exec(ctx, "SELECT 1")
		_ = conn.Close(ctx)
		return err
	})
	if err != nil {
		logTail := spawn.TailFile(s.logPath, 2048)
		if strings.Contains(logTail, "Address already in use") {
			err = fmt.Errorf("%w %d: %v", spawn.ErrBind, s.port, err)
		}
		return r, fmt.Errorf("pgbouncerproc: not ready: %w; log: %s", err, logTail)
	}
	return r, nil
}

// URL returns a connection URL through the pooler for database db as user,
// e.g. "postgres://consumers@127.0.0.1:PORT/db?sslmode=disable".
func (s *Server) URL(user, db string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", url.PathEscape(user), s.port, url.PathEscape(db))
}

// Rewrite returns directURL (a postgres:// URL of the upstream server) with
// its host and port replaced by the pooler's; user, database and query are
// kept. It panics on a URL that does not parse (a test or lab bug).
func (s *Server) Rewrite(directURL string) string {
	u, err := url.Parse(directURL)
	if err != nil {
		panic(fmt.Sprintf("pgbouncerproc: rewrite %q: %v", directURL, err))
	}
	u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
	return u.String()
}

// Port returns the pooler's TCP port on 127.0.0.1.
func (s *Server) Port() int { return s.port }

// Mode returns the pool mode, ModeTransaction or ModeSession.
func (s *Server) Mode() string { return s.mode }

// LogPath returns the path of the pooler's log file.
func (s *Server) LogPath() string { return s.logPath }

// Close stops the pooler (SIGINT: PgBouncer's immediate shutdown; SIGKILL
// after 10 s) and removes its directory. Idempotent; later calls return nil.
func (s *Server) Close() error { return s.life.Close(10 * time.Second) }
