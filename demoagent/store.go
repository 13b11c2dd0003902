package demoagent

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"
)

// sessionIDPattern is the shape of the ids the agent creates. Ids from the
// client are checked against it before they become file names.
var sessionIDPattern = regexp.MustCompile(`^demo-[0-9a-f]{16}$`)

func newSessionID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails, see crypto/rand.Read
	return "demo-" + hex.EncodeToString(b[:])
}

// historyEntry is one message of a session's conversation.
type historyEntry struct {
	Role string `json:"role"` // "user" or "agent"
	Text string `json:"text"`
}

// sessionFile is the on-disk form of a session, <StateDir>/<id>.json.
type sessionFile struct {
	SessionID string         `json:"sessionId"`
	Cwd       string         `json:"cwd"`
	Title     string         `json:"title"`
	UpdatedAt string         `json:"updatedAt"`
	History   []historyEntry `json:"history"`
	ToolCalls int            `json:"toolCalls,omitempty"` // tool call ids used so far
}

// session is a session that is active in this process. Apart from saveMu,
// its fields are guarded by agent.mu.
type session struct {
	id        string
	cwd       string
	title     string
	updatedAt time.Time
	history   []historyEntry
	toolCalls int
	running   *turn // the prompt in progress, if any

	saveMu sync.Mutex // serialises writes of this session's file
}

func sessionFromFile(f *sessionFile) *session {
	t, _ := time.Parse(time.RFC3339Nano, f.UpdatedAt)
	return &session{
		id:        f.SessionID,
		cwd:       f.Cwd,
		title:     f.Title,
		updatedAt: t,
		history:   f.History,
		toolCalls: f.ToolCalls,
	}
}

// file returns a copy of s in its on-disk form. The caller holds agent.mu.
func (s *session) file() *sessionFile {
	return &sessionFile{
		SessionID: s.id,
		Cwd:       s.cwd,
		Title:     s.title,
		UpdatedAt: formatTime(s.updatedAt),
		History:   append([]historyEntry{}, s.history...),
		ToolCalls: s.toolCalls,
	}
}

// record appends a message to the history. The first non-empty user message
// sets the title. The caller holds agent.mu.
func (s *session) record(role, text string) {
	s.history = append(s.history, historyEntry{Role: role, Text: text})
	s.updatedAt = time.Now()
	if s.title == "" && role == "user" {
		s.title = makeTitle(text)
	}
}

// makeTitle returns the first 40 characters of text, on a single line.
func makeTitle(text string) string {
	t := []rune(strings.Join(strings.Fields(text), " "))
	if len(t) > 40 {
		t = t[:40]
	}
	return string(t)
}

func formatTime(t time.Time) string {
	return t.UTC().Format(time.RFC3339Nano)
}

// store keeps one JSON file per session in a directory.
type store struct {
	dir string
}

func (st store) path(id string) string {
	return filepath.Join(st.dir, id+".json")
}

// save writes f atomically: to a temporary file first, then renamed over the
// old one, so a reader in another process never sees a half-written file.
func (st store) save(f *sessionFile) error {
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("encode session %s: %w", f.SessionID, err)
	}
	tmp, err := os.CreateTemp(st.dir, "."+f.SessionID+"-*.tmp")
	if err != nil {
		return fmt.Errorf("save session %s: %w", f.SessionID, err)
	}
	defer os.Remove(tmp.Name()) // fails harmlessly once renamed
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("save session %s: %w", f.SessionID, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("save session %s: %w", f.SessionID, err)
	}
	if err := os.Rename(tmp.Name(), st.path(f.SessionID)); err != nil {
		return fmt.Errorf("save session %s: %w", f.SessionID, err)
	}
	return nil
}

// load reads the session with the given id. It returns an error wrapping
// fs.ErrNotExist when there is no such session.
func (st store) load(id string) (*sessionFile, error) {
	if !sessionIDPattern.MatchString(id) {
		return nil, fmt.Errorf("load session %q: %w", id, fs.ErrNotExist)
	}
	data, err := os.ReadFile(st.path(id))
	if err != nil {
		return nil, fmt.Errorf("load session %s: %w", id, err)
	}
	var f sessionFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("load session %s: decode %s: %w", id, st.path(id), err)
	}
	f.SessionID = id
	return &f, nil
}

// exists reports whether a file for the session exists.
func (st store) exists(id string) bool {
	if !sessionIDPattern.MatchString(id) {
		return false
	}
	_, err := os.Stat(st.path(id))
	return err == nil
}

// list returns every readable session, newest first. Files that cannot be
// read are passed to skip and left out.
func (st store) list(skip func(error)) ([]*sessionFile, error) {
	entries, err := os.ReadDir(st.dir)
	if err != nil {
		return nil, fmt.Errorf("list sessions in %s: %w", st.dir, err)
	}
	var out []*sessionFile
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || e.IsDir() || !sessionIDPattern.MatchString(id) {
			continue
		}
		f, err := st.load(id)
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) { // deleted meanwhile: not worth a message
				skip(err)
			}
			continue
		}
		out = append(out, f)
	}
	sort.SliceStable(out, func(i, j int) bool {
		ti, _ := time.Parse(time.RFC3339Nano, out[i].UpdatedAt)
		tj, _ := time.Parse(time.RFC3339Nano, out[j].UpdatedAt)
		if !ti.Equal(tj) {
			return ti.After(tj)
		}
		return out[i].SessionID < out[j].SessionID
	})
	return out, nil
}
