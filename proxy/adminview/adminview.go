// Package adminview is what the admin API sees of the relay's connections
// and sessions: snapshots, taken by the relay, read by the gateway.
package adminview

import (
	"slices"
	"strings"
	"time"

	"github.com/acpgate/acpgate/proxy/usage"
)

// Conn is what the admin API lists of a connection.
type Conn struct {
	ID, Tenant, Subject, Agent string
	Transport, Remote          string // as the connection's first socket had them
	Opened                     time.Time
	Detached                   bool      // no socket: kept for a resume or a take-over
	DetachedAt                 time.Time // zero unless Detached
	Sessions                   []string  // the session IDs it holds, as it sees them
}

// Session is what the admin API lists of a session.
type Session struct {
	ID, Tenant, Agent string
	Parent            string // a subagent's child session: its parent's ID ("": none)
	Clients           int    // its owner, if any, and its members
	State             string // Idle, Running or Detached
	Since             time.Time
	TurnStarted       time.Time // zero: no turn running
	Usage             usage.Usage
}

// Session states.
const (
	Idle     = "idle"
	Running  = "running"
	Detached = "detached" // no client has a socket
)

// SortSessions orders sessions oldest first (by Since, then ID).
func SortSessions(ss []Session) {
	slices.SortFunc(ss, func(a, b Session) int {
		if c := a.Since.Compare(b.Since); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
}
