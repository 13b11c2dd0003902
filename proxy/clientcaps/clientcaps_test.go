package clientcaps

import (
	"testing"

	"github.com/acpgate/acpgate/proxy/pool"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		params string
		want   pool.Profile
		err    bool
	}{
		{`{"protocolVersion":1,"clientCapabilities":{"fs":{"readTextFile":true},"terminal":true}}`, pool.Profile{Version: 1, FsRead: true, Terminal: true}, false},
		{`{"protocolVersion":1,"clientCapabilities":{"fs":"garbage","elicitation":{"form":{}}}}`, pool.Profile{Version: 1, ElicitForm: true}, false},
		{`{"protocolVersion":2,"info":{"name":"x","version":"1"},"capabilities":{"auth":{"terminal":{}},"elicitation":{"url":{}}}}`, pool.Profile{Version: 2, AuthTerminal: true, ElicitURL: true}, false},
		{`{"protocolVersion":1,"clientCapabilities":{"subagents":{}}}`, pool.Profile{Version: 1, Subagents: true}, false},
		{`{"protocolVersion":1,"clientCapabilities":{"subagents":null}}`, pool.Profile{Version: 1}, false},
		{`{"protocolVersion":9}`, pool.Profile{Version: 2}, false},
		{`{"clientCapabilities":{}}`, pool.Profile{}, true},
		{`[]`, pool.Profile{}, true},
	} {
		got, err := Parse([]byte(tc.params))
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("%s: %+v %v, want %+v", tc.params, got, err, tc.want)
		}
	}
}
