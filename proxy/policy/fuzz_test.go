package policy

import (
	"bytes"
	"encoding/json"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/go-json-experiment/json/jsontext"
)

// policyFromBits sets one policy key per bit (and "_*" extensions on the
// last one).
func policyFromBits(bits uint32) Policy {
	var p Policy
	for i, k := range policyKeys {
		k.set(&p, bits&(1<<i) != 0)
	}
	if bits&(1<<len(policyKeys)) != 0 {
		p.Extensions = []string{"_*"}
	}
	return p
}

// FuzzFilterInitialize: FilterInitialize never panics; when it succeeds its
// output is valid JSON, satisfies the independent checker, re-parses to the
// agent's capabilities restricted by the policy (so it never advertises a
// capability absent from the input), keeps the shape and is a fixed point.
func FuzzFilterInitialize(f *testing.F) {
	for _, fx := range fixtures(f) {
		for _, bits := range []uint32{0, 0xffffffff, 0x12345, 0x2aaaa, 0x15555} {
			f.Add(fx.raw, bits)
		}
	}
	for _, s := range []string{
		`{"protocolVersion":2,"capabilities":{"session":{"load":5,"mcp":[],"prompt":{"image":true}}}}`,
		`{"agentCapabilities":null,"capabilities":"x","authMethods":null}`,
		`{"\u0061gentCapabilities":{"loadSession":true,"sessionCapabilities":{"\u0066ork":{}}}}`,
		`{"protocolVersion":1e400,"agentCapabilities":{"mcpCapabilities":{"acp":"yes"}}}`,
	} {
		f.Add([]byte(s), uint32(0x3ffff))
	}
	f.Fuzz(func(t *testing.T, data []byte, bits uint32) {
		p := policyFromBits(bits)
		in := ParseAgentCaps(data)
		out, err := FilterInitialize(data, p)
		if err != nil {
			return
		}
		if !jsontext.Value(out).IsValid() || !json.Valid(out) {
			t.Fatalf("invalid output %q from %q", out, data)
		}
		got := ParseAgentCaps(out)
		if got.Shape != in.Shape || got.ProtocolVersion != in.ProtocolVersion {
			t.Fatalf("shape/version changed: %v/%d -> %v/%d", in.Shape, in.ProtocolVersion, got.Shape, got.ProtocolVersion)
		}
		// Never advertises what the input did not.
		gv, iv := reflect.ValueOf(got), reflect.ValueOf(in)
		for i := range gv.NumField() {
			if gv.Field(i).Kind() == reflect.Bool && gv.Field(i).Bool() && !iv.Field(i).Bool() {
				t.Fatalf("%s advertised but absent from the input\nin  %s\nout %s", gv.Type().Field(i).Name, data, out)
			}
		}
		if got.AuthMethods > in.AuthMethods {
			t.Fatalf("authMethods grew")
		}
		if want := restrict(in, p); got != want {
			t.Fatalf("re-parsed caps\n got %+v\nwant %+v\nin  %s\nout %s", got, want, data, out)
		}
		checkFiltered(t, data, out, p)
		again, err := FilterInitialize(out, p)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("not a fixed point: %v\n%s\n%s", err, out, again)
		}
	})
}

// FuzzCheckMCPServer: CheckMCPServer never panics, and its messages never
// repeat a command, an argument, an environment or header value or a URL
// query (beyond what the entry's name, type or host happen to contain).
func FuzzCheckMCPServer(f *testing.F) {
	for _, s := range []string{
		`{"name":"db","command":"/usr/bin/secret-tool","args":["--token=abcdefgh"],"env":[{"name":"K","value":"hunter22"}]}`,
		`{"type":"http","name":"api","url":"https://mcp.example.com/x?key=supersecret","headers":[{"name":"Authorization","value":"Bearer abcdefgh"}]}`,
		`{"type":"sse","name":"e","url":"https://user:password1@evil.example/"}`,
		`{"type":"acp","name":"a","serverId":"s"}`,
		`{"type":"_custom","name":"c"}`,
	} {
		f.Add([]byte(s), uint32(0x3ffff))
	}
	capsList := []AgentCaps{
		ParseAgentCaps(fixtureBytes(f, "v1-unstable")),
		ParseAgentCaps(fixtureBytes(f, "v2-schema-unstable")),
	}
	f.Fuzz(func(t *testing.T, entry []byte, bits uint32) {
		p := policyFromBits(bits)
		p.MCP.HTTPHosts = []string{"mcp.example.com"}
		var e struct {
			Type, Name, Command, URL string
			Args                     []string
			Env, Headers             []struct{ Name, Value string }
		}
		decodeErr := json.Unmarshal(entry, &e)
		for _, caps := range capsList {
			err := p.CheckMCPServer(7, entry, caps)
			if err == nil {
				continue
			}
			msg := err.Error()
			if decodeErr != nil {
				continue
			}
			secrets := append([]string{e.Command}, e.Args...)
			for _, kv := range append(e.Env, e.Headers...) {
				secrets = append(secrets, kv.Value)
			}
			if i := strings.IndexByte(e.URL, '?'); i >= 0 {
				secrets = append(secrets, e.URL[i+1:])
			}
			host := ""
			if u, err := url.Parse(e.URL); err == nil {
				host = strings.ToLower(u.Hostname())
			}
			for _, s := range secrets {
				// What the message may name: the entry's name, its type and host.
				if len(s) < 6 || strings.Contains(e.Name, s) || strings.Contains(e.Type, s) || strings.Contains(host, strings.ToLower(s)) {
					continue
				}
				if strings.Contains(msg, s) || strings.Contains(msg, strconv.Quote(s)) {
					t.Fatalf("message %q repeats %q", msg, s)
				}
			}
		}
	})
}
