package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"sync"
	"time"
)

// ticketLen is the length of a ticket: 32 random bytes, unpadded base64url.
var ticketLen = base64.RawURLEncoding.EncodedLen(32)

// ticketStore holds issued tickets, keyed by the SHA-256 of the ticket (the
// map never holds a usable ticket, and a map lookup's timing can only say
// something about a hash). It has no goroutine: expired entries are purged
// from the front of an issue-ordered queue on every access. Used and expired
// entries are kept for one more TTL, so that a late or repeated use is
// reported as ticket_expired / ticket_reused rather than as unknown; they
// are dropped at once when the table is full.
type ticketStore struct {
	ttl time.Duration
	max int

	mu    sync.Mutex
	m     map[[sha256.Size]byte]*ticketEntry
	queue []queuedTicket // in issue order, so in expiry order
}

type ticketEntry struct {
	tenant, subject string
	expires         time.Time
	used            bool
}

type queuedTicket struct {
	key     [sha256.Size]byte
	expires time.Time
}

func newTicketStore(ttl time.Duration, max int) *ticketStore {
	return &ticketStore{ttl: ttl, max: max, m: map[[sha256.Size]byte]*ticketEntry{}}
}

// purge drops the entries that expired at least retain ago. Called with mu.
func (s *ticketStore) purge(now time.Time, retain time.Duration) {
	n := 0
	for n < len(s.queue) && !now.Before(s.queue[n].expires.Add(retain)) {
		delete(s.m, s.queue[n].key)
		n++
	}
	s.queue = s.queue[n:] // append reallocates without the dropped prefix
}

// IssueTicket returns a one-time ticket for id's tenant, valid for the
// configured TTL, for the query parameter ticket= of a WebSocket upgrade. It
// fails with 403 unknown_tenant if the tenant is not configured (any more),
// and with 503 ticket_capacity if the table is full of unexpired tickets.
func (a *Authenticator) IssueTicket(id Identity) (ticket string, expires time.Time, err error) {
	if !a.tenants.Load().has(id.Tenant) {
		return "", time.Time{}, fail(http.StatusForbidden, ReasonUnknownTenant, "the tenant is not configured")
	}
	var raw [32]byte
	_, _ = rand.Read(raw[:]) // never fails (crypto/rand crashes the program instead)
	ticket = base64.RawURLEncoding.EncodeToString(raw[:])
	key := sha256.Sum256([]byte(ticket))
	now := a.now()
	s := a.tickets
	s.mu.Lock()
	defer s.mu.Unlock()
	s.purge(now, s.ttl)
	if len(s.m) >= s.max {
		s.purge(now, 0)
		if len(s.m) >= s.max {
			return "", time.Time{}, fail(http.StatusServiceUnavailable, ReasonTicketsFull,
				"too many outstanding tickets: retry in a few seconds")
		}
	}
	expires = now.Add(s.ttl)
	s.m[key] = &ticketEntry{tenant: id.Tenant, subject: id.Subject, expires: expires}
	s.queue = append(s.queue, queuedTicket{key: key, expires: expires})
	return ticket, expires, nil
}

// redeemTicket consumes a ticket. The identity comes from the ticket alone:
// the request cannot name another tenant.
func (a *Authenticator) redeemTicket(ticket string) (Identity, *Error) {
	if len(ticket) != ticketLen {
		return Identity{}, unauthorized(ReasonInvalidToken, "the ticket is not valid")
	}
	key := sha256.Sum256([]byte(ticket))
	now := a.now()
	s := a.tickets
	s.mu.Lock()
	s.purge(now, s.ttl)
	e := s.m[key]
	var tenant, subject string
	var err *Error
	switch {
	case e == nil:
		err = unauthorized(ReasonInvalidToken, "the ticket is not valid (unknown or long expired)")
	case e.used:
		err = unauthorized(ReasonTicketReused, "the ticket has already been used: tickets are single-use, get a new one")
	case !now.Before(e.expires):
		err = unauthorized(ReasonTicketExpired, "the ticket has expired: get a new one right before connecting")
	default:
		e.used = true
		tenant, subject = e.tenant, e.subject
	}
	s.mu.Unlock()
	if err != nil {
		return Identity{}, err
	}
	if !a.tenants.Load().has(tenant) {
		return Identity{}, fail(http.StatusForbidden, ReasonUnknownTenant, "the ticket's tenant is no longer configured")
	}
	return Identity{Tenant: tenant, Method: MethodTicket, Subject: subject}, nil
}
