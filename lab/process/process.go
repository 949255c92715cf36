package process

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/internal/redisclient"
	"github.com/outboxchat/outboxchat/internal/spawn"
)

// Binary is the outboxchat executable the lab starts as `serve` processes.
// "" (default) means os.Executable(), the running binary; tests that run the
// lab from a test binary set it to a freshly built cmd/outboxchat.
var Binary string

// Process defaults.
const (
	// DefaultStopTimeout bounds Proc.Stop when ctx has no deadline: SIGTERM,
	// then SIGKILL after this long.
	DefaultStopTimeout = 10 * time.Second
	// DefaultReadyTimeout bounds Proc.WaitReady when ctx has no deadline.
	DefaultReadyTimeout = 20 * time.Second
)

// ErrNotRunning is returned by Proc methods that need a running process.
var ErrNotRunning = errors.New("lab: process not running")

// Config configures a Proc.
type Config struct {
	// Args are the arguments after `serve` (e.g. --service consumers
	// --role api). The Proc adds --log-format json and, when API is set,
	// --http with its fixed address.
	Args []string
	// Env holds extra KEY=VALUE environment entries. The inherited
	// OUTBOXCHAT_FAULT is always removed (faults are per process, by flag).
	Env []string
	// API says the process serves HTTP: a free port is chosen once by NewProc
	// (or Addr is used) and kept across restarts, so clients reconnect to
	// the same URL.
	API bool
	// Addr is the fixed HTTP address ("127.0.0.1:PORT") of an API process.
	// "" (default) picks a free port, and StartReady moves to another free
	// port if it loses a bind race; a given Addr is never changed (a port in
	// use fails the start).
	Addr string
	// ReadyMsg is the log message ("msg" of a JSON log line) that marks the
	// process ready. Default "listening" when API is set, else "relay started".
	ReadyMsg string
	// LogPath receives the process's stderr and stdout (JSON log lines),
	// appended across restarts. "" means no file.
	LogPath string
	// Binary overrides the package-level Binary for this process.
	Binary string
	// TLS says the process serves HTTPS (its Args carry --tls-cert and
	// --tls-key): URL is then https://.
	TLS bool
}

// LogLine is one line a child wrote to stderr, as read by the lab.
type LogLine struct {
	// Time is when the lab read the line (not the child's timestamp).
	Time time.Time
	// Level and Msg are the JSON log's "level" and "msg" ("" for a line that
	// is not JSON).
	Level, Msg string
	// Attrs holds every field of the JSON line (nil for a non-JSON line).
	Attrs map[string]any
	// Raw is the line without its newline.
	Raw string
}

// Str returns attribute key as a string ("" when absent).
func (l LogLine) Str(key string) string {
	switch v := l.Attrs[key].(type) {
	case string:
		return v
	case nil:
		return ""
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	default:
		return fmt.Sprint(v)
	}
}

// Event returns the kind of the typed event the line carries (chat.EventKey
// of a line whose msg is chat.EventLogMsg), or "" for any other line. The
// kinds are the library's and the app's constants (inbox.EventDuplicate,
// redisq.EventReclaimed, outbox.EventPassFailed, fault.EventCrash, …),
// so the lab never matches log text.
func (l LogLine) Event() string {
	if l.Msg != chat.EventLogMsg {
		return ""
	}
	return l.Str(chat.EventKey)
}

// Usage is a process's resource use, read from /proc.
type Usage struct {
	// PeakRSSBytes is VmHWM: the peak resident set size, in bytes.
	PeakRSSBytes int64
	// CPUSeconds is user + system CPU time, in seconds.
	CPUSeconds float64
}

// Proc supervises one `outboxchat serve` child process that can be started,
// stopped (SIGTERM), killed (SIGKILL), signalled (SIGSTOP/SIGCONT) and
// started again. Its log lines are written to a file and handed to
// subscribers. A Proc is safe for concurrent use; Close must be called to
// end the child and the goroutines reading it.
type Proc struct {
	name string
	cfg  Config
	addr string
	// started is set once the process has been ready; from then on its
	// address is fixed.
	started bool

	mu      sync.Mutex
	cur     *procRun
	subs    map[int]func(LogLine)
	nextSub int
	logf    *os.File
	tail    []string // last lines, for error messages
	last    Usage    // sampled before each stop or kill
	closed  bool
}

// procRun is one child process of a Proc.
type procRun struct {
	cmd    *exec.Cmd
	ready  chan struct{} // closed when the ready line was read
	exited chan struct{} // closed after the process was reaped and its output read
	err    error         // cmd.Wait's result, valid once exited is closed
	once   sync.Once
}

// New returns a stopped Proc named name (used in messages). It picks the
// HTTP port when cfg.API is set and opens cfg.LogPath.
func New(name string, cfg *Config) (*Proc, error) {
	p := &Proc{name: name, subs: map[int]func(LogLine){}}
	if cfg != nil {
		p.cfg = *cfg
	}
	if p.cfg.ReadyMsg == "" {
		p.cfg.ReadyMsg = "relay started"
		if p.cfg.API {
			p.cfg.ReadyMsg = "listening"
		}
	}
	if p.cfg.API && p.cfg.Addr != "" {
		p.addr = p.cfg.Addr
	} else if p.cfg.API {
		a, err := spawn.FreeAddr()
		if err != nil {
			return nil, fmt.Errorf("lab: %s: pick a port: %w", name, err)
		}
		p.addr = a
	}
	if p.cfg.LogPath != "" {
		f, err := os.OpenFile(p.cfg.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("lab: %s: open log: %w", name, err)
		}
		p.logf = f
	}
	return p, nil
}

// Name returns the Proc's name.
func (p *Proc) Name() string { return p.name }

// Addr returns the fixed HTTP address "127.0.0.1:PORT" ("" without API).
func (p *Proc) Addr() string { return p.addr }

// URL returns "http://127.0.0.1:PORT" ("https://…" with Config.TLS;
// "" without API).
func (p *Proc) URL() string {
	if p.addr == "" {
		return ""
	}
	if p.cfg.TLS {
		return "https://" + p.addr
	}
	return "http://" + p.addr
}

// LogPath returns the log file's path ("" when none).
func (p *Proc) LogPath() string { return p.cfg.LogPath }

// SetArgs replaces the serve arguments used by the next Start (e.g. to drop
// a --fault flag before restarting a crashed process).
func (p *Proc) SetArgs(args []string) {
	p.mu.Lock()
	p.cfg.Args = append([]string(nil), args...)
	p.mu.Unlock()
}

// Args returns a copy of the serve arguments the next Start uses.
func (p *Proc) Args() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.cfg.Args...)
}

// Subscribe calls f with every log line read from now on, from the Proc's
// reader goroutine, in order. f must not block. The returned func
// unsubscribes; it is idempotent.
func (p *Proc) Subscribe(f func(LogLine)) (cancel func()) {
	p.mu.Lock()
	id := p.nextSub
	p.nextSub++
	p.subs[id] = f
	p.mu.Unlock()
	return func() {
		p.mu.Lock()
		delete(p.subs, id)
		p.mu.Unlock()
	}
}

// Start starts the child. It does not wait until the child is ready (see
// WaitReady). Starting a running Proc is an error.
func (p *Proc) Start(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("lab: start %s: %w", p.name, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return fmt.Errorf("lab: start %s: closed", p.name)
	}
	if p.cur != nil {
		select {
		case <-p.cur.exited:
		default:
			return fmt.Errorf("lab: start %s: already running", p.name)
		}
	}
	bin := p.cfg.Binary
	if bin == "" {
		bin = Binary
	}
	if bin == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("lab: start %s: find own binary: %w", p.name, err)
		}
		bin = exe
	}
	args := append([]string{"serve"}, p.cfg.Args...)
	args = append(args, "--log-format", "json")
	if p.addr != "" {
		args = append(args, "--http", p.addr)
	}
	cmd := exec.Command(bin, args...)
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "OUTBOXCHAT_FAULT=") {
			cmd.Env = append(cmd.Env, e)
		}
	}
	cmd.Env = append(cmd.Env, p.cfg.Env...)
	pr, pw, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("lab: start %s: pipe: %w", p.name, err)
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	if p.logf != nil {
		fmt.Fprintf(p.logf, "# lab: %s start %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(redactArgs(append(slices.Clone(p.cfg.Env), args...)), " "))
	}
	err = spawn.Start(cmd)
	pw.Close()
	if err != nil {
		pr.Close()
		return fmt.Errorf("lab: start %s: %w", p.name, err)
	}
	r := &procRun{cmd: cmd, ready: make(chan struct{}), exited: make(chan struct{})}
	p.cur = r
	p.tail = nil
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		p.read(r, pr)
	}()
	go func() {
		err := cmd.Wait()
		<-readerDone
		r.err = err
		close(r.exited)
	}()
	return nil
}

// read consumes the child's output until EOF (the child exited).
func (p *Proc) read(r *procRun, rd io.ReadCloser) {
	defer rd.Close()
	sc := bufio.NewScanner(rd)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		raw := sc.Bytes()
		line := LogLine{Time: time.Now(), Raw: string(raw)}
		if bytes.HasPrefix(raw, []byte("{")) {
			var m map[string]any
			if json.Unmarshal(raw, &m) == nil {
				line.Attrs = m
				line.Msg, _ = m["msg"].(string)
				line.Level, _ = m["level"].(string)
			}
		}
		p.mu.Lock()
		if p.logf != nil {
			p.logf.Write(append(raw, '\n'))
		}
		p.tail = append(p.tail, line.Raw)
		if len(p.tail) > 20 {
			p.tail = p.tail[len(p.tail)-20:]
		}
		subs := make([]func(LogLine), 0, len(p.subs))
		for _, f := range p.subs {
			subs = append(subs, f)
		}
		readyMsg := p.cfg.ReadyMsg
		p.mu.Unlock()
		if line.Msg == readyMsg {
			r.once.Do(func() { close(r.ready) })
		}
		for _, f := range subs {
			f(line)
		}
	}
}

// Tail returns the last lines (up to 20) the current or last run wrote.
func (p *Proc) Tail() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.tail, "\n")
}

func (p *Proc) run() *procRun {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur
}

// WaitReady waits until the current run logged its ready line. It fails if
// the child exits first (the error carries its last log lines) or ctx ends
// (DefaultReadyTimeout when ctx has no deadline).
func (p *Proc) WaitReady(ctx context.Context) error {
	r := p.run()
	if r == nil {
		return fmt.Errorf("lab: wait for %s: %w", p.name, ErrNotRunning)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultReadyTimeout)
		defer cancel()
	}
	select {
	case <-r.ready:
		return nil
	case <-r.exited:
		return fmt.Errorf("lab: %s exited before it was ready (%v); last log lines:\n%s", p.name, r.err, p.Tail())
	case <-ctx.Done():
		return fmt.Errorf("lab: wait for %s to be ready: %w; last log lines:\n%s", p.name, ctx.Err(), p.Tail())
	}
}

// StartReady is Start followed by WaitReady. The first time a process with
// an API starts, a port taken between picking it and binding it (by another
// process's outgoing connection, say) is replaced by a new free port, up to
// 5 times; a restart keeps the port its clients know.
func (p *Proc) StartReady(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		if err := p.Start(ctx); err != nil {
			return err
		}
		err := p.WaitReady(ctx)
		if err == nil {
			p.started = true
			return nil
		}
		if !p.cfg.API || p.cfg.Addr != "" || p.started || attempt >= 5 || !strings.Contains(err.Error(), "address already in use") {
			return err
		}
		a, ferr := spawn.FreeAddr()
		if ferr != nil {
			return err
		}
		p.addr = a
	}
}

// StartAll starts every p at once (StartReady) and waits for them all; it
// returns their errors joined.
func StartAll(ctx context.Context, ps ...*Proc) error {
	return each(ps, func(p *Proc) error { return p.StartReady(ctx) })
}

// StopAll stops every p at once (Stop) and waits for them all; it returns
// their errors joined.
func StopAll(ctx context.Context, ps ...*Proc) error {
	return each(ps, func(p *Proc) error { return p.Stop(ctx) })
}

// each runs f on every p in a goroutine of its own and joins the errors.
func each(ps []*Proc, f func(*Proc) error) error {
	errs := make([]error, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = f(p) }()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Running reports whether the child is alive (not yet reaped).
func (p *Proc) Running() bool {
	r := p.run()
	if r == nil {
		return false
	}
	select {
	case <-r.exited:
		return false
	default:
		return true
	}
}

// Exited returns a channel closed when the current run ends (nil when never
// started), and the PID of that run.
func (p *Proc) Exited() (<-chan struct{}, int) {
	r := p.run()
	if r == nil {
		return nil, 0
	}
	return r.exited, r.cmd.Process.Pid
}

// ExitErr returns how the last run ended (cmd.Wait's error: nil for exit
// status 0), nil while it runs or when it never started.
func (p *Proc) ExitErr() error {
	r := p.run()
	if r == nil || p.Running() {
		return nil
	}
	return r.err
}

// PID returns the PID of the current run, 0 when not running.
func (p *Proc) PID() int {
	if !p.Running() {
		return 0
	}
	return p.run().cmd.Process.Pid
}

// Signal sends sig to the child (e.g. SIGSTOP, SIGCONT).
func (p *Proc) Signal(sig syscall.Signal) error {
	if !p.Running() {
		return fmt.Errorf("lab: signal %s: %w", p.name, ErrNotRunning)
	}
	if err := syscall.Kill(p.run().cmd.Process.Pid, sig); err != nil {
		return fmt.Errorf("lab: signal %s: %w", p.name, err)
	}
	return nil
}

// Stop stops the child gracefully: SIGTERM, then waits for it to exit; when
// ctx ends first (DefaultStopTimeout without a deadline) the process group
// is SIGKILLed and Stop returns an error wrapping ctx's. A stopped child is
// not an error. A stopped (SIGSTOP) child is continued first.
func (p *Proc) Stop(ctx context.Context) error {
	r := p.run()
	if r == nil || !p.Running() {
		return nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultStopTimeout)
		defer cancel()
	}
	p.sample()
	pid := r.cmd.Process.Pid
	_ = syscall.Kill(pid, syscall.SIGTERM)
	_ = syscall.Kill(pid, syscall.SIGCONT)
	select {
	case <-r.exited:
		return nil
	case <-ctx.Done():
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		<-r.exited
		return fmt.Errorf("lab: stop %s: %w (killed)", p.name, ctx.Err())
	}
}

// Kill ends the child at once with SIGKILL to its process group (a crash)
// and waits until it is reaped. Killing a stopped child is a no-op.
func (p *Proc) Kill() error {
	r := p.run()
	if r == nil || !p.Running() {
		return nil
	}
	p.sample()
	_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
	<-r.exited
	return nil
}

// Close kills the child if it runs and closes the log file. Idempotent.
func (p *Proc) Close() error {
	err := p.Kill()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	if p.logf != nil {
		if cerr := p.logf.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}
	return err
}

// sample stores the current usage as the last known one.
func (p *Proc) sample() {
	if u, err := p.Usage(); err == nil {
		p.mu.Lock()
		p.last = u
		p.mu.Unlock()
	}
}

// LastUsage returns the usage sampled just before the last Stop or Kill.
func (p *Proc) LastUsage() Usage {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last
}

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat (100
// on every Linux ABI Go supports).
const clockTicks = 100

// Usage reads the running child's peak RSS (VmHWM of /proc/PID/status) and
// CPU time (utime+stime of /proc/PID/stat).
func (p *Proc) Usage() (Usage, error) {
	pid := p.PID()
	if pid == 0 {
		return Usage{}, fmt.Errorf("lab: usage of %s: %w", p.name, ErrNotRunning)
	}
	return readUsage(pid)
}

func readUsage(pid int) (Usage, error) {
	var u Usage
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return u, fmt.Errorf("lab: read usage: %w", err)
	}
	for _, l := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				u.PeakRSSBytes = kb * 1024
			}
		}
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return u, fmt.Errorf("lab: read usage: %w", err)
	}
	u.CPUSeconds, err = parseStatCPU(string(stat))
	return u, err
}

// parseStatCPU returns utime+stime in seconds from a /proc/PID/stat line.
func parseStatCPU(stat string) (float64, error) {
	p, err := parseProcStat(stat)
	return p.self, err
}

// procStat is the CPU part of /proc/PID/stat, in seconds.
type procStat struct {
	ppid        int
	self, child float64 // utime+stime; cutime+cstime (reaped children)
}

// parseProcStat reads the parent pid and the CPU times (proc(5): utime,
// stime, cutime, cstime are fields 14 to 17, in clock ticks) of a
// /proc/PID/stat line. The command name (field 2) may contain spaces and
// parentheses, so fields are counted from the last ')'.
func parseProcStat(stat string) (procStat, error) {
	bad := errors.New("lab: malformed /proc stat")
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return procStat{}, bad
	}
	// After ")": field 3 (state) is f[0], ppid f[1], utime f[11].
	f := strings.Fields(stat[i+1:])
	if len(f) < 13 {
		return procStat{}, bad
	}
	var ticks [4]int64
	for k := range ticks {
		if 11+k >= len(f) {
			break // cutime, cstime missing: counted as 0
		}
		v, err := strconv.ParseInt(f[11+k], 10, 64)
		if err != nil {
			return procStat{}, bad
		}
		ticks[k] = v
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return procStat{}, bad
	}
	return procStat{
		ppid:  ppid,
		self:  float64(ticks[0]+ticks[1]) / clockTicks,
		child: float64(ticks[2]+ticks[3]) / clockTicks,
	}, nil
}

// RestartOnExit waits, in a goroutine of its own, for p's current run to
// end; then it calls exited, starts p again with args and calls started
// with StartReady's result. The returned channel is closed when that is
// done, or at once when ctx ends first (then nothing is restarted). For a
// crash the experiment provoked: a process started with --fault is given
// args without it.
func (p *Proc) RestartOnExit(ctx context.Context, args []string, exited func(), started func(error)) <-chan struct{} {
	ch, _ := p.Exited()
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-ctx.Done():
			return
		case <-ch:
		}
		exited()
		p.SetArgs(args)
		started(p.StartReady(ctx))
	}()
	return done
}

// readProcStat reads /proc/PID/stat; false when pid is gone or the line
// is not understood.
func readProcStat(pid int) (procStat, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, false
	}
	st, err := parseProcStat(string(b))
	return st, err == nil
}

// TreeCPU returns the CPU seconds of pid, its reaped children and its live
// direct children (with their reaped children).
func TreeCPU(pid int) float64 {
	root, ok := readProcStat(pid)
	if !ok {
		return 0
	}
	total := root.self + root.child
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		cpid, err := strconv.Atoi(e.Name())
		if err != nil || cpid == pid {
			continue
		}
		if st, ok := readProcStat(cpid); ok && st.ppid == pid {
			total += st.self + st.child
		}
	}
	return total
}

// redactArgs returns args with the password of every URL argument
// (--database-url's, or an environment entry's such as REDIS_URL=URL) as
// "xxxxx" (redisclient.Redact), so that a log the lab keeps (--keep-logs)
// holds no service's password.
func redactArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = redisclient.Redact(a)
	}
	return out
}
