// Package config reads and validates acpgate's YAML configuration.
//
// Unknown keys are errors. Load returns every problem it finds, each with
// its line and column, so that `acpgate check-config` can list them all.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Config is the whole configuration file.
type Config struct {
	Listen string `yaml:"listen"`
	// AllowUnauthenticated permits serving without authentication on a
	// non-loopback address. Without it the gateway refuses to start there.
	AllowUnauthenticated bool `yaml:"allow_unauthenticated"`
	// ShutdownGrace bounds how long a drain lets running prompts finish.
	ShutdownGrace Duration `yaml:"shutdown_grace"`

	Agent     Agent     `yaml:"agent"`
	Pool      Pool      `yaml:"pool"`
	Limits    Limits    `yaml:"limits"`
	WebSocket WebSocket `yaml:"websocket"`
	Log       Log       `yaml:"log"`
}

// Agent says how to run the agent.
type Agent struct {
	// Command is the agent's argv (no shell). Empty = the built-in demo agent.
	Command []string          `yaml:"command"`
	Env     map[string]string `yaml:"env"`
	Dir     string            `yaml:"dir"`
	// StopGrace is how long an agent gets after SIGTERM before SIGKILL.
	StopGrace Duration `yaml:"stop_grace"`
	// InitTimeout bounds the agent's answer to initialize.
	InitTimeout Duration `yaml:"init_timeout"`
}

// Pool sizes the agent pool.
type Pool struct {
	MinIdle               int      `yaml:"min_idle"`
	MaxProcesses          int      `yaml:"max_processes"`
	MaxSessionsPerProcess int      `yaml:"max_sessions_per_process"`
	AcquireTimeout        Duration `yaml:"acquire_timeout"`
	IdleTimeout           Duration `yaml:"idle_timeout"`
}

// Limits bound what one message and one connection may take.
type Limits struct {
	// MaxMessageBytes caps a WebSocket message and an agent's stdio line.
	MaxMessageBytes int `yaml:"max_message_bytes"`
	// SendQueueMessages and SendQueueBytes bound what the gateway holds for
	// a client that reads slower than its agent writes; past either, the
	// connection is closed (1008).
	SendQueueMessages int `yaml:"send_queue_messages"`
	SendQueueBytes    int `yaml:"send_queue_bytes"`
}

// WebSocket tunes the client transport.
type WebSocket struct {
	PingInterval Duration `yaml:"ping_interval"`
	PingTimeout  Duration `yaml:"ping_timeout"`
	WriteTimeout Duration `yaml:"write_timeout"`
}

// Log configures logging.
type Log struct {
	Level  string `yaml:"level"`  // debug, info, warn, error
	Format string `yaml:"format"` // text or json
}

// Duration is a time.Duration written as "30s", "5m".
type Duration time.Duration

// UnmarshalYAML parses a Go duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration (use e.g. 30s, 5m)", n.Line, s)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes the duration as a string.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// D returns the time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// Default returns the configuration used when no file is given.
func Default() *Config {
	return &Config{
		Listen:        "127.0.0.1:8080",
		ShutdownGrace: Duration(30 * time.Second),
		Agent: Agent{
			StopGrace:   Duration(5 * time.Second),
			InitTimeout: Duration(60 * time.Second),
		},
		Pool: Pool{
			MinIdle:               1,
			MaxProcesses:          16,
			MaxSessionsPerProcess: 32,
			AcquireTimeout:        Duration(30 * time.Second),
			IdleTimeout:           Duration(5 * time.Minute),
		},
		Limits: Limits{
			MaxMessageBytes:   16 << 20,
			SendQueueMessages: 4096,
			SendQueueBytes:    64 << 20,
		},
		WebSocket: WebSocket{
			PingInterval: Duration(30 * time.Second),
			PingTimeout:  Duration(15 * time.Second),
			WriteTimeout: Duration(30 * time.Second),
		},
		Log: Log{Level: "info", Format: "text"},
	}
}

// Problem is one configuration error and where it is.
type Problem struct {
	Line, Column int // 0 when unknown
	Msg          string
}

func (p Problem) String() string {
	if p.Line > 0 {
		return fmt.Sprintf("line %d, column %d: %s", p.Line, p.Column, p.Msg)
	}
	return p.Msg
}

// Error lists every problem found in a configuration.
type Error struct {
	File     string
	Problems []Problem
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d problem(s)", e.File, len(e.Problems))
	for _, p := range e.Problems {
		b.WriteString("\n  ")
		b.WriteString(e.File)
		b.WriteString(": ")
		b.WriteString(p.String())
	}
	return b.String()
}

// LoadFile reads and validates a configuration file over the defaults.
func LoadFile(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return Parse(path, data)
}

// Parse decodes and validates YAML over the defaults. name is used in
// error messages.
func Parse(name string, data []byte) (*Config, error) {
	cfg := Default()
	cerr := &Error{File: name}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		cerr.Problems = append(cerr.Problems, yamlProblems(err)...)
		return nil, cerr
	}
	if len(bytes.TrimSpace(data)) > 0 {
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true)
		if err := dec.Decode(cfg); err != nil {
			cerr.Problems = append(cerr.Problems, yamlProblems(err)...)
		}
	}
	cerr.Problems = append(cerr.Problems, cfg.validate(&root)...)
	if len(cerr.Problems) > 0 {
		return nil, cerr
	}
	return cfg, nil
}

// yamlProblems splits a yaml error into one problem per line it reports.
func yamlProblems(err error) []Problem {
	var te *yaml.TypeError
	msgs := []string{err.Error()}
	if errors.As(err, &te) {
		msgs = te.Errors
	}
	var out []Problem
	for _, m := range msgs {
		m = strings.TrimPrefix(m, "yaml: ")
		p := Problem{Msg: m}
		if rest, ok := strings.CutPrefix(m, "line "); ok {
			if i := strings.IndexByte(rest, ':'); i > 0 {
				if n, err := strconv.Atoi(rest[:i]); err == nil {
					p = Problem{Line: n, Column: 1, Msg: strings.TrimSpace(rest[i+1:])}
				}
			}
		}
		out = append(out, p)
	}
	return out
}

// Validate checks a configuration that was built in code (flags over
// defaults); problems carry no location.
func (c *Config) Validate() error {
	if ps := c.validate(nil); len(ps) > 0 {
		return &Error{File: "configuration", Problems: ps}
	}
	return nil
}

func (c *Config) validate(root *yaml.Node) []Problem {
	var ps []Problem
	add := func(path, format string, args ...any) {
		p := Problem{Msg: path + ": " + fmt.Sprintf(format, args...)}
		if n := find(root, strings.Split(path, ".")...); n != nil {
			p.Line, p.Column = n.Line, n.Column
		}
		ps = append(ps, p)
	}
	if host, port, err := net.SplitHostPort(c.Listen); err != nil {
		add("listen", "%q is not host:port: %v", c.Listen, err)
	} else {
		if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			add("listen", "port %q is not a number from 0 to 65535", port)
		}
		if !IsLoopback(host) && !c.AllowUnauthenticated {
			add("listen", "%q is not a loopback address and no authentication is configured: "+
				"serving agents to the network unauthenticated needs allow_unauthenticated: true (or --allow-unauthenticated)", c.Listen)
		}
	}
	if c.ShutdownGrace < 0 {
		add("shutdown_grace", "must not be negative")
	}
	for i, a := range c.Agent.Command {
		if a == "" && i == 0 {
			add("agent.command", "the program name is empty")
		}
	}
	for k := range c.Agent.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			add("agent.env", "%q is not a valid environment variable name", k)
		}
	}
	if c.Agent.StopGrace <= 0 {
		add("agent.stop_grace", "must be positive")
	}
	if c.Agent.InitTimeout <= 0 {
		add("agent.init_timeout", "must be positive")
	}
	if c.Pool.MaxProcesses < 1 {
		add("pool.max_processes", "must be at least 1, is %d", c.Pool.MaxProcesses)
	}
	if c.Pool.MinIdle < 0 || c.Pool.MinIdle > c.Pool.MaxProcesses {
		add("pool.min_idle", "must be from 0 to max_processes (%d), is %d", c.Pool.MaxProcesses, c.Pool.MinIdle)
	}
	if c.Pool.MaxSessionsPerProcess < 1 {
		add("pool.max_sessions_per_process", "must be at least 1, is %d", c.Pool.MaxSessionsPerProcess)
	}
	if c.Pool.AcquireTimeout <= 0 {
		add("pool.acquire_timeout", "must be positive")
	}
	if c.Pool.IdleTimeout <= 0 {
		add("pool.idle_timeout", "must be positive")
	}
	if c.Limits.MaxMessageBytes < 1024 || c.Limits.MaxMessageBytes > 1<<30 {
		add("limits.max_message_bytes", "must be from 1024 to 1073741824, is %d", c.Limits.MaxMessageBytes)
	}
	if c.Limits.SendQueueMessages < 1 {
		add("limits.send_queue_messages", "must be at least 1")
	}
	if c.Limits.SendQueueBytes < c.Limits.MaxMessageBytes {
		add("limits.send_queue_bytes", "must be at least max_message_bytes (%d), is %d", c.Limits.MaxMessageBytes, c.Limits.SendQueueBytes)
	}
	if c.WebSocket.PingInterval < 0 || c.WebSocket.PingTimeout <= 0 || c.WebSocket.WriteTimeout <= 0 {
		add("websocket", "ping_timeout and write_timeout must be positive, ping_interval not negative (0 disables pings)")
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		add("log.level", "%q is not one of debug, info, warn, error", c.Log.Level)
	}
	switch c.Log.Format {
	case "text", "json":
	default:
		add("log.format", "%q is not text or json", c.Log.Format)
	}
	return ps
}

// IsLoopback reports whether a listen host only accepts local connections.
func IsLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// find returns the value node at a key path in a YAML document, or nil if
// the document does not set it.
func find(root *yaml.Node, path ...string) *yaml.Node {
	if root == nil || len(root.Content) == 0 {
		return nil
	}
	n := root.Content[0]
	for _, key := range path {
		if n.Kind != yaml.MappingNode {
			return nil
		}
		var next *yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == key {
				next = n.Content[i+1]
				break
			}
		}
		if next == nil {
			return nil
		}
		n = next
	}
	return n
}
