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
	"errors"
	"fmt"
)

// Sealer turns an agent's own session ID into the opaque ID a client sees
// and back. IDs are sealed with AES-256-GCM under a key derived from the
// gateway's session key; the scope (the tenant and the agent, Scope) is
// authenticated data, so an ID opens only for the tenant and the agent it
// was issued for. The nonce is derived from the scope and the agent session ID (a synthetic IV), so the same session always has
// the same client-visible ID without the gateway keeping a table: IDs survive
// gateway restarts and work on every replica that shares the key.
type Sealer struct {
	keys []sealKey // the first seals; all open (key rotation)
}

type sealKey struct {
	aead   cipher.AEAD
	macKey []byte
}

const sealVersion = 1

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

func aad(scope string) []byte {
	return append([]byte{sealVersion}, scope...)
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

// Seal returns the client-visible ID of agentSID in scope (Scope).
func (s *Sealer) Seal(scope, agentSID string) string { return s.keys[0].seal(scope, agentSID) }

func (k sealKey) seal(scope, agentSID string) string {
	h := hmac.New(sha256.New, k.macKey)
	h.Write([]byte(scope))
	h.Write([]byte{0})
	h.Write([]byte(agentSID))
	nonce := h.Sum(nil)[:k.aead.NonceSize()]
	buf := make([]byte, 0, 1+len(nonce)+len(agentSID)+k.aead.Overhead())
	buf = append(buf, sealVersion)
	buf = append(buf, nonce...)
	buf = k.aead.Seal(buf, nonce, []byte(agentSID), aad(scope))
	return b64.EncodeToString(buf)
}

var errBadSessionID = errors.New("unknown session")

// maxSessionIDLen bounds the IDs Open looks at (an agent session ID of up to
// about 3 KB seals within it).
const maxSessionIDLen = 4096

// Open returns the agent session ID sealed in id, if id was issued in scope
// (Scope) under one of the keys. Every failure is the same error: a
// caller cannot tell a forged ID from another tenant's or another agent's,
// or one that never existed.
func (s *Sealer) Open(scope, id string) (string, error) {
	if len(id) > maxSessionIDLen {
		return "", errBadSessionID
	}
	raw, err := b64.DecodeString(id)
	if err != nil || len(raw) < 1 || raw[0] != sealVersion {
		return "", errBadSessionID
	}
	for _, k := range s.keys {
		ns := k.aead.NonceSize()
		if len(raw) < 1+ns+k.aead.Overhead() {
			return "", errBadSessionID
		}
		if plain, err := k.aead.Open(nil, raw[1:1+ns], raw[1+ns:], aad(scope)); err == nil {
			// Only the canonical spelling opens: the base64 decoder skips
			// \r and \n, which would give one session several IDs.
			if k.seal(scope, string(plain)) != id {
				return "", errBadSessionID
			}
			return string(plain), nil
		}
	}
	return "", errBadSessionID
}
