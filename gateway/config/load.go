package config

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Loading: a file or YAML decoded over the defaults (Default), every
// problem found with its line, and the session keys the configuration
// names. validate.go checks what was decoded.

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
func LoadFile(path string) (*Config, error) { return LoadFileWith(path, nil) }

// LoadFileWith is LoadFile with overlay (flags, the environment) applied to
// the settings read before they are validated, so that an overlay can
// complete or correct the file. A nil overlay changes nothing.
func LoadFileWith(path string, overlay func(*Config) error) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return parse(path, path, data, overlay)
}

// Parse decodes and validates YAML over the defaults. name is used in
// error messages.
func Parse(name string, data []byte) (*Config, error) { return parse(name, "", data, nil) }

// parse decodes and validates data, named name in messages; file is the
// path it was read from ("" if none), which agents must not be able to read.
func parse(name, file string, data []byte, overlay func(*Config) error) (*Config, error) {
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
		if err := dec.Decode(cfg); err != nil && !errors.Is(err, io.EOF) { // EOF: only comments
			cerr.Problems = append(cerr.Problems, yamlProblems(err)...)
		}
	}
	if overlay != nil && len(cerr.Problems) == 0 {
		if err := overlay(cfg); err != nil {
			return nil, err
		}
	}
	if len(cerr.Problems) == 0 {
		cfg.resolveAgents(&root)
	}
	cerr.Problems = append(cerr.Problems, cfg.validate(&root)...)
	if len(cerr.Problems) == 0 && file != "" {
		cerr.Problems = append(cerr.Problems, cfg.sandboxExposures(&root, file)...)
	}
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

// resolveAgents lays each named agent's keys over its defaults: the
// agent: block's settings (not its command) and the top-level pool. The
// strict decode has already reported unknown keys and bad values.
func (c *Config) resolveAgents(root *yaml.Node) {
	for name := range c.Agents {
		n := find(root, "agents", name)
		if n == nil {
			continue
		}
		na := &NamedAgent{Agent: c.Agent, Pool: c.Pool}
		na.Command = nil
		na.Env = maps.Clone(c.Agent.Env)
		na.InheritEnv = slices.Clone(c.Agent.InheritEnv)
		_ = n.Decode(na)
		c.Agents[name] = na
	}
}

// find returns the value node at a key path in a YAML document, or nil if
// the document does not set it.
func find(root *yaml.Node, path ...string) *yaml.Node {
	if root == nil || len(root.Content) == 0 {
		return nil
	}
	n := root.Content[0]
	for _, key := range path {
		if n = member(n, key); n == nil {
			return nil
		}
	}
	return n
}

// member is the value of key in the mapping n (nil if n is not a mapping
// or has no such key).
func member(n *yaml.Node, key string) *yaml.Node {
	if n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// sessionKeyPaths lists the key files, the sealing key first.
func (c *Config) sessionKeyPaths() []string {
	var out []string
	if c.SessionKeyFile != "" {
		out = append(out, c.SessionKeyFile)
	}
	return append(out, c.SessionKeyFiles...)
}

// SessionKeys reads the configured session keys, the sealing key first. No
// key files: nil.
func (c *Config) SessionKeys() ([][]byte, error) {
	var keys [][]byte
	for _, f := range c.sessionKeyPaths() {
		k, err := ReadSessionKey(f)
		if err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// ReadSessionKey reads a key file: 64 hex characters (32 bytes), surrounding
// white space ignored.
func ReadSessionKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("session key: %w", err)
	}
	k, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(k) != 32 {
		return nil, fmt.Errorf("session key %s: must hold 32 bytes as 64 hex characters (acpgate keygen writes one)", path)
	}
	return k, nil
}
