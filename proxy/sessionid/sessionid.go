// Package sessionid seals an agent's own session IDs into the opaque IDs
// clients see, bound to a tenant and an agent, and opens them again.
package sessionid

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
)

// Sealer turns an agent's own session ID into the opaque ID a client sees
// and back. IDs are sealed with AES-256-GCM under a key derived from the
// gateway's session key; the scope (the tenant and the agent, Scope) is
// authenticated data, so an ID opens only for the tenant and the agent it
// was issued for. The subject that made the session is sealed inside
// (Seal). The nonce is derived from the scope, the subject and the agent
// session ID (a synthetic IV), so the same session always has the same
// client-visible ID without the gateway keeping a table: IDs survive
// gateway restarts and work on every replica that shares the key.
type Sealer struct {
	keys []sealKey // the first seals; all open (key rotation)
}

type sealKey struct {
	aead   cipher.AEAD
	macKey []byte
}

// Versions of the sealed form: 1 holds the agent session ID alone (IDs
// issued before sessions were bound to their subject), 2 the subject that
// made the session too. Only 2 is issued; both open.
const (
	sealV1 = 1
	sealV2 = 2
)

var b64 = base64.RawURLEncoding

// New derives sealing keys from one or more keys (each at least 32
// bytes). New IDs are sealed with the first; every key opens IDs, so older
// keys can be kept while IDs issued under them are still in use.
func New(keys ...[]byte) (*Sealer, error) {
	if len(keys) == 0 {
		return nil, errors.New("session key: none given")
	}
	s := &Sealer{}
	for i, key := range keys {
		if len(key) < 32 {
			return nil, fmt.Errorf("session key %d: need at least 32 bytes, have %d", i+1, len(key))
		}
		derive := func(label string) []byte {
			h := hmac.New(sha256.New, key)
			h.Write([]byte("acpgate session id " + label))
			return h.Sum(nil)
		}
		block, err := aes.NewCipher(derive("enc"))
		if err != nil {
			return nil, fmt.Errorf("session key %d: %w", i+1, err)
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, fmt.Errorf("session key %d: %w", i+1, err)
		}
		s.keys = append(s.keys, sealKey{aead: aead, macKey: derive("nonce")})
	}
	return s, nil
}

// NewRandom seals with a fresh random key: IDs are valid only for
// this gateway process.
func NewRandom() *Sealer {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err)) // never fails on Linux
	}
	s, err := New(key)
	if err != nil {
		panic(err)
	}
	return s
}

func aad(version byte, scope string) []byte {
	return append([]byte{version}, scope...)
}

// DefaultAgent is the name of the agent whose IDs are bound to the tenant
// alone (Scope).
const DefaultAgent = "default"

// Scope is what a session ID is bound to: the tenant, and the agent
// unless it is the one named DefaultAgent, so that the IDs a single-agent
// gateway issued open unchanged once its agent: block is named "default"
// among several. Neither name holds a NUL (both are validated names).
func Scope(tenant, agent string) string {
	if agent == DefaultAgent {
		return tenant
	}
	return tenant + "\x00" + agent
}

// Seal returns the client-visible ID of agentSID in scope (Scope), made by
// subject: the subject travels sealed in the ID (encrypted, not only
// authenticated), so that whoever opens it learns who the session belongs
// to without a table, and nobody else can read it.
func (s *Sealer) Seal(scope, subject, agentSID string) string {
	return s.keys[0].seal(sealV2, scope, payload(subject, agentSID))
}

// payload is what a version 2 ID seals: the subject's length, the subject,
// then the agent session ID.
func payload(subject, agentSID string) []byte {
	p := binary.AppendUvarint(make([]byte, 0, binary.MaxVarintLen64+len(subject)+len(agentSID)), uint64(len(subject)))
	return append(append(p, subject...), agentSID...)
}

func (k sealKey) seal(version byte, scope string, plain []byte) string {
	h := hmac.New(sha256.New, k.macKey)
	h.Write([]byte(scope))
	h.Write([]byte{0})
	if version != sealV1 { // version 1's nonce covered the agent session ID alone
		h.Write([]byte{version})
	}
	h.Write(plain)
	nonce := h.Sum(nil)[:k.aead.NonceSize()]
	buf := make([]byte, 0, 1+len(nonce)+len(plain)+k.aead.Overhead())
	buf = append(buf, version)
	buf = append(buf, nonce...)
	buf = k.aead.Seal(buf, nonce, plain, aad(version, scope))
	return b64.EncodeToString(buf)
}

// Opened is what a session ID holds.
type Opened struct {
	Agent   string // the agent's own session ID
	Subject string // the credential subject that made the session ("" for a Legacy ID)
	// Legacy: a version 1 ID, issued before sessions were bound to their
	// subject; it names nobody.
	Legacy bool
}

var errBadSessionID = errors.New("unknown session")

// maxSessionIDLen bounds the IDs Open looks at (an agent session ID of up to
// about 3 KB seals within it).
const maxSessionIDLen = 4096

// Open returns what id holds, if id was issued in scope (Scope) under one
// of the keys. Every failure is the same error: a caller cannot tell a
// forged ID from another tenant's or another agent's, or one that never
// existed.
func (s *Sealer) Open(scope, id string) (Opened, error) {
	if len(id) > maxSessionIDLen {
		return Opened{}, errBadSessionID
	}
	raw, err := b64.DecodeString(id)
	if err != nil || len(raw) < 1 || raw[0] != sealV1 && raw[0] != sealV2 {
		return Opened{}, errBadSessionID
	}
	version := raw[0]
	for _, k := range s.keys {
		ns := k.aead.NonceSize()
		if len(raw) < 1+ns+k.aead.Overhead() {
			return Opened{}, errBadSessionID
		}
		plain, err := k.aead.Open(nil, raw[1:1+ns], raw[1+ns:], aad(version, scope))
		if err != nil {
			continue
		}
		// Only the canonical spelling opens: the base64 decoder skips
		// \r and \n, which would give one session several IDs.
		if k.seal(version, scope, plain) != id {
			return Opened{}, errBadSessionID
		}
		if version == sealV1 {
			return Opened{Agent: string(plain), Legacy: true}, nil
		}
		n, w := binary.Uvarint(plain)
		if w <= 0 || n > uint64(len(plain)-w) {
			return Opened{}, errBadSessionID
		}
		return Opened{Subject: string(plain[w : w+int(n)]), Agent: string(plain[w+int(n):])}, nil
	}
	return Opened{}, errBadSessionID
}

// NewToken returns an unguessable token (192 bits) that names the process
// that issued it, instance (NewInstance): "<instance>.<random>". The
// instance only classifies a refusal (another replica's token, or one
// from before a restart); it grants nothing. Resume tokens are these.
func NewToken(instance string) string {
	var b [24]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return instance + "." + b64.EncodeToString(b[:])
}

// NewInstance names a gateway process in its tokens (48 random bits, 8
// characters).
func NewInstance() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return b64.EncodeToString(b[:])
}
