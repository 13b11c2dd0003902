package proxy

import (
	"encoding/json"
	"errors"

	"github.com/acpgate/acpgate/proxy/fsstandin"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
	"github.com/acpgate/acpgate/proxy/observe/tracing"
)

// The gateway stands in for a client without file access.
//
// Every agent process is told the client can read and write files (as far
// as any tenant's policy allows), so that one process serves every client.
// When the agent then calls fs/read_text_file or fs/write_text_file for a
// session whose client did not offer it, or whose tenant's policy does not
// let the agent ask the client, the gateway serves the call itself from
// disk: exactly what the agent would have done had it been told the client
// has no file access (package fsstandin). The file must be under the
// tenant's root (or, for a tenant without one, the session's cwd); reads
// are capped at the message limit.

// maxFsStandIn bounds the stand-in's file operations in flight on one
// process; the agent's reader waits for a slot (the disk, never a client).
const maxFsStandIn = 8

// standInFs serves an agent's fs request in the client's place. It is
// called on the process's reader goroutine with the message as the agent
// sent it; the file work runs on a goroutine of the pool's.
func (r *agentReader) standInFs(conn *Conn, sess *Session, m *jsonrpc.Message) {
	l := r.l
	id := append([]byte(nil), m.ID...)
	method := m.Method
	var params fsstandin.Params
	err := json.Unmarshal(m.Payload, &params)
	root := ""
	if mapper := conn.ten.mapper.Load(); mapper != nil {
		root = mapper.Root()
	} else if sess != nil {
		root = sess.cwd
	}
	span := conn.relay.fsSpan(sess, m)
	l.fsSlots <- struct{}{}
	l.p.Go(func() {
		defer func() { <-l.fsSlots }()
		var result []byte
		n := 0
		if err != nil {
			err = &fsstandin.Error{Code: jsonrpc.CodeInvalidParams, Msg: "invalid " + method + " params: " + err.Error()}
		} else {
			result, n, err = fsstandin.Serve(method, root, &params, l.p.MaxMessageBytes())
		}
		outcome, code := "ok", 0
		var out []byte
		if err != nil {
			outcome = "error"
			var fe *fsstandin.Error
			if !errors.As(err, &fe) {
				fe = &fsstandin.Error{Code: jsonrpc.CodeInternalError, Msg: err.Error()}
			}
			code = fe.Code
			out = jsonrpc.AppendError(nil, id, fe.Code, fe.Msg, nil)
			tracing.WithTrace(conn.log, span).Debug("file request served by the gateway failed", "method", method, "err", err)
		} else {
			out = jsonrpc.AppendResult(nil, id, result)
			conn.standInDone(sess, method, params.Path, n)
		}
		l.ag.metrics.FsServed.WithLabelValues(method, outcome).Inc()
		tracing.EndOutcome(span, outcome, code)
		l.p.SendCtrl(append(out, '\n'))
	})
}
