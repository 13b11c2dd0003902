package demoagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

const (
	chunkRunes   = 8                      // size of a streamed message chunk
	tickInterval = 100 * time.Millisecond // pause between "tick N " chunks
	maxTicks     = 600                    // 60 s of ticks
	previewBytes = 4 << 10                // file content shown in a read tool call
	defaultWrite = "Hello from the acpgate demo agent!\n"
)

var (
	readPattern  = regexp.MustCompile(`(?i)\bread\s+(\S+)`)
	writePattern = regexp.MustCompile(`(?is)\bwrite\s+(\S+)(?:\s+(.*))?`)

	// errTurnCancelled ends a turn whose permission request the client
	// answered with outcome "cancelled".
	errTurnCancelled = errors.New("permission request cancelled by the client")

	permissionOptions = []map[string]string{
		{"optionId": "allow", "name": "Allow", "kind": "allow_once"},
		{"optionId": "reject", "name": "Reject", "kind": "reject_once"},
	}
)

// promptInput is what the agent takes from a session/prompt request.
type promptInput struct {
	text      string   // the text blocks, concatenated
	resources []string // URIs of resource_link and embedded resource blocks
}

// parsePrompt extracts the text and resource URIs of a prompt. Image and
// audio blocks are refused because the agent does not advertise them.
// Unknown block types are ignored.
func parsePrompt(blocks []json.RawMessage) (promptInput, error) {
	var (
		in   promptInput
		text strings.Builder
	)
	for i, raw := range blocks {
		var head struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(raw, &head); err != nil {
			return in, invalidParams("prompt[%d]: %v", i, err)
		}
		switch head.Type {
		case "text":
			var b struct {
				Text string `json:"text"`
			}
			if err := json.Unmarshal(raw, &b); err != nil {
				return in, invalidParams("prompt[%d]: %v", i, err)
			}
			text.WriteString(b.Text)
		case "resource_link":
			var b struct {
				URI string `json:"uri"`
			}
			if err := json.Unmarshal(raw, &b); err != nil {
				return in, invalidParams("prompt[%d]: %v", i, err)
			}
			in.resources = append(in.resources, b.URI)
		case "resource":
			var b struct {
				Resource struct {
					URI string `json:"uri"`
				} `json:"resource"`
			}
			if err := json.Unmarshal(raw, &b); err != nil {
				return in, invalidParams("prompt[%d]: %v", i, err)
			}
			in.resources = append(in.resources, b.Resource.URI)
		case "image", "audio":
			return in, invalidParams("prompt[%d]: %s content is not supported", i, head.Type)
		}
	}
	in.text = text.String()
	return in, nil
}

// turn is one running session/prompt request.
type turn struct {
	a      *agent
	sess   *session
	id     json.RawMessage // the session/prompt request id
	key    string          // idKey(id)
	input  promptInput
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{} // closed after the response is sent
	reply  strings.Builder
}

// startPrompt validates a session/prompt request and starts its turn in a
// new goroutine, which sends the response.
func (a *agent) startPrompt(m *message) error {
	var p struct {
		SessionID string            `json:"sessionId"`
		Prompt    []json.RawMessage `json:"prompt"`
		Meta      json.RawMessage   `json:"_meta"`
	}
	if err := decodeParams(m.Params, &p); err != nil {
		return err
	}
	if p.SessionID == "" {
		return invalidParams("sessionId is required")
	}
	var meta struct {
		Traceparent string `json:"traceparent"`
	}
	if json.Unmarshal(p.Meta, &meta) == nil && meta.Traceparent != "" { // an agent that traces nests under it
		a.log.Printf("session %s: prompt with traceparent %.55s", p.SessionID, meta.Traceparent)
	}
	if p.Prompt == nil {
		return invalidParams("prompt is required")
	}
	in, err := parsePrompt(p.Prompt)
	if err != nil {
		return err
	}

	key := idKey(m.ID)
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.sessions[p.SessionID]
	switch {
	case s == nil:
		return sessionNotFound(p.SessionID)
	case s.running != nil:
		return newError(codeInvalidRequest, "a prompt is already running")
	case a.prompts[key] != nil:
		return newError(codeInvalidRequest, "request id %s is already used by a running prompt", key)
	}
	ctx, cancel := context.WithCancel(a.ctx)
	t := &turn{a: a, sess: s, id: m.ID, key: key, input: in, ctx: ctx, cancel: cancel, done: make(chan struct{})}
	s.running = t
	a.prompts[key] = t
	s.record("user", in.text)
	a.wg.Add(1)
	go t.run()
	return nil
}

// run plays the turn, records the reply and answers the request.
func (t *turn) run() {
	a := t.a
	defer a.wg.Done()
	defer close(t.done)
	defer t.cancel()

	a.save(t.sess) // the user message
	err := t.respond()
	stop := "end_turn"
	switch {
	case t.ctx.Err() != nil || errors.Is(err, errTurnCancelled):
		stop = "cancelled"
	case err != nil:
		a.log.Printf("session %s: prompt failed: %v", t.sess.id, err)
	}

	a.mu.Lock()
	if t.reply.Len() > 0 {
		t.sess.record("agent", t.reply.String())
	} else {
		t.sess.updatedAt = time.Now()
	}
	info := map[string]any{"sessionUpdate": "session_info_update", "updatedAt": formatTime(t.sess.updatedAt)}
	if t.sess.title != "" {
		info["title"] = t.sess.title
	}
	a.mu.Unlock()
	a.save(t.sess)
	a.update(t.sess.id, info)

	// Free the session before answering, so the client may send its next
	// prompt as soon as it has the response.
	a.mu.Lock()
	t.sess.running = nil
	delete(a.prompts, t.key)
	a.mu.Unlock()
	a.reply(t.id, map[string]string{"stopReason": stop})
}

// save writes the session's file, logging failures: the turn goes on
// without persistence rather than failing.
func (a *agent) save(s *session) {
	s.saveMu.Lock()
	defer s.saveMu.Unlock()
	a.mu.Lock()
	f := s.file()
	a.mu.Unlock()
	if err := a.store.save(f); err != nil {
		a.log.Print(err)
	}
}

// respond picks the behaviour for the prompt (see the package comment). It
// returns a context error or errTurnCancelled when the turn was cancelled.
func (t *turn) respond() error {
	text := t.input.text
	words := wordSet(text)
	readPath, isRead := t.pathAfter(readPattern, text)
	writePath, writeContent, isWrite := t.writeArgs(text)
	switch {
	case words["slow"] || words["long"]:
		return t.slow()
	case isRead:
		return t.read(readPath)
	case isWrite:
		return t.write(writePath, writeContent)
	case words["permission"]:
		return t.permission()
	case words["plan"]:
		return t.plan()
	case words["think"]:
		return t.think()
	case words["markdown"]:
		return t.say(markdownReply)
	default:
		return t.echo()
	}
}

// wordSet returns the lower-cased words of text (runs of letters), so that
// keywords match whole words: "longer" or "/x/long.txt" is not "long".
func wordSet(text string) map[string]bool {
	words := map[string]bool{}
	for _, w := range strings.FieldsFunc(strings.ToLower(text), func(r rune) bool { return !unicode.IsLetter(r) }) {
		words[w] = true
	}
	return words
}

// pathAfter finds the first "<verb> <path>" in text, where pattern matches
// the verb and captures the token that follows it.
func (t *turn) pathAfter(pattern *regexp.Regexp, text string) (string, bool) {
	for _, m := range pattern.FindAllStringSubmatch(text, -1) {
		if p, ok := t.pathToken(m[1]); ok {
			return p, true
		}
	}
	return "", false
}

// writeArgs finds "write <path> [content]" in text.
func (t *turn) writeArgs(text string) (path, content string, ok bool) {
	for _, m := range writePattern.FindAllStringSubmatch(text, -1) {
		if p, ok := t.pathToken(m[1]); ok {
			content = m[2]
			if content == "" {
				content = defaultWrite
			}
			return p, content, true
		}
	}
	return "", "", false
}

// pathToken turns a prompt token into an absolute path. It removes
// surrounding quotes and trailing punctuation, and resolves relative paths
// against the session's cwd. A token without a slash, backslash or dot is not a path.
func (t *turn) pathToken(tok string) (string, bool) {
	tok = strings.TrimLeft(tok, "\"'`(")
	tok = strings.TrimRight(tok, "\"'`).,;:!?")
	if tok == "" || !strings.ContainsAny(tok, `/\.`) {
		return "", false
	}
	if filepath.IsAbs(tok) {
		return filepath.Clean(tok), true
	}
	return filepath.Join(t.sess.cwd, tok), true
}

// ---- behaviours ----

func (t *turn) echo() error {
	text := "You said: " + t.input.text
	if len(t.input.resources) > 0 {
		text += fmt.Sprintf(" (attached: %s)", strings.Join(t.input.resources, ", "))
	}
	return t.say(text)
}

func (t *turn) slow() error {
	for i := 1; i <= maxTicks; i++ {
		if i > 1 {
			if err := t.pause(tickInterval); err != nil {
				return err
			}
		}
		if err := t.ctx.Err(); err != nil {
			return err
		}
		t.emit("agent_message_chunk", fmt.Sprintf("tick %d ", i))
	}
	return nil
}

func (t *turn) read(path string) error {
	id := t.newToolCall()
	t.a.update(t.sess.id, map[string]any{
		"sessionUpdate": "tool_call",
		"toolCallId":    id,
		"title":         "Read " + path,
		"kind":          "read",
		"status":        "pending",
		"locations":     []map[string]string{{"path": path}},
		"rawInput":      map[string]string{"path": path},
	})
	if canRead, _ := t.a.fsCapabilities(); !canRead {
		t.toolUpdate(id, "failed", nil)
		return t.say(fmt.Sprintf("I cannot read %s: the client does not allow file reads (it did not advertise fs.readTextFile).", path))
	}

	t.toolUpdate(id, "in_progress", nil)
	res, err := t.a.call(t.ctx, "fs/read_text_file", map[string]string{"sessionId": t.sess.id, "path": path})
	if err != nil {
		return t.toolFailed(id, "I could not read "+path, err)
	}
	var out struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(res, &out); err != nil || out.Content == nil {
		t.toolUpdate(id, "failed", nil)
		return t.say(fmt.Sprintf("I could not read %s: the client's answer has no content.", path))
	}

	content := *out.Content
	t.toolUpdate(id, "completed", []any{map[string]any{"type": "content", "content": textBlock(truncate(content, previewBytes))}})
	if content == "" {
		return t.say(fmt.Sprintf("I read %s: the file is empty (0 bytes, 0 lines).", path))
	}
	bytesN, lines := len(content), countLines(content)
	return t.say(fmt.Sprintf("I read %s (%d %s, %d %s). The first line is: %q",
		path, bytesN, plural(bytesN, "byte"), lines, plural(lines, "line"), firstLine(content)))
}

// toolFailed marks tool call id failed and ends the step: with the turn's
// own error when the turn was cancelled, else by saying what went wrong.
func (t *turn) toolFailed(id, what string, err error) error {
	t.toolUpdate(id, "failed", nil)
	if t.ctx.Err() != nil {
		return t.ctx.Err()
	}
	return t.say(fmt.Sprintf("%s: %s", what, errorText(err)))
}

func (t *turn) write(path, content string) error {
	id := t.newToolCall()
	title := "Write " + path
	t.a.update(t.sess.id, map[string]any{
		"sessionUpdate": "tool_call",
		"toolCallId":    id,
		"title":         title,
		"kind":          "edit",
		"status":        "pending",
		"content":       []any{map[string]any{"type": "diff", "path": path, "oldText": nil, "newText": content}},
		"locations":     []map[string]string{{"path": path}},
		"rawInput":      map[string]string{"path": path, "content": content},
	})

	optionID, done, err := t.permit(id, title, "edit", path)
	if done {
		return err
	}
	if optionID != "allow" {
		t.toolUpdate(id, "failed", nil)
		return t.say("Permission denied.")
	}

	if _, canWrite := t.a.fsCapabilities(); !canWrite {
		t.toolUpdate(id, "failed", nil)
		return t.say(fmt.Sprintf("I cannot write %s: the client does not allow file writes (it did not advertise fs.writeTextFile).", path))
	}
	t.toolUpdate(id, "in_progress", nil)
	_, err = t.a.call(t.ctx, "fs/write_text_file", map[string]string{"sessionId": t.sess.id, "path": path, "content": content})
	if err != nil {
		return t.toolFailed(id, "I could not write "+path, err)
	}
	t.toolUpdate(id, "completed", nil)
	return t.say(fmt.Sprintf("Wrote %d bytes to %s.", len(content), path))
}

func (t *turn) permission() error {
	id := t.newToolCall()
	title := "Run a harmless command"
	t.a.update(t.sess.id, map[string]any{
		"sessionUpdate": "tool_call",
		"toolCallId":    id,
		"title":         title,
		"kind":          "execute",
		"status":        "pending",
		"rawInput":      map[string]string{"command": "echo hello"},
	})

	optionID, done, err := t.permit(id, title, "execute")
	if done {
		return err
	}
	if optionID == "allow" {
		t.toolUpdate(id, "completed", []any{map[string]any{"type": "content", "content": textBlock("hello")}})
		return t.say("Permission granted (allow).")
	}
	t.toolUpdate(id, "failed", nil)
	return t.say(fmt.Sprintf("Permission denied (%s).", optionID))
}

func (t *turn) plan() error {
	steps := []string{"Understand the request", "Do the work", "Report the result"}
	send := func(completed int) {
		entries := make([]map[string]string, len(steps))
		for i, s := range steps {
			status := "pending"
			if i < completed {
				status = "completed"
			}
			entries[i] = map[string]string{"content": s, "priority": "medium", "status": status}
		}
		t.a.update(t.sess.id, map[string]any{"sessionUpdate": "plan", "entries": entries})
	}
	send(0)
	for i := 1; i <= len(steps); i++ {
		if err := t.pause(t.stepDelay()); err != nil {
			return err
		}
		send(i)
	}
	return t.say(fmt.Sprintf("All %d steps of the plan are done.", len(steps)))
}

func (t *turn) think() error {
	thoughts := []string{
		"The user wants me to think. ",
		fmt.Sprintf("The prompt is %q. ", makeTitle(t.input.text)),
		"A short, friendly answer will do.",
	}
	for i, th := range thoughts {
		if i > 0 {
			if err := t.pause(t.stepDelay()); err != nil {
				return err
			}
		}
		t.emit("agent_thought_chunk", th)
	}
	if err := t.pause(t.stepDelay()); err != nil {
		return err
	}
	return t.say(fmt.Sprintf("I thought about it. You said: %s", t.input.text))
}

const markdownReply = "# Markdown demo\n\n" +
	"This reply uses **bold text**, *italics* and `inline code`.\n\n" +
	"- a list item\n" +
	"- another item\n" +
	"- a third item\n\n" +
	"```go\n" +
	"package main\n\n" +
	"import \"fmt\"\n\n" +
	"func main() {\n" +
	"\tfmt.Println(\"hello from the demo agent\")\n" +
	"}\n" +
	"```\n"

// ---- helpers ----

// say streams text as agent_message_chunk updates of chunkRunes characters,
// ChunkDelay apart.
func (t *turn) say(text string) error {
	runes := []rune(text)
	for i := 0; i < len(runes); i += chunkRunes {
		if i > 0 {
			if err := t.pause(t.a.opt.ChunkDelay); err != nil {
				return err
			}
		}
		if err := t.ctx.Err(); err != nil {
			return err
		}
		t.emit("agent_message_chunk", string(runes[i:min(i+chunkRunes, len(runes))]))
	}
	return nil
}

// emit sends one content chunk update. Agent message chunks become part of
// the reply that is stored in the history.
func (t *turn) emit(kind, text string) {
	if kind == "agent_message_chunk" {
		t.reply.WriteString(text)
	}
	t.a.update(t.sess.id, map[string]any{"sessionUpdate": kind, "content": textBlock(text)})
}

// pause waits for d, or returns the context error if the turn is cancelled
// first. A d of zero or less does not wait.
func (t *turn) pause(d time.Duration) error {
	if d <= 0 {
		return t.ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-t.ctx.Done():
		return t.ctx.Err()
	}
}

// stepDelay is the pause between plan steps and thoughts: long enough to be
// visible in a UI.
func (t *turn) stepDelay() time.Duration {
	if d := t.a.opt.ChunkDelay; d > 0 {
		return 10 * d
	}
	return t.a.opt.ChunkDelay
}

func (t *turn) newToolCall() string {
	t.a.mu.Lock()
	defer t.a.mu.Unlock()
	t.sess.toolCalls++
	return fmt.Sprintf("call_%d", t.sess.toolCalls)
}

// toolUpdate sends a tool_call_update with a new status and, if content is
// not nil, new content.
func (t *turn) toolUpdate(id, status string, content []any) {
	u := map[string]any{"sessionUpdate": "tool_call_update", "toolCallId": id, "status": status}
	if content != nil {
		u["content"] = content
	}
	t.a.update(t.sess.id, u)
}

// permit asks the client's permission for tool call id. When no option
// comes back (the request failed, or the turn was cancelled) it fails the
// tool call: done is then true, and err is what the turn returns. paths
// are the tool call's locations.
func (t *turn) permit(id, title, kind string, paths ...string) (optionID string, done bool, err error) {
	optionID, cancelled, err := t.askPermission(id, title, kind, paths)
	switch {
	case err != nil:
		return "", true, t.toolFailed(id, "I could not ask for permission", err)
	case cancelled:
		t.toolUpdate(id, "failed", nil)
		return "", true, errTurnCancelled
	}
	return optionID, false, nil
}

// askPermission sends session/request_permission with the allow and reject
// options, and the tool call's locations (paths) if it has any. It returns
// the chosen option id, or cancelled=true.
func (t *turn) askPermission(toolCallID, title, kind string, paths []string) (optionID string, cancelled bool, err error) {
	toolCall := map[string]any{"toolCallId": toolCallID, "title": title, "kind": kind, "status": "pending"}
	if len(paths) > 0 {
		var locs []map[string]string
		for _, p := range paths {
			locs = append(locs, map[string]string{"path": p})
		}
		toolCall["locations"] = locs
	}
	res, err := t.a.call(t.ctx, "session/request_permission", map[string]any{
		"sessionId": t.sess.id,
		"toolCall":  toolCall,
		"options":   permissionOptions,
	})
	if err != nil {
		return "", false, err
	}
	var r struct {
		Outcome struct {
			Outcome  string `json:"outcome"`
			OptionID string `json:"optionId"`
		} `json:"outcome"`
	}
	if err := json.Unmarshal(res, &r); err != nil {
		return "", false, fmt.Errorf("decode permission outcome: %w", err)
	}
	switch r.Outcome.Outcome {
	case "cancelled":
		return "", true, nil
	case "selected":
		if r.Outcome.OptionID == "" {
			return "", false, errors.New("permission outcome has no optionId")
		}
		return r.Outcome.OptionID, false, nil
	default:
		return "", false, fmt.Errorf("unknown permission outcome %q", r.Outcome.Outcome)
	}
}

// fsCapabilities returns the client's fs.readTextFile and fs.writeTextFile
// capabilities.
func (a *agent) fsCapabilities() (read, write bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.canRead, a.canWrite
}

// errorText is the message of a client error, or the error text.
func errorText(err error) string {
	var re *rpcError
	if errors.As(err, &re) {
		return re.Message
	}
	return err.Error()
}

func countLines(s string) int {
	n := strings.Count(s, "\n")
	if s != "" && !strings.HasSuffix(s, "\n") {
		n++
	}
	return n
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return truncate(strings.TrimSuffix(line, "\r"), 200)
}

// truncate shortens s to at most n bytes without splitting a character.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}
