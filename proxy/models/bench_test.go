package models

import (
	"testing"

	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
)

// The relay's hot path: an update or a result without model or mode
// selectors is
// scanned with the specs that locate them, and the allow-list's hook
// (Seen.Answer; Seen.Edits for updates is the same) runs on it. "scan" is the scan alone, "hook" the hook
// alone on the scanned message: what a message without models pays on top
// of its scan (no decoding, no allocation).
//
//	go test -run '^$' -bench . -benchmem ./proxy/models/
func BenchmarkWithoutModels(b *testing.B) {
	msgs := []struct {
		name, method, raw string
	}{
		{"update", "", `{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"sess-1","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"Hello, this is a chunk of an answer streamed by the agent, about as long as one usually is."}}}}`},
		{"prompt-result", acp.SessionPrompt, `{"jsonrpc":"2.0","id":12,"result":{"stopReason":"end_turn","usage":{"inputTokens":10,"outputTokens":20}}}`},
		{"new-result", acp.SessionNew, `{"jsonrpc":"2.0","id":3,"result":{"sessionId":"sess-1","_meta":{"vendor":{"a":"b"}}}}`},
	}
	for _, c := range msgs {
		resolve := func(m *jsonrpc.Message) *jsonrpc.Spec {
			if m.Kind == jsonrpc.KindResponse {
				return acp.ResultSpec(c.method, m.IsError, false)
			}
			return acp.ParamsSpec(m.Method, false)
		}
		raw := []byte(c.raw)
		var sc jsonrpc.Scanner
		sc.Methods = acp.Methods
		var m jsonrpc.Message
		edits := make([]jsonrpc.Edit, 0, 8)
		var seen Seen
		b.Run(c.name+"/scan", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(raw)))
			for b.Loop() {
				if err := sc.Scan(raw, &m, resolve); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/hook", func(b *testing.B) {
			if err := sc.Scan(raw, &m, resolve); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				edits, _, _ = seen.Answer(&m, sonnet, c.method == acp.SessionNew, "sess-1", edits[:0])
			}
			if len(edits) != 0 || seen.p.Load() != nil {
				b.Fatal("edits for a message without models")
			}
		})
	}
}
