package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

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
// has no file access. The file must be under the tenant's root (or, for a
// tenant without one, the session's cwd): the path is absolute, stays under
// the root after cleaning, and is opened through an os.Root, so no symlink
// and no ".." leads out of it. Reads honour line and limit and are capped at
// the message limit.

// maxFsStandIn bounds the stand-in's file operations in flight on one
// process; the agent's reader waits for a slot (the disk, never a client).
const maxFsStandIn = 8

// fsParams are the parameters of fs/read_text_file and fs/write_text_file
// (PROTOCOL.md §6). Unknown fields are ignored, as a client would.
type fsParams struct {
	Path    string  `json:"path"`
	Line    *int    `json:"line"`
	Limit   *int    `json:"limit"`
	Content *string `json:"content"`
}

// fsError is a stand-in failure: the JSON-RPC error the agent gets.
type fsError struct {
	code int
	msg  string
}

func (e *fsError) Error() string { return e.msg }

// standInFs serves an agent's fs request in the client's place. It is
// called on the process's reader goroutine with the message as the agent
// sent it; the file work runs on a goroutine of the pool's.
func (r *agentReader) standInFs(conn *Conn, sess *Session, m *jsonrpc.Message) {
	l := r.l
	id := append([]byte(nil), m.ID...)
	method := m.Method
	var params fsParams
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
			err = &fsError{jsonrpc.CodeInvalidParams, "invalid " + method + " params: " + err.Error()}
		} else {
			result, n, err = serveFs(method, root, &params, l.p.MaxMessageBytes())
		}
		outcome, code := "ok", 0
		var out []byte
		if err != nil {
			outcome = "error"
			var fe *fsError
			if !errors.As(err, &fe) {
				fe = &fsError{jsonrpc.CodeInternalError, err.Error()}
			}
			code = fe.code
			out = jsonrpc.AppendError(nil, id, fe.code, fe.msg, nil)
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

// serveFs performs one fs request under root and returns its result and
// the bytes of content it read or wrote (for the audit trail).
func serveFs(method, root string, params *fsParams, maxBytes int) ([]byte, int, error) {
	if root == "" || !filepath.IsAbs(root) {
		return nil, 0, &fsError{jsonrpc.CodeInternalError, "the client does not offer file access and this session has no workspace root the gateway could serve files from"}
	}
	rel, err := relUnder(root, params.Path)
	if err != nil {
		return nil, 0, err
	}
	dir, err := os.OpenRoot(root)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: open the workspace root: %w", method, err)
	}
	defer dir.Close()
	switch method {
	case mFsRead:
		content, err := readLines(dir, rel, params.Line, params.Limit, maxBytes)
		if err != nil {
			return nil, 0, fsFailure(method, params.Path, err)
		}
		result, err := json.Marshal(struct {
			Content string `json:"content"`
		}{content})
		return result, len(content), err
	case mFsWrite:
		if params.Content == nil {
			return nil, 0, &fsError{jsonrpc.CodeInvalidParams, "fs/write_text_file needs params.content"}
		}
		if d := filepath.Dir(rel); d != "." {
			if err := dir.MkdirAll(d, 0o755); err != nil {
				return nil, 0, fsFailure(method, params.Path, err)
			}
		}
		if err := dir.WriteFile(rel, []byte(*params.Content), 0o644); err != nil {
			return nil, 0, fsFailure(method, params.Path, err)
		}
		return []byte("{}"), len(*params.Content), nil
	}
	return nil, 0, &fsError{jsonrpc.CodeMethodNotFound, method + " is not a file method"}
}

// relUnder returns path relative to root, refusing a path that is not
// absolute or that leaves root after cleaning.
func relUnder(root, path string) (string, error) {
	if !filepath.IsAbs(path) {
		return "", &fsError{jsonrpc.CodeInvalidParams, "params.path must be an absolute path"}
	}
	rel, err := filepath.Rel(filepath.Clean(root), filepath.Clean(path))
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", &fsError{jsonrpc.CodeInvalidParams, "params.path: outside the workspace of this session; the gateway refused it"}
	}
	if rel == "." {
		return "", &fsError{jsonrpc.CodeInvalidParams, "params.path names the workspace directory, not a file"}
	}
	return rel, nil
}

// readLines reads rel from dir, at most maxBytes, and returns lines
// line.. line+limit-1 (1-based; all when nil).
func readLines(dir *os.Root, rel string, line, limit *int, maxBytes int) (string, error) {
	f, err := dir.Open(rel)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.IsDir() {
		return "", errors.New("is a directory")
	}
	b, err := io.ReadAll(io.LimitReader(f, int64(maxBytes)+1))
	if err != nil {
		return "", err
	}
	if len(b) > maxBytes {
		return "", &fsError{jsonrpc.CodeInvalidParams, fmt.Sprintf("the file is larger than the %d-byte message limit", maxBytes)}
	}
	text := string(b)
	if line == nil && limit == nil {
		return text, nil
	}
	start := 1
	if line != nil {
		if *line < 1 {
			return "", &fsError{jsonrpc.CodeInvalidParams, "params.line starts at 1"}
		}
		start = *line
	}
	if limit != nil && *limit < 0 {
		return "", &fsError{jsonrpc.CodeInvalidParams, "params.limit must not be negative"}
	}
	lines := strings.SplitAfter(text, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	if start > len(lines) {
		return "", nil
	}
	lines = lines[start-1:]
	if limit != nil && *limit < len(lines) {
		lines = lines[:*limit]
	}
	return strings.Join(lines, ""), nil
}

// fsFailure turns a file error into what the agent gets: -32002 for a file
// that does not exist, -32602 for a path the root refuses, -32603 else. The
// message names the path as the agent sent it.
func fsFailure(method, path string, err error) error {
	var fe *fsError
	switch {
	case errors.As(err, &fe):
		return fe
	case errors.Is(err, fs.ErrNotExist):
		return &fsError{jsonrpc.CodeNotFound, fmt.Sprintf("%s %s: no such file", method, path)}
	case strings.Contains(err.Error(), "path escapes from parent"): // os.Root's refusal
		return &fsError{jsonrpc.CodeInvalidParams, fmt.Sprintf("%s %s: leads outside the workspace; the gateway refused it", method, path)}
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return &fsError{jsonrpc.CodeInternalError, fmt.Sprintf("%s %s: %v", method, path, err)}
}
