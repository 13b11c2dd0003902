package cluster

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Envelope headers: what a replica adds to a request it carries to
// another. The signature covers every one of them, the method, the target
// (path and query) and the body's hash, so an envelope cannot be moved to
// another operation, caller or reply path.
const (
	hdrFrom    = "Acpgate-Cluster-From"
	hdrOp      = "Acpgate-Cluster-Op"
	hdrTenant  = "Acpgate-Cluster-Tenant"
	hdrSubject = "Acpgate-Cluster-Subject"
	hdrReply   = "Acpgate-Cluster-Reply"
	hdrTime    = "Acpgate-Cluster-Time"
	hdrNonce   = "Acpgate-Cluster-Nonce"
	hdrSig     = "Acpgate-Cluster-Sig"
	// HdrReplayed marks a refusal of an envelope already executed: a
	// forwarder that retried learns its first attempt arrived.
	HdrReplayed = "Acpgate-Cluster-Replayed"
)

// maxSkew is how far an envelope's time may be from the receiver's clock;
// its nonce is remembered at least twice as long.
const maxSkew = 30 * time.Second

var b64 = base64.RawURLEncoding

// Envelope is who a forwarded request acts for and what it does.
type Envelope struct {
	From    string // the replica that signed it
	Op      string // the operation (metrics' op label)
	Tenant  string
	Subject string
	// Reply is where its answers go: the client connection or stream the
	// forwarder serves ("" where the HTTP response itself is the reply).
	Reply string
	nonce string
}

// Nonce is the envelope's unique name (a retry carries the same).
func (e Envelope) Nonce() string { return e.nonce }

// signer signs and checks envelopes with the cluster key.
type signer struct {
	key    []byte
	replay *replayCache
	now    func() time.Time
}

func newSigner(key []byte) *signer {
	h := hmac.New(sha256.New, key)
	h.Write([]byte("acpgate cluster envelope"))
	return &signer{key: h.Sum(nil), replay: newReplayCache(), now: time.Now}
}

// newNonce is 128 random bits.
func newNonce() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return b64.EncodeToString(b[:])
}

func (s *signer) mac(method, target string, h http.Header, bodySum []byte) string {
	m := hmac.New(sha256.New, s.key)
	field := func(v string) {
		m.Write([]byte(strconv.Itoa(len(v))))
		m.Write([]byte{':'})
		m.Write([]byte(v))
	}
	field(method)
	field(target)
	for _, k := range []string{hdrFrom, hdrOp, hdrTenant, hdrSubject, hdrReply, hdrTime, hdrNonce} {
		field(h.Get(k))
	}
	for _, k := range signedClientHeaders {
		field(h.Get(k))
	}
	m.Write(bodySum)
	return b64.EncodeToString(m.Sum(nil))
}

// signedClientHeaders are the client's headers a forwarded request carries
// that decide what it does: they are signed too.
var signedClientHeaders = []string{"Acp-Connection-Id", "Acp-Session-Id", "Last-Event-ID", "Content-Type"}

// sign stamps req (body: its body's bytes) with e and a fresh time; the
// nonce is e's if set (a retry), else new. It returns the nonce.
func (s *signer) sign(req *http.Request, e Envelope, body []byte) string {
	nonce := e.nonce
	if nonce == "" {
		nonce = newNonce()
	}
	h := req.Header
	h.Set(hdrFrom, e.From)
	h.Set(hdrOp, e.Op)
	h.Set(hdrTenant, e.Tenant)
	h.Set(hdrSubject, b64.EncodeToString([]byte(e.Subject)))
	h.Set(hdrReply, e.Reply)
	h.Set(hdrTime, strconv.FormatInt(s.now().UnixMilli(), 10))
	h.Set(hdrNonce, nonce)
	sum := sha256.Sum256(body)
	h.Set(hdrSig, s.mac(req.Method, req.URL.RequestURI(), h, sum[:]))
	return nonce
}

// Errors of verify.
var (
	ErrUnsigned = errors.New("unsigned or badly signed envelope")
	ErrStale    = errors.New("envelope outside its time window")
	ErrReplayed = errors.New("replayed envelope")
)

// verify checks r's envelope over body; a valid one's nonce is spent: the
// same envelope again is ErrReplayed.
func (s *signer) verify(r *http.Request, body []byte) (Envelope, error) {
	h := r.Header
	sig := h.Get(hdrSig)
	sum := sha256.Sum256(body)
	want := s.mac(r.Method, r.URL.RequestURI(), h, sum[:])
	if sig == "" || !hmac.Equal([]byte(sig), []byte(want)) {
		return Envelope{}, ErrUnsigned
	}
	ms, err := strconv.ParseInt(h.Get(hdrTime), 10, 64)
	if err != nil {
		return Envelope{}, ErrUnsigned
	}
	if d := s.now().Sub(time.UnixMilli(ms)); d > maxSkew || d < -maxSkew {
		return Envelope{}, ErrStale
	}
	subject, err := b64.DecodeString(h.Get(hdrSubject))
	if err != nil {
		return Envelope{}, ErrUnsigned
	}
	nonce := h.Get(hdrNonce)
	if nonce == "" || !s.replay.spend(nonce, s.now()) {
		return Envelope{}, ErrReplayed
	}
	return Envelope{From: h.Get(hdrFrom), Op: h.Get(hdrOp), Tenant: h.Get(hdrTenant), Subject: string(subject),
		Reply: h.Get(hdrReply), nonce: nonce}, nil
}

// replayCache remembers the nonces of the last two windows of 2×maxSkew:
// an envelope is accepted once, and one older than that is stale anyway.
type replayCache struct {
	mu        sync.Mutex
	cur, prev map[string]struct{}
	turned    time.Time
}

// maxNonces bounds one window's nonces: past it new envelopes are
// refused (until the window turns), so memory stays bounded and no replay
// gets in.
const maxNonces = 1 << 20

func newReplayCache() *replayCache {
	return &replayCache{cur: map[string]struct{}{}, prev: map[string]struct{}{}}
}

// spend records nonce; false if it was seen (or the cache is full).
func (c *replayCache) spend(nonce string, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.turned.IsZero() {
		c.turned = now
	}
	if now.Sub(c.turned) >= 2*maxSkew {
		c.prev, c.cur, c.turned = c.cur, map[string]struct{}{}, now
	}
	if _, ok := c.cur[nonce]; ok {
		return false
	}
	if _, ok := c.prev[nonce]; ok {
		return false
	}
	if len(c.cur) >= maxNonces {
		return false
	}
	c.cur[nonce] = struct{}{}
	return true
}
