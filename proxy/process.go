package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/acpgate/acpgate/proxy/jsonrpc"
)

// AgentConfig says how to start an agent process.
type AgentConfig struct {
	Command []string          // argv; no shell
	Env     map[string]string // added to the gateway's environment
	Dir     string            // working directory ("" = the gateway's)
	// Supervisor, if set, is an argv prefix that runs Command under a
	// supervisor (acpgate's own "supervise" subcommand): it makes sure no
	// descendant of the agent outlives the gateway, even when the gateway
	// is killed with SIGKILL.
	Supervisor []string
	// StopGrace is how long an agent gets after SIGTERM before SIGKILL.
	StopGrace time.Duration
	// InitTimeout bounds the agent's answer to initialize.
	InitTimeout time.Duration
	// Launch, if set, decides how each process of a tenant ("" for a
	// process of no tenant) starts: the sandbox. Without it a process
	// gets the gateway's environment plus Env, in Dir.
	Launch func(tenant string) (Launch, error)
}

// AppendEnv appends vars to env as "K=V", sorted by name, so that a
// process's environment does not depend on map order.
func AppendEnv(env []string, vars map[string]string) []string {
	for _, k := range slices.Sorted(maps.Keys(vars)) {
		env = append(env, k+"="+vars[k])
	}
	return env
}

// Launch is how one agent process starts.
type Launch struct {
	Env []string // the whole environment, "K=V"
	Dir string   // working directory
	// Sandbox says how the process is confined, for the log ("" = not).
	Sandbox string
	// Exited, if set, is called once the process is reaped (and on a
	// failed start); what it returns explains the exit in the log (a
	// limit that killed it), or is "".
	Exited func() string
}

type procState uint8

const (
	procStarting procState = iota
	procReady
	procStopping
	procDead
)

func (s procState) String() string {
	return [...]string{"starting", "ready", "stopping", "dead"}[s]
}

// ErrAgentExited is wrapped by errors about requests an agent process
// dropped by exiting.
var ErrAgentExited = errors.New("agent exited")

// agentProc is one agent subprocess and the routing state of the messages
// that cross it.
type agentProc struct {
	pool *Pool
	id   int64
	// prof and claimed are guarded by the pool's lock: a fresh process of
	// no tenant is assigned to the first tenant that uses it.
	prof       Profile
	claimed    bool
	initFailed atomic.Bool
	log        *slog.Logger

	cmd    *exec.Cmd
	stdin  *os.File
	stdout *os.File
	stderr *os.File
	writeQ chan []byte // client messages, relayed with backpressure
	// ctrl holds the gateway's own messages to the agent (answers in a
	// client's place, refusals, cancels, closes): never blocking, so the
	// agent's reader goroutine can always go on reading; the writer drains
	// it first. An agent that lets it fill up has stopped reading stdin.
	ctrlMu    sync.Mutex
	ctrl      [][]byte
	ctrlBytes int
	ctrlWake  chan struct{}
	fsSlots   chan struct{} // file requests the gateway serves in the client's place, in flight
	exited    chan struct{} // closed when the process is reaped and its routes failed
	stopCh    chan struct{} // closed by stop: the writer closes stdin

	// Set before the state becomes ready, read-only afterwards.
	init    agentInit
	initErr error

	mu         sync.Mutex
	state      procState
	exitErr    error
	nextID     int64
	pending    map[int64]*outReq   // client→agent requests in flight, by agent-side id
	answering  int                 // prompt answers taken from pending, not yet delivered to their client
	inbound    map[string]*inReq   // agent→client requests in flight, by the agent's raw id
	sessions   map[string]*Session // live sessions by the agent's own session ID
	reserved   int                 // session slots promised to session/new, load, resume in flight
	conns      int                 // client connections using this process as their home
	served     int                 // sessions it has been given, ever (recycling)
	retiring   bool                // past a recycling limit: no new sessions
	readyAt    time.Time           // when it became ready
	idleAt     time.Time           // when maintain first found it idle; zero while in use (pool.mu, a.mu)
	stderrTail []string            // last lines of stderr, for crash reports
	// launchExited is the launch's Exited (set before the process runs).
	launchExited func() string
}

// Session is one ACP session as the gateway routes it.
type Session struct {
	promptStart atomic.Int64 // unix nanos of the running prompt until its first update
	GatewayID   string       // what the client sees
	quotedID    []byte       // GatewayID as a JSON string, spliced into every update
	AgentID     string       // the agent's own ID
	cwd         string       // its cwd as the client asked for it (the fs stand-in's root without a tenant root)
	proc        *agentProc
	owner       *Conn // guarded by proc.mu; nil once detached
	lost        bool  // guarded by proc.mu: the agent process died
	// endedDetached and stopReason (guarded by proc.mu): a turn ended while
	// its owner had no socket, and how; a take-over reports it.
	endedDetached bool
	stopReason    string
}

// outReq is a client→agent request waiting for the agent's answer.
type outReq struct {
	conn     *Conn  // nil for the gateway's own requests
	clientID []byte // the client's raw id
	agentID  int64
	p        *agentProc // the process the request went to
	method   string
	sess     *Session // the session the request is about, if any
	// attach is the session a load/resume makes the connection's. It is
	// routed from the moment the request is sent, because the agent replays
	// history before it answers; an error answer undoes it.
	attach   *Session
	cwd      string      // session/new and the like: the cwd the client asked for
	reserved bool        // holds a session slot on the process until answered
	quota    atomic.Bool // holds a tenant session slot until answered
	start    time.Time
	internal chan<- []byte // gateway's own request: gets the raw response
}

// inReq is an agent→client request waiting for the client's answer.
type inReq struct {
	proc    *agentProc
	agentID []byte // the agent's raw id
	method  string
	start   time.Time
	sess    *Session // the session it is about, if any
	msg     []byte   // as the client was sent it (a take-over sends it again)
	// conn and connID (the id the client sees) are guarded by proc.mu: a
	// take-over moves the request to another connection. pendingTo (also
	// proc.mu) is where a take-over that came before msg was set moved it.
	conn      *Conn
	connID    int64
	pendingTo *Conn
	// answered is set by whoever answers the agent first: the client, or
	// the gateway in its place (disconnect, client_request timeout).
	answered atomic.Bool
}

// claim reports whether the caller is the one to answer in: true once.
func (in *inReq) claim() bool { return in.answered.CompareAndSwap(false, true) }

func (p *agentProc) String() string { return "agent#" + strconv.FormatInt(p.id, 10) }

// start spawns the process and its I/O goroutines, which the pool's wait
// group owns. They end when the process exits.
func (p *agentProc) start(cfg *PoolConfig, tenant string) error {
	ac := &cfg.Agent
	argv := append(append([]string(nil), ac.Supervisor...), ac.Command...)
	if len(ac.Command) == 0 {
		return errors.New("no agent command configured")
	}
	launch := Launch{Dir: ac.Dir}
	if ac.Launch != nil {
		var err error
		if launch, err = ac.Launch(tenant); err != nil {
			return fmt.Errorf("spawn agent %q: %w", ac.Command[0], err)
		}
	} else {
		launch.Env = AppendEnv(os.Environ(), ac.Env)
	}
	p.launchExited = launch.Exited
	started := false
	defer func() {
		if !started && launch.Exited != nil {
			launch.Exited()
		}
	}()
	inR, inW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("spawn agent %q: stdin pipe: %w", ac.Command[0], err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return fmt.Errorf("spawn agent %q: stdout pipe: %w", ac.Command[0], err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		outR.Close()
		outW.Close()
		return fmt.Errorf("spawn agent %q: stderr pipe: %w", ac.Command[0], err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = launch.Dir
	cmd.Env = launch.Env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, errW
	deathSig := syscall.SIGKILL
	if len(ac.Supervisor) > 0 {
		deathSig = syscall.SIGTERM // the supervisor cleans up its group, then exits
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: deathSig}
	err = cmd.Start()
	// The child has its copies; the gateway keeps only its own ends.
	inR.Close()
	outW.Close()
	errW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		errR.Close()
		return fmt.Errorf("spawn agent %q: %w", ac.Command[0], err)
	}
	started = true
	p.mu.Lock() // stop and kill may read cmd from another goroutine
	p.cmd, p.stdin, p.stdout, p.stderr = cmd, inW, outR, errR
	p.log = p.log.With("agent_pid", cmd.Process.Pid)
	p.mu.Unlock()
	if launch.Sandbox != "" {
		p.log.Info("agent started", "argv0", ac.Command[0], "tenant", tenant, "sandbox", launch.Sandbox)
	} else {
		p.log.Info("agent started", "argv0", ac.Command[0])
	}

	readerDone := make(chan struct{})
	p.pool.wg.Add(4)
	go func() { defer p.pool.wg.Done(); p.writeLoop() }()
	go func() { defer p.pool.wg.Done(); defer close(readerDone); p.readLoop(cfg.MaxMessageBytes) }()
	go func() { defer p.pool.wg.Done(); p.stderrLoop() }()
	go func() { defer p.pool.wg.Done(); p.waitLoop(readerDone) }()
	return nil
}

// send queues one framed client message (ending in '\n') for the agent's
// stdin, waiting while the queue is full (backpressure) until ctx ends.
func (p *agentProc) send(ctx context.Context, msg []byte) error {
	select {
	case <-p.exited:
		return fmt.Errorf("%s: %w", p, ErrAgentExited)
	default:
	}
	select {
	case p.writeQ <- msg:
		return nil
	case <-p.exited:
		return fmt.Errorf("%s: %w", p, ErrAgentExited)
	case <-ctx.Done():
		return fmt.Errorf("%s is not reading its input: %w", p, ctx.Err())
	}
}

// maxCtrlBytes bounds the gateway's own messages waiting for an agent.
const maxCtrlBytes = 4 << 20

// sendCtrl queues one of the gateway's own framed messages without ever
// blocking. If the agent has let maxCtrlBytes pile up, it is stopped.
func (p *agentProc) sendCtrl(msg []byte) {
	select {
	case <-p.exited:
		return
	default:
	}
	p.ctrlMu.Lock()
	if p.ctrlBytes+len(msg) > maxCtrlBytes {
		p.ctrlMu.Unlock()
		p.log.Error("agent is not reading its input; stopping it", "queued_bytes", p.ctrlBytes)
		p.stop(p.pool.cfg.Agent.StopGrace)
		return
	}
	p.ctrl = append(p.ctrl, msg)
	p.ctrlBytes += len(msg)
	p.ctrlMu.Unlock()
	select {
	case p.ctrlWake <- struct{}{}:
	default:
	}
}

// takeCtrl removes and returns the queued control messages.
func (p *agentProc) takeCtrl() [][]byte {
	p.ctrlMu.Lock()
	defer p.ctrlMu.Unlock()
	out := p.ctrl
	p.ctrl, p.ctrlBytes = nil, 0
	return out
}

func (p *agentProc) writeLoop() {
	w := bufio.NewWriterSize(p.stdin, 64<<10)
	defer p.stdin.Close()
	for {
		var msg []byte
		select {
		case msg = <-p.writeQ:
		case <-p.ctrlWake:
		case <-p.stopCh:
			for _, c := range p.takeCtrl() {
				_, _ = w.Write(c)
			}
			_ = w.Flush()
			p.stdin.Close() // EOF, for agents that stop on it
			p.drainWrites()
			return
		case <-p.exited:
			return
		}
		// The gateway's own messages go first.
		for _, c := range p.takeCtrl() {
			if _, err := w.Write(c); err != nil {
				p.log.Debug("agent stdin closed", "err", err)
				p.drainWrites()
				return
			}
		}
		if msg == nil {
			if err := w.Flush(); err != nil {
				p.drainWrites()
				return
			}
			continue
		}
		if _, err := w.Write(msg); err != nil {
			p.log.Debug("agent stdin closed", "err", err)
			p.drainWrites()
			return
		}
		if len(p.writeQ) == 0 {
			if err := w.Flush(); err != nil {
				p.log.Debug("agent stdin closed", "err", err)
				p.drainWrites()
				return
			}
		}
	}
}

// drainWrites discards writes after stdin broke, until the process is gone,
// so that senders never block on a dead agent.
func (p *agentProc) drainWrites() {
	for {
		select {
		case <-p.writeQ:
		case <-p.exited:
			return
		}
	}
}

func (p *agentProc) readLoop(maxBytes int) {
	lr := jsonrpc.NewLineReader(p.stdout, maxBytes)
	r := newAgentReader(p)
	for {
		line, err := lr.Next()
		if err != nil {
			var tooLong *jsonrpc.LineTooLongError
			if errors.As(err, &tooLong) {
				p.pool.cfg.metrics.AgentProtocolErrors.WithLabelValues("line_too_long").Inc()
				p.log.Warn("agent sent a line over the message limit; skipped", "bytes", tooLong.Size, "limit", tooLong.Limit)
				continue
			}
			if err != io.EOF && !errors.Is(err, os.ErrClosed) {
				p.log.Debug("agent stdout", "err", err)
			}
			return
		}
		r.handle(line)
	}
}

const stderrTailLines = 20

func (p *agentProc) stderrLoop() {
	defer p.stderr.Close()
	lr := jsonrpc.NewLineReader(p.stderr, 64<<10)
	lim := newLogLimiter(20, time.Second)
	for {
		line, err := lr.Next()
		if err != nil {
			var tooLong *jsonrpc.LineTooLongError
			if errors.As(err, &tooLong) {
				continue
			}
			return
		}
		text := string(line)
		p.mu.Lock()
		if len(p.stderrTail) == stderrTailLines {
			copy(p.stderrTail, p.stderrTail[1:])
			p.stderrTail = p.stderrTail[:stderrTailLines-1]
		}
		p.stderrTail = append(p.stderrTail, truncate(text, 512))
		p.mu.Unlock()
		// Agents may echo prompts on stderr: debug level only.
		if lim.allow() {
			p.log.Debug("agent stderr", "line", truncate(text, 2048))
		}
	}
}

// waitLoop reaps the process, lets the reader finish what the agent wrote,
// then fails everything still routed through the process.
func (p *agentProc) waitLoop(readerDone <-chan struct{}) {
	err := p.cmd.Wait()
	select {
	case <-readerDone:
	case <-time.After(2 * time.Second):
		// A descendant still holds stdout open; stop reading.
		p.stdout.Close()
		<-readerDone
	}
	p.stdout.Close()
	exitErr := exitReason(err)
	if p.launchExited != nil {
		if why := p.launchExited(); why != "" {
			exitErr = fmt.Errorf("%w: %s", exitErr, why)
		}
	}
	p.mu.Lock()
	wasStopping := p.state == procStopping
	p.state = procDead
	p.exitErr = exitErr
	tail := strings.Join(p.stderrTail, "\n")
	p.mu.Unlock()
	p.pool.cfg.metrics.Exits.WithLabelValues(exitLabel(wasStopping, p.initFailed.Load(), err)).Inc()
	if wasStopping {
		p.log.Info("agent stopped", "exit", p.exitErr)
	} else {
		p.log.Warn("agent exited", "exit", p.exitErr, "stderr_tail", tail)
	}
	close(p.exited)
	p.failRoutes()
	p.pool.removed(p)
}

// exitLabel is the metrics reason of an agent exit.
func exitLabel(stopped, initFailed bool, err error) string {
	var ee *exec.ExitError
	switch {
	case initFailed:
		return "init_failed"
	case stopped:
		return "stopped"
	case err == nil:
		return "exited"
	case errors.As(err, &ee) && !ee.Exited():
		return "killed"
	}
	return "failed"
}

func exitReason(err error) error {
	if err == nil {
		return errors.New("exit status 0")
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return fmt.Errorf("killed by signal %s", ws.Signal())
		}
		return fmt.Errorf("exit status %d", ee.ExitCode())
	}
	return err
}

// stop asks the whole process group to exit and escalates to SIGKILL after
// the grace period. It does not wait.
func (p *agentProc) stop(grace time.Duration) {
	p.mu.Lock()
	if p.state == procStopping || p.state == procDead || p.cmd == nil {
		p.mu.Unlock()
		return
	}
	p.state = procStopping
	pgid := p.cmd.Process.Pid
	p.mu.Unlock()
	close(p.stopCh)
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	if len(p.pool.cfg.Agent.Supervisor) > 0 {
		// The supervisor escalates after the same grace period and also
		// reaches descendants outside the group; give it time to.
		grace += 2 * time.Second
	}
	p.pool.wg.Add(1)
	go func() {
		defer p.pool.wg.Done()
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-p.exited:
		case <-t.C:
			p.log.Warn("agent ignored SIGTERM; killing its process group", "grace", grace)
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		}
	}()
}

// failRoutes answers every request still in flight through a dead process
// and marks its sessions lost.
func (p *agentProc) failRoutes() {
	p.mu.Lock()
	pending := p.pending
	p.pending = map[int64]*outReq{}
	inbound := p.inbound
	p.inbound = map[string]*inReq{}
	sessions := p.sessions
	p.sessions = map[string]*Session{}
	for _, s := range sessions {
		s.lost = true
		if s.owner != nil {
			s.owner.ten.event(s.owner.ag.metrics, "lost")
		}
	}
	p.reserved = 0
	reason := p.exitErr
	p.mu.Unlock()

	msg := fmt.Sprintf("the agent process exited (%v) before answering", reason)
	for _, r := range pending {
		if r.internal != nil {
			close(r.internal)
			continue
		}
		if r.conn != nil {
			r.conn.forgetClientReq(r)
			r.conn.deliver(jsonrpc.AppendError(nil, r.clientID, jsonrpc.CodeInternalError, msg, nil))
		}
	}
	type route struct {
		c  *Conn
		id int64
	}
	p.mu.Lock() // a take-over may be moving them
	routes := make([]route, 0, len(inbound))
	for _, r := range inbound {
		routes = append(routes, route{r.conn, r.connID})
	}
	p.mu.Unlock()
	for _, r := range routes {
		r.c.forgetAgentReq(r.id)
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// logLimiter allows n events per period.
type logLimiter struct {
	n      int
	period time.Duration
	start  time.Time
	count  int
}

func newLogLimiter(n int, period time.Duration) *logLimiter {
	return &logLimiter{n: n, period: period}
}

func (l *logLimiter) allow() bool {
	now := time.Now()
	if now.Sub(l.start) > l.period {
		l.start, l.count = now, 0
	}
	l.count++
	return l.count <= l.n
}

// call sends a request of the gateway's own and waits for the raw response.
func (p *agentProc) call(ctx context.Context, method string, params []byte) ([]byte, error) {
	ch := make(chan []byte, 1)
	p.mu.Lock()
	if p.state == procDead {
		p.mu.Unlock()
		return nil, fmt.Errorf("%s: %w", p, ErrAgentExited)
	}
	p.nextID++
	id := p.nextID
	p.pending[id] = &outReq{agentID: id, method: method, internal: ch, start: time.Now()}
	p.mu.Unlock()
	msg := jsonrpc.AppendRequest(nil, strconv.AppendInt(nil, id, 10), method, params)
	if err := p.send(ctx, append(msg, '\n')); err != nil {
		return nil, err
	}
	select {
	case resp, ok := <-ch:
		if !ok {
			p.mu.Lock()
			reason := p.exitErr
			p.mu.Unlock()
			return nil, fmt.Errorf("%s %s: %w (%v)", p, method, ErrAgentExited, reason)
		}
		return resp, nil
	case <-ctx.Done():
		p.mu.Lock()
		delete(p.pending, id)
		p.mu.Unlock()
		return nil, fmt.Errorf("%s %s: %w", p, method, ctx.Err())
	}
}

// notify sends a notification of the gateway's own.
func (p *agentProc) notify(method string, params []byte) {
	p.sendCtrl(append(jsonrpc.AppendRequest(nil, nil, method, params), '\n'))
}
