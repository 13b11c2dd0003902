package audit

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
)

// MinKeyBytes is the shortest MAC key the trail takes.
const MinKeyBytes = 32

// A keyed trail ends each line with "kid" (which key) and "mac": the hex
// HMAC-SHA256, under that key, of the line up to and including its kid
// (its seq and prev among it). The chain's prev then depends on every MAC
// before it: a line changed and the lines after it re-chained fail their
// MAC, which only the key's holder can make again.
//
// Keys are ordered. A key changed while the gateway runs (SIGHUP) leaves
// an audit.key_changed line naming the old key (old_kid) and MACed under
// both: mac_old under the old key over the line up to its kid, then mac
// under the new over the line up to its mac_old. From it on, Verify takes
// no line under the old key, so a retired key (a leaked one, the usual
// reason to rotate) cannot vouch for lines made after its retirement. A
// run started under another key (a restart with a new key file) begins
// with its gateway.started line under the new key: the gateway no longer
// holds the old one, and that line retires it just the same.

// ReadKeyFile reads a MAC key: hex (acpgate keygen writes one), surrounding
// white space ignored, at least MinKeyBytes bytes. A file that its group or
// others may read is refused. Errors name the file, never the key.
func ReadKeyFile(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("audit key %s: mode %04o lets its group or others read it; chmod 600 (or 400) it", path, perm)
	}
	return readKey(path)
}

// ReadVerifyKey reads a MAC key for verifying: as ReadKeyFile, but any
// mode (whoever verifies holds a copy of the key).
func ReadVerifyKey(path string) ([]byte, error) { return readKey(path) }

func readKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	k, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(k) < MinKeyBytes {
		return nil, fmt.Errorf("audit key %s: must hold at least %d bytes as hex (acpgate keygen writes one)", path, MinKeyBytes)
	}
	return k, nil
}

// KeyID names a key in the trail's lines ("kid"): 16 hex characters of an
// HMAC of a constant under it, which tells nothing of the key.
func KeyID(key []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("acpgate audit key id"))
	return hex.EncodeToString(m.Sum(nil)[:8])
}

// lineMAC is the hex HMAC-SHA256 of body under key.
func lineMAC(key, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil))
}

// macSuffix is how a keyed line ends: ,"mac":"<64 hex>"}.
const macSuffixLen = len(`,"mac":"`) + 64 + len(`"}`)

// splitMAC returns a keyed line's body (what its MAC covers) and its MAC,
// or ok false when the line does not end in a MAC.
func splitMAC(line []byte) (body []byte, mac string, ok bool) {
	if len(line) < macSuffixLen {
		return nil, "", false
	}
	body, tail := line[:len(line)-macSuffixLen], line[len(line)-macSuffixLen:]
	if !strings.HasPrefix(string(tail), `,"mac":"`) || !strings.HasSuffix(string(tail), `"}`) {
		return nil, "", false
	}
	return body, string(tail[len(`,"mac":"`) : len(tail)-2]), true
}

// splitMACOld returns a key change's body without its mac_old (what the
// old key's MAC covers) and its mac_old, from body (the line without its
// mac), or ok false when body does not end in a mac_old.
func splitMACOld(body []byte) (oldBody []byte, macOld string, ok bool) {
	const n = len(`,"mac_old":"`) + 64 + len(`"`)
	if len(body) < n {
		return nil, "", false
	}
	oldBody, tail := body[:len(body)-n], string(body[len(body)-n:])
	if !strings.HasPrefix(tail, `,"mac_old":"`) || !strings.HasSuffix(tail, `"`) {
		return nil, "", false
	}
	return oldBody, tail[len(`,"mac_old":"`) : len(tail)-1], true
}

// errNoKey: a SetKey without a key.
var errNoKey = errors.New("audit: no key")
