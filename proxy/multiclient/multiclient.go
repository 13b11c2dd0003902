// Package multiclient holds the shapes of a session with several clients
// (ACP RFD #533, session/attach): how a client names itself and how the
// others see it, session/attach's params and result, the updates only
// attached clients get (presence, prompt_received, turn_complete,
// permission_resolved), and the record of the configuration the agent last
// reported, which an attach result carries. It knows nothing of sessions
// or connections.
package multiclient

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/acpgate/acpgate/internal/logx"
	"github.com/acpgate/acpgate/proxy/models"
)

// MaxClientField bounds each of what a client names itself.
const MaxClientField = 128

// ClientInfo is a client's name and version, as its initialize (or its
// session/attach) said.
type ClientInfo struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	// MultiClient: an owner that hears the multi-client updates of its
	// sessions (initialize only).
	MultiClient bool `json:"-"`
}

// InitClientInfo reads clientInfo from initialize's params, bounded, and
// whether the client asks for the multi-client updates of the sessions it
// owns (params._meta.acpgate.multiClient: true; a plain client gets only
// standard ACP).
func InitClientInfo(params []byte) ClientInfo {
	var p struct {
		ClientInfo ClientInfo `json:"clientInfo"`
		Meta       struct {
			Acpgate struct {
				MultiClient bool `json:"multiClient"`
			} `json:"acpgate"`
		} `json:"_meta"`
	}
	_ = json.Unmarshal(params, &p)
	return ClientInfo{Name: logx.Truncate(p.ClientInfo.Name, MaxClientField), Version: logx.Truncate(p.ClientInfo.Version, MaxClientField),
		MultiClient: p.Meta.Acpgate.MultiClient}
}

// Peer is a client as the others see it.
type Peer struct {
	ClientID string `json:"clientId"`
	Name     string `json:"name"`
	Version  string `json:"version"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

// Info is the peer's name and version.
func (p Peer) Info() ClientInfo { return ClientInfo{Name: p.Name, Version: p.Version} }

// NewClientID mints a client ID: every client of a session is known to the
// others by one, a plain client (its owner) and each attached one, and the
// gateway alone gives them (a clientId session/attach asks for is not
// used). No two the process mints are the same: each is the next value of
// a counter enciphered with a key drawn at start (AES is a permutation of
// its blocks), so two clients can never share an ID in a session, and an
// ID says nothing of how many came before it.
func NewClientID() string {
	ids.once.Do(func() {
		key := make([]byte, 16)
		_, _ = rand.Read(key)
		ids.block, _ = aes.NewCipher(key) // a 16-byte key is never refused
	})
	var b [aes.BlockSize]byte
	binary.BigEndian.PutUint64(b[8:], ids.next.Add(1))
	ids.block.Encrypt(b[:], b[:])
	return "c-" + hex.EncodeToString(b[:])
}

// ids is what NewClientID mints from.
var ids struct {
	once  sync.Once
	block cipher.Block
	next  atomic.Uint64
}

// AttachParams are session/attach's params.
type AttachParams struct {
	SessionID     string `json:"sessionId"`
	HistoryPolicy string `json:"historyPolicy"`
	// ClientInfo names the client to the others (free text, as a label:
	// never who it is). A clientId the client asks for is not read: the
	// gateway gives each client its ID (NewClientID).
	ClientInfo *ClientInfo `json:"clientInfo"`
	Meta       struct {
		Acpgate struct {
			ReadOnly bool `json:"readOnly"`
		} `json:"acpgate"`
	} `json:"_meta"`
}

// Check validates p and fills in the default history policy ("full").
func (p *AttachParams) Check() error {
	switch p.HistoryPolicy {
	case "":
		p.HistoryPolicy = "full"
	case "full", "pending_only", "none":
	default:
		return fmt.Errorf(`params.historyPolicy must be "full", "pending_only" or "none", is %q`, logx.Truncate(p.HistoryPolicy, 32))
	}
	if p.ClientInfo != nil && (len(p.ClientInfo.Name) > MaxClientField || len(p.ClientInfo.Version) > MaxClientField) {
		return fmt.Errorf("params.clientInfo's name and version are limited to %d bytes", MaxClientField)
	}
	return nil
}

// Result is what session/attach's result says besides the session's
// configuration (State).
type Result struct {
	SessionID, ClientID string
	Clients             []Peer // every client of the session, the new one included
	HistoryPolicy       string
	ReadOnly            bool
	Replayed            int  // messages of the history replayed
	Trimmed             bool // the history had dropped older ones
	Turn                string
	// Lists are the tenant's model and mode allow-lists: the session's
	// recorded selectors are reported through them (models.FilterState).
	Lists models.Lists
}

// filtered is st with its model selectors as r's allow-list lets a client
// see them.
func (r Result) filtered(st State) State {
	st.ConfigOptions, st.Models, st.Modes = models.FilterState(st.ConfigOptions, st.Models, st.Modes, r.Lists)
	return st
}

// AttachResult is session/attach's result.
func AttachResult(r Result, st State) []byte {
	if r.Clients == nil {
		r.Clients = []Peer{}
	}
	res, _ := json.Marshal(struct {
		SessionID        string `json:"sessionId"`
		ClientID         string `json:"clientId"`
		ConnectedClients []Peer `json:"connectedClients"`
		HistoryPolicy    string `json:"historyPolicy"`
		ReadOnly         bool   `json:"readOnly"`
		State
		Meta map[string]any `json:"_meta"`
	}{r.SessionID, r.ClientID, r.Clients, r.HistoryPolicy, r.ReadOnly, r.filtered(st),
		map[string]any{"acpgate": map[string]any{"replayed": r.Replayed, "historyTrimmed": r.Trimmed, "turn": r.Turn}}})
	return res
}

// LoadResult is the result of a session/load or session/resume that the
// gateway served as a read-only attach (another subject's session, which
// its tenant's sharing lets the caller only watch): the standard result,
// the session's configuration, with what an attach result says under
// _meta.acpgate ("readOnly": true among it).
func LoadResult(r Result, st State) []byte {
	if r.Clients == nil {
		r.Clients = []Peer{}
	}
	res, _ := json.Marshal(struct {
		State
		Meta map[string]any `json:"_meta"`
	}{r.filtered(st), map[string]any{"acpgate": map[string]any{"attached": true, "readOnly": r.ReadOnly, "clientId": r.ClientID,
		"connectedClients": r.Clients, "historyPolicy": r.HistoryPolicy, "replayed": r.Replayed, "historyTrimmed": r.Trimmed, "turn": r.Turn}}})
	return res
}

// Presence is a client_connected or client_disconnected update.
func Presence(event string, who Peer) []byte {
	body, _ := json.Marshal(struct {
		SessionUpdate string `json:"sessionUpdate"`
		Client        Peer   `json:"client"`
		Timestamp     string `json:"timestamp"`
	}{event, who, time.Now().UTC().Format(time.RFC3339Nano)})
	return body
}

// UserMessageChunk is the user_message_chunk update of one prompt block,
// as session/load would replay it to a plain client.
func UserMessageChunk(block json.RawMessage) []byte {
	body, _ := json.Marshal(struct {
		SessionUpdate string          `json:"sessionUpdate"`
		Content       json.RawMessage `json:"content"`
	}{"user_message_chunk", block})
	return body
}

// PromptReceived is the prompt_received update: a prompt another client
// sent.
func PromptReceived(blocks []json.RawMessage, by Peer) []byte {
	body, _ := json.Marshal(struct {
		SessionUpdate string            `json:"sessionUpdate"`
		Prompt        []json.RawMessage `json:"prompt"`
		SentBy        Peer              `json:"sentBy"`
	}{"prompt_received", blocks, by})
	return body
}

// TurnComplete is the turn_complete update: a turn ended, with stop.
func TurnComplete(stop string) []byte {
	body, _ := json.Marshal(struct {
		SessionUpdate string `json:"sessionUpdate"`
		StopReason    string `json:"stopReason"`
	}{"turn_complete", stop})
	return body
}

// PermissionResolved is the permission_resolved update of msg, a
// permission request, settled with outcome by by (nil: the gateway).
func PermissionResolved(msg []byte, by *Peer, outcome []byte) []byte {
	var req struct {
		Params struct {
			ToolCall struct {
				ToolCallID string `json:"toolCallId"`
			} `json:"toolCall"`
		} `json:"params"`
	}
	_ = json.Unmarshal(msg, &req)
	body, _ := json.Marshal(struct {
		SessionUpdate string          `json:"sessionUpdate"`
		ToolCallID    string          `json:"toolCallId"`
		Outcome       json.RawMessage `json:"outcome"`
		ResolvedBy    *Peer           `json:"resolvedBy,omitempty"`
	}{"permission_resolved", req.Params.ToolCall.ToolCallID, outcome, by})
	return body
}

// ByPolicy adds to body, a permission_resolved update of a request the
// gateway's standing rule settled, the rule and what it decided: "policy":
// {"rule": ..., "decide": "allow"|"deny"}. Without a rule, or a body (nil:
// no member to tell), body is returned as it is.
func ByPolicy(body []byte, rule, decide string) []byte {
	if body == nil || rule == "" {
		return body
	}
	var u map[string]json.RawMessage
	if json.Unmarshal(body, &u) != nil {
		return body
	}
	u["policy"], _ = json.Marshal(map[string]string{"rule": rule, "decide": decide})
	out, err := json.Marshal(u)
	if err != nil {
		return body
	}
	return out
}

// State is what a session/attach result reports of the session's
// configuration, as the agent last gave it (raw JSON; nil: never given).
type State struct {
	Modes         json.RawMessage `json:"modes,omitempty"`
	ConfigOptions json.RawMessage `json:"configOptions,omitempty"`
	Models        json.RawMessage `json:"models,omitempty"`
}

// maxStateUpdate bounds the size of a mode or config option update the
// record follows.
const maxStateUpdate = 16 << 10

// Record is the configuration the agent last reported of a session. Its
// lock is a leaf.
type Record struct {
	mu  sync.Mutex
	cur State
}

// Get is the configuration last reported.
func (a *Record) Get() State {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cur
}

// NoteResult records the configuration a session/new, load or resume
// result carries.
func (a *Record) NoteResult(result []byte) {
	var st State
	if json.Unmarshal(result, &st) != nil {
		return
	}
	a.mu.Lock()
	a.cur = st
	a.mu.Unlock()
}

// NoteUpdate keeps the recorded configuration current: a mode or config
// option change the agent reports (msg: its session/update). Those are
// small: a message over maxStateUpdate is not searched (streamed content
// is most of the bytes).
func (a *Record) NoteUpdate(msg []byte) {
	if len(msg) > maxStateUpdate || !bytes.Contains(msg, []byte(`_update"`)) {
		return // most updates are chunks: one short search rules them out
	}
	isMode := bytes.Contains(msg, []byte(`"current_mode_update"`))
	if !isMode && !bytes.Contains(msg, []byte(`"config_option_update"`)) {
		return
	}
	var n struct {
		Params struct {
			Update struct {
				SessionUpdate string          `json:"sessionUpdate"`
				CurrentModeID json.RawMessage `json:"currentModeId"`
				ConfigOptions json.RawMessage `json:"configOptions"`
			} `json:"update"`
		} `json:"params"`
	}
	if json.Unmarshal(msg, &n) != nil {
		return
	}
	u := n.Params.Update
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case u.SessionUpdate == "current_mode_update" && u.CurrentModeID != nil && a.cur.Modes != nil:
		var modes map[string]json.RawMessage
		if json.Unmarshal(a.cur.Modes, &modes) == nil {
			modes["currentModeId"] = u.CurrentModeID
			a.cur.Modes, _ = json.Marshal(modes)
		}
	case u.SessionUpdate == "config_option_update" && u.ConfigOptions != nil:
		a.cur.ConfigOptions = u.ConfigOptions
	}
}
