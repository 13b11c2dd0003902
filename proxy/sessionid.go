package proxy

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
// gateway's session key; the tenant is authenticated data, so an ID opens
// only for the tenant it was issued to. The nonce is derived from the tenant
// and the agent session ID (a synthetic IV), so the same session always has
// the same client-visible ID without the gateway keeping a table: IDs survive
// gateway restarts and work on every replica that shares the key.
type Sealer struct {
	aead   cipher.AEAD
	macKey []byte
}

const sealVersion = 1

var b64 = base64.RawURLEncoding

// NewSealer derives the sealing keys from key (at least 32 bytes).
func NewSealer(key []byte) (*Sealer, error) {
	if len(key) < 32 {
		return nil, fmt.Errorf("session key: need at least 32 bytes, have %d", len(key))
	}
	derive := func(label string) []byte {
		h := hmac.New(sha256.New, key)
		h.Write([]byte("acpgate session id " + label))
		return h.Sum(nil)
	}
	block, err := aes.NewCipher(derive("enc"))
	if err != nil {
		return nil, fmt.Errorf("session key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("session key: %w", err)
	}
	return &Sealer{aead: aead, macKey: derive("nonce")}, nil
}

// NewRandomSealer seals with a fresh random key: IDs are valid only for
// this gateway process.
func NewRandomSealer() *Sealer {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err)) // never fails on Linux
	}
	s, err := NewSealer(key)
	if err != nil {
		panic(err)
	}
	return s
}

func (s *Sealer) aad(tenant string) []byte {
	return append([]byte{sealVersion}, tenant...)
}

// Seal returns the client-visible ID of agentSID for tenant.
func (s *Sealer) Seal(tenant, agentSID string) string {
	h := hmac.New(sha256.New, s.macKey)
	h.Write([]byte(tenant))
	h.Write([]byte{0})
	h.Write([]byte(agentSID))
	nonce := h.Sum(nil)[:s.aead.NonceSize()]
	buf := make([]byte, 0, 1+len(nonce)+len(agentSID)+s.aead.Overhead())
	buf = append(buf, sealVersion)
	buf = append(buf, nonce...)
	buf = s.aead.Seal(buf, nonce, []byte(agentSID), s.aad(tenant))
	return b64.EncodeToString(buf)
}

var errBadSessionID = errors.New("unknown session")

// Open returns the agent session ID sealed in id, if id was issued to tenant
// under this key.
func (s *Sealer) Open(tenant, id string) (string, error) {
	if len(id) > 4096 {
		return "", errBadSessionID
	}
	raw, err := b64.DecodeString(id)
	ns := s.aead.NonceSize()
	if err != nil || len(raw) < 1+ns+s.aead.Overhead() || raw[0] != sealVersion {
		return "", errBadSessionID
	}
	plain, err := s.aead.Open(nil, raw[1:1+ns], raw[1+ns:], s.aad(tenant))
	if err != nil {
		return "", errBadSessionID
	}
	return string(plain), nil
}
