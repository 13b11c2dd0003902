// Package fsstandin serves an agent's fs/read_text_file and
// fs/write_text_file from disk, in the place of a client without file
// access. The file must be under a root: the path is absolute, stays under
// the root after cleaning, and is opened through an os.Root, so no symlink
// and no ".." leads out of it. Reads honour line and limit and are capped
// at a size (the message limit). A failure the agent is to hear of is an
// *Error (the JSON-RPC error it gets); any other is an internal error.
package fsstandin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/acpgate/acpgate/proxy/acp"
	"github.com/acpgate/acpgate/proxy/jsonrpc"
)

// The methods Serve serves (PROTOCOL.md §6).
const (
	Read  = acp.FsRead
	Write = acp.FsWrite
)

// Params are the parameters of fs/read_text_file and fs/write_text_file
// (PROTOCOL.md §6). Unknown fields are ignored, as a client would.
type Params struct {
	Path    string  `json:"path"`
	Line    *int    `json:"line"`
	Limit   *int    `json:"limit"`
	Content *string `json:"content"`
}

// Error is a stand-in failure: the JSON-RPC error the agent gets.
type Error struct {
	Code int
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

// Serve performs one fs request under root and returns its result and
// the bytes of content it read or wrote (for the audit trail).
func Serve(method, root string, params *Params, maxBytes int) ([]byte, int, error) {
	if root == "" || !filepath.IsAbs(root) {
		return nil, 0, &Error{Code: jsonrpc.CodeInternalError, Msg: "the client does not offer file access and this session has no workspace root the gateway could serve files from"}
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
	case Read:
		content, err := readLines(dir, rel, params.Line, params.Limit, maxBytes)
		if err != nil {
			return nil, 0, fsFailure(method, params.Path, err)
		}
		result, err := json.Marshal(struct {
			Content string `json:"content"`
		}{content})
		return result, len(content), err
	case Write:
		if params.Content == nil {
			return nil, 0, &Error{Code: jsonrpc.CodeInvalidParams, Msg: "fs/write_text_file needs params.content"}
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
	return nil, 0, &Error{Code: jsonrpc.CodeMethodNotFound, Msg: method + " is not a file method"}
}

// relUnder returns path relative to root, refusing a path that is not
// absolute or that leaves root after cleaning.
func relUnder(root, path string) (string, error) {
	if !filepath.IsAbs(path) {
		return "", &Error{Code: jsonrpc.CodeInvalidParams, Msg: "params.path must be an absolute path"}
	}
	rel, err := filepath.Rel(filepath.Clean(root), filepath.Clean(path))
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", &Error{Code: jsonrpc.CodeInvalidParams, Msg: "params.path: outside the workspace of this session; the gateway refused it"}
	}
	if rel == "." {
		return "", &Error{Code: jsonrpc.CodeInvalidParams, Msg: "params.path names the workspace directory, not a file"}
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
		return "", &Error{Code: jsonrpc.CodeInvalidParams, Msg: fmt.Sprintf("the file is larger than the %d-byte message limit", maxBytes)}
	}
	text := string(b)
	if line == nil && limit == nil {
		return text, nil
	}
	start := 1
	if line != nil {
		if *line < 1 {
			return "", &Error{Code: jsonrpc.CodeInvalidParams, Msg: "params.line starts at 1"}
		}
		start = *line
	}
	if limit != nil && *limit < 0 {
		return "", &Error{Code: jsonrpc.CodeInvalidParams, Msg: "params.limit must not be negative"}
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
	var fe *Error
	switch {
	case errors.As(err, &fe):
		return fe
	case errors.Is(err, fs.ErrNotExist):
		return &Error{Code: jsonrpc.CodeNotFound, Msg: fmt.Sprintf("%s %s: no such file", method, path)}
	case strings.Contains(err.Error(), "path escapes from parent"): // os.Root's refusal
		return &Error{Code: jsonrpc.CodeInvalidParams, Msg: fmt.Sprintf("%s %s: leads outside the workspace; the gateway refused it", method, path)}
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return &Error{Code: jsonrpc.CodeInternalError, Msg: fmt.Sprintf("%s %s: %v", method, path, err)}
}
