package pool

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/acpgate/acpgate/internal/logx"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
)

// State is where a process is in its life.
type State uint32

// The states of a process, in the only order it goes through them.
const (
	Starting State = iota
	Ready
	Stopping
	Dead
)

func (s State) String() string {
	return [...]string{"starting", "ready", "stopping", "dead"}[s]
}

// ErrAgentExited is wrapped by errors about messages an agent process
// dropped by exiting.
var ErrAgentExited = errors.New("agent exited")

// Process is one agent subprocess: its command, pipes, write queues, state
// and initialize answer. It knows nothing of what crosses it: its Handler
// does. All methods may be called concurrently.
type Process struct {
	// Static after construction.
	pool   *Pool
	id     int64
	writeQ chan []byte   // client messages, relayed with backpressure
	exited chan struct{} // closed when the process is reaped (or its start failed), before Handler.Exited
	stopCh chan struct{} // closed by Stop: the writer closes stdin

	// Set by bringUp under the pool's lock before the process starts,
	// read-only afterwards. Until then its only reader is the maintainer,
	// which skips a nil handler.
	handler Handler

	// log names the process; spawn adds its agent_pid once, so it is read
	// with Log.
	log atomic.Pointer[slog.Logger]

	// ctrl holds the gateway's own messages to the agent (answers in a
	// client's place, refusals, cancels, closes): never blocking, so the
	// agent's reader goroutine can always go on reading; the writer drains
	// it first. An agent that lets it fill up has stopped reading stdin.
	ctrlMu    sync.Mutex
	ctrl      [][]byte
	ctrlBytes int
	ctrlWake  chan struct{}

	state      atomic.Uint32 // State; changed by CAS only
	retiring   atomic.Bool   // past a recycling limit: no new sessions
	initFailed atomic.Bool
	signalled  atomic.Bool  // signalStop ran
	requests   atomic.Int64 // request leases held (Lease kindRequest)
	nextID     atomic.Int64 // agent-side request ids

	// Set before the state becomes Ready, read-only afterwards.
	init    Init
	readyAt time.Time
	initID  int64       // the id of the pool's initialize
	initCh  chan []byte // gets its raw answer; closed if the process exits first

	// Guarded by the pool's lock: what the pool chooses by.
	prof     Profile // a fresh process of no tenant is assigned to the first tenant that uses it
	claimed  bool
	sessions int       // committed session leases
	reserved int       // session leases not yet committed
	homes    int       // home leases: connections whose session-less requests go here
	served   int       // sessions committed, ever (recycling)
	idleAt   time.Time // when the maintainer first found it idle; zero while in use

	// Guarded by mu.
	mu         sync.Mutex
	cmd        *exec.Cmd
	stdin      *os.File
	stdout     *os.File
	stderr     *os.File
	exitErr    error
	stderrTail []string // last lines of stderr, for crash reports
	// launchExited is the launch's Exited (set before the process runs).
	launchExited func() string
}

func (a *Process) String() string { return "agent#" + strconv.FormatInt(a.id, 10) }

// ID is the process's number within its pool.
func (a *Process) ID() int64 { return a.id }

// Log is the process's logger.
func (a *Process) Log() *slog.Logger { return a.log.Load() }

// State returns where the process is in its life.
func (a *Process) State() State { return State(a.state.Load()) }

// Alive reports whether the process is ready.
func (a *Process) Alive() bool { return a.State() == Ready }

// Retiring reports whether the process takes no new sessions.
func (a *Process) Retiring() bool { return a.retiring.Load() }

// Handler is the process's handler (Config.NewHandler); it is set before
// the process starts, so a process a Lease holds has it.
func (a *Process) Handler() Handler { return a.handler }

// Init is the agent's answer to the pool's initialize (zero before Ready).
func (a *Process) Init() Init { return a.init }

// Exited is closed once the process has been reaped.
func (a *Process) Exited() <-chan struct{} { return a.exited }

// ExitErr says why the process exited (nil while it runs).
func (a *Process) ExitErr() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.exitErr
}

// NextID returns a fresh agent-side request id.
func (a *Process) NextID() int64 { return a.nextID.Add(1) }

// Profile returns what the process was told.
func (a *Process) Profile() Profile {
	a.pool.mu.Lock()
	defer a.pool.mu.Unlock()
	return a.prof
}

// MaxMessageBytes is the pool's stdio line limit.
func (a *Process) MaxMessageBytes() int { return a.pool.cfg.MaxMessageBytes }

// Go runs f on a goroutine the pool owns (Close waits for it).
func (a *Process) Go(f func()) {
	a.pool.wg.Add(1)
	go func() { defer a.pool.wg.Done(); f() }()
}

// start spawns the process and its I/O goroutines, which the pool's wait
// group owns. They end when the process exits.
func (a *Process) start(cfg *Config, tenant string) error {
	ac := &cfg.Agent
	if len(ac.Command) == 0 {
		return errors.New("no agent command configured")
	}
	launch, err := a.launch(ac, tenant)
	if err != nil {
		return err
	}
	a.launchExited = launch.Exited
	cmd, err := a.spawn(ac, launch)
	if err != nil {
		if launch.Exited != nil {
			launch.Exited()
		}
		return err
	}
	if launch.Sandbox != "" {
		a.Log().Info("agent started", "argv0", ac.Command[0], "tenant", tenant, "sandbox", launch.Sandbox)
	} else {
		a.Log().Info("agent started", "argv0", ac.Command[0])
	}
	readerDone := make(chan struct{})
	a.Go(a.writeLoop)
	a.Go(func() { defer close(readerDone); a.readLoop(cfg.MaxMessageBytes) })
	a.Go(a.stderrLoop)
	a.Go(func() { a.waitLoop(cmd, readerDone) })
	return nil
}

// launch decides the environment and directory of the process.
func (a *Process) launch(ac *AgentConfig, tenant string) (Launch, error) {
	if ac.Launch == nil {
		return Launch{Dir: ac.Dir, Env: AppendEnv(os.Environ(), ac.Env)}, nil
	}
	launch, err := ac.Launch(tenant)
	if err != nil {
		return Launch{}, fmt.Errorf("spawn agent %q: %w", ac.Command[0], err)
	}
	return launch, nil
}

// spawn starts the command in a process group of its own, with pipes for
// its standard streams.
func (a *Process) spawn(ac *AgentConfig, launch Launch) (*exec.Cmd, error) {
	argv := append(append([]string(nil), ac.Supervisor...), ac.Command...)
	var files [6]*os.File // stdin r/w, stdout r/w, stderr r/w
	closeAll := func() {
		for _, f := range files {
			if f != nil {
				f.Close()
			}
		}
	}
	for i, name := range []string{"stdin", "stdout", "stderr"} {
		r, w, err := os.Pipe()
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("spawn agent %q: %s pipe: %w", ac.Command[0], name, err)
		}
		files[2*i], files[2*i+1] = r, w
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = launch.Dir
	cmd.Env = launch.Env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = files[0], files[3], files[5]
	deathSig := syscall.SIGKILL
	if len(ac.Supervisor) > 0 {
		deathSig = syscall.SIGTERM // the supervisor cleans up its group, then exits
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: deathSig}
	err := cmd.Start()
	// The child has its copies; the gateway keeps only its own ends.
	files[0].Close()
	files[3].Close()
	files[5].Close()
	if err != nil {
		files[1].Close()
		files[2].Close()
		files[4].Close()
		return nil, fmt.Errorf("spawn agent %q: %w", ac.Command[0], err)
	}
	a.mu.Lock() // Stop and Kill may read cmd from another goroutine
	a.cmd, a.stdin, a.stdout, a.stderr = cmd, files[1], files[2], files[4]
	a.mu.Unlock()
	a.log.Store(a.Log().With("agent_pid", cmd.Process.Pid))
	if a.State() == Stopping { // stopped while it started
		a.signalStop(cmd)
	}
	return cmd, nil
}

// Send queues one framed message (ending in '\n') for the agent's stdin,
// waiting while the queue is full (backpressure) until ctx ends.
func (a *Process) Send(ctx context.Context, msg []byte) error {
	select {
	case <-a.exited:
		return fmt.Errorf("%s: %w", a, ErrAgentExited)
	default:
	}
	select {
	case a.writeQ <- msg:
		return nil
	case <-a.exited:
		return fmt.Errorf("%s: %w", a, ErrAgentExited)
	case <-ctx.Done():
		return fmt.Errorf("%s is not reading its input: %w", a, ctx.Err())
	}
}

// maxCtrlBytes bounds the gateway's own messages waiting for an agent.
const maxCtrlBytes = 4 << 20

// SendCtrl queues one of the gateway's own framed messages without ever
// blocking. If the agent has let maxCtrlBytes pile up, it is stopped.
func (a *Process) SendCtrl(msg []byte) {
	select {
	case <-a.exited:
		return
	default:
	}
	a.ctrlMu.Lock()
	if a.ctrlBytes+len(msg) > maxCtrlBytes {
		a.ctrlMu.Unlock()
		a.Log().Error("agent is not reading its input; stopping it", "queued_bytes", a.ctrlBytes)
		a.Stop()
		return
	}
	a.ctrl = append(a.ctrl, msg)
	a.ctrlBytes += len(msg)
	a.ctrlMu.Unlock()
	select {
	case a.ctrlWake <- struct{}{}:
	default:
	}
}

// Notify sends a notification of the gateway's own (SendCtrl).
func (a *Process) Notify(method string, params []byte) {
	a.SendCtrl(append(jsonrpc.AppendRequest(nil, nil, method, params), '\n'))
}

// takeCtrl removes and returns the queued control messages.
func (a *Process) takeCtrl() [][]byte {
	a.ctrlMu.Lock()
	defer a.ctrlMu.Unlock()
	out := a.ctrl
	a.ctrl, a.ctrlBytes = nil, 0
	return out
}

// writeLoop writes the queues to stdin: the gateway's own messages first,
// flushing when the client queue is empty. It owns stdin.
func (a *Process) writeLoop() {
	w := bufio.NewWriterSize(a.stdin, 64<<10)
	defer a.stdin.Close()
	for {
		var msg []byte
		select {
		case msg = <-a.writeQ:
		case <-a.ctrlWake:
		case <-a.stopCh:
			for _, c := range a.takeCtrl() {
				_, _ = w.Write(c)
			}
			_ = w.Flush()
			a.stdin.Close() // EOF, for agents that stop on it
			a.drainWrites()
			return
		case <-a.exited:
			return
		}
		if err := a.write(w, msg); err != nil {
			a.Log().Debug("agent stdin closed", "err", err)
			a.drainWrites()
			return
		}
	}
}

// write writes the control messages, then msg (nil: none), and flushes
// when nothing more is queued.
func (a *Process) write(w *bufio.Writer, msg []byte) error {
	for _, c := range a.takeCtrl() {
		if _, err := w.Write(c); err != nil {
			return err
		}
	}
	if msg != nil {
		if _, err := w.Write(msg); err != nil {
			return err
		}
	}
	if msg == nil || len(a.writeQ) == 0 {
		return w.Flush()
	}
	return nil
}

// drainWrites discards writes after stdin broke, until the process is gone,
// so that senders never block on a dead agent.
func (a *Process) drainWrites() {
	for {
		select {
		case <-a.writeQ:
		case <-a.exited:
			return
		}
	}
}

// readLoop reads the agent's lines: until the pool's initialize is
// answered it looks for that answer; everything else goes to the handler.
func (a *Process) readLoop(maxBytes int) {
	lr := jsonrpc.NewLineReader(a.stdout, maxBytes)
	initDone := false
	for {
		line, err := lr.Next()
		if err != nil {
			var tooLong *jsonrpc.LineTooLongError
			if errors.As(err, &tooLong) {
				a.pool.cfg.Metrics.LineTooLong.Inc()
				a.Log().Warn("agent sent a line over the message limit; skipped", "bytes", tooLong.Size, "limit", tooLong.Limit)
				continue
			}
			if err != io.EOF && !errors.Is(err, os.ErrClosed) {
				a.Log().Debug("agent stdout", "err", err)
			}
			return
		}
		if !initDone && a.isInitAnswer(line) {
			initDone = true
			a.initCh <- append([]byte(nil), line...)
			continue
		}
		a.handler.Line(line)
	}
}

// isInitAnswer reports whether line answers the pool's initialize.
func (a *Process) isInitAnswer(line []byte) bool {
	var env struct {
		ID     json.RawMessage `json:"id"`
		Method *string         `json:"method"`
	}
	if json.Unmarshal(line, &env) != nil || env.Method != nil {
		return false
	}
	id, err := strconv.ParseInt(string(env.ID), 10, 64)
	return err == nil && id == a.initID
}

// call sends the pool's initialize and waits for the raw answer.
func (a *Process) call(ctx context.Context, method string, params []byte) ([]byte, error) {
	msg := jsonrpc.AppendRequest(nil, strconv.AppendInt(nil, a.initID, 10), method, params)
	if err := a.Send(ctx, append(msg, '\n')); err != nil {
		return nil, err
	}
	select {
	case resp := <-a.initCh:
		return resp, nil
	case <-a.exited:
		return nil, fmt.Errorf("%s %s: %w (%v)", a, method, ErrAgentExited, a.ExitErr())
	case <-ctx.Done():
		return nil, fmt.Errorf("%s %s: %w", a, method, ctx.Err())
	}
}

const stderrTailLines = 20

// stderrLoop keeps the last lines of stderr for crash reports and logs
// them at debug level (agents may echo prompts there).
func (a *Process) stderrLoop() {
	defer a.stderr.Close()
	lr := jsonrpc.NewLineReader(a.stderr, 64<<10)
	lim := logx.NewLimiter(20, time.Second)
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
		if redact := a.pool.cfg.Redact; redact != nil {
			text = redact(text)
		}
		a.mu.Lock()
		if len(a.stderrTail) == stderrTailLines {
			copy(a.stderrTail, a.stderrTail[1:])
			a.stderrTail = a.stderrTail[:stderrTailLines-1]
		}
		a.stderrTail = append(a.stderrTail, logx.Truncate(text, 512))
		a.mu.Unlock()
		if lim.Allow() {
			a.Log().Debug("agent stderr", "line", logx.Truncate(text, 2048))
		}
	}
}

// waitLoop reaps the process, lets the reader finish what the agent wrote,
// then tells the handler, which fails everything still routed through it.
func (a *Process) waitLoop(cmd *exec.Cmd, readerDone <-chan struct{}) {
	err := cmd.Wait()
	t := time.NewTimer(2 * time.Second)
	select {
	case <-readerDone:
	case <-t.C:
		// A descendant still holds stdout open; stop reading.
		a.stdout.Close()
		<-readerDone
	}
	t.Stop()
	a.stdout.Close()
	exitErr := exitReason(err)
	if a.launchExited != nil {
		if why := a.launchExited(); why != "" {
			exitErr = fmt.Errorf("%w: %s", exitErr, why)
		}
	}
	wasStopping := a.State() == Stopping
	a.state.Store(uint32(Dead))
	a.mu.Lock()
	a.exitErr = exitErr
	tail := strings.Join(a.stderrTail, "\n")
	a.mu.Unlock()
	a.pool.cfg.Metrics.Exits.WithLabelValues(exitLabel(wasStopping, a.initFailed.Load(), err)).Inc()
	if wasStopping {
		a.Log().Info("agent stopped", "exit", exitErr)
	} else {
		a.Log().Warn("agent exited", "exit", exitErr, "stderr_tail", tail)
	}
	close(a.exited)
	a.handler.Exited(exitErr)
	a.pool.removed(a)
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

// Stop asks the whole process group to exit and escalates to SIGKILL after
// the pool's stop grace. It does not wait; repeating it does nothing.
func (a *Process) Stop() {
	if !a.state.CompareAndSwap(uint32(Starting), uint32(Stopping)) && !a.state.CompareAndSwap(uint32(Ready), uint32(Stopping)) {
		return
	}
	close(a.stopCh)
	a.mu.Lock()
	cmd := a.cmd
	a.mu.Unlock()
	if cmd != nil { // else start signals it once it has started
		a.signalStop(cmd)
	}
}

// signalStop sends SIGTERM to the process group, and SIGKILL after the
// grace period unless it has exited by then. Once only.
func (a *Process) signalStop(cmd *exec.Cmd) {
	if !a.signalled.CompareAndSwap(false, true) {
		return
	}
	pgid := cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	grace := a.pool.cfg.Agent.StopGrace
	if len(a.pool.cfg.Agent.Supervisor) > 0 {
		// The supervisor escalates after the same grace period and also
		// reaches descendants outside the group; give it time to.
		grace += 2 * time.Second
	}
	a.Go(func() {
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-a.exited:
		case <-t.C:
			a.Log().Warn("agent ignored SIGTERM; killing its process group", "grace", grace)
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		}
	})
}

// kill sends SIGKILL to the process group at once.
func (a *Process) kill() {
	a.mu.Lock()
	cmd := a.cmd
	a.mu.Unlock()
	if cmd != nil && cmd.Process != nil && a.State() != Dead { // a reaped group's id may be reused
		_ = killGroup(cmd.Process.Pid)
	}
}
