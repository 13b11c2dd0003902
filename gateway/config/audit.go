package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/acpgate/acpgate/audit"
)

// Audit configures the audit trail.
type Audit struct {
	// File is where the trail goes: a path (JSON lines, appended, created
	// 0600) or "-" for standard output; "" = no audit trail. Each replica
	// writes its own. SIGHUP reopens it (after logrotate moved it).
	File string `yaml:"file"`
	// IncludePrompts adds a prompt's text to its event.
	IncludePrompts bool `yaml:"include_prompts"`
	// HMACKeyFile, if set, holds the key every line's MAC is made with
	// (HMAC-SHA256; at least 32 bytes as hex, acpgate keygen writes one).
	// The file must not be readable by its group or others. SIGHUP reads
	// it again: a changed key MACs the lines from then on (each line names
	// its key); a key that cannot be read keeps the one in use.
	HMACKeyFile string `yaml:"hmac_key_file"`
}

// validate checks the audit section.
func (a *Audit) validate(add addFunc) {
	if f := a.File; f != "" && f != "-" {
		if err := writable(f); err != nil {
			add("audit.file", "%q: %v", f, err)
		}
	}
	if k := a.HMACKeyFile; k != "" {
		if a.File == "" {
			add("audit.hmac_key_file", "is set but audit.file is not: there is no trail to key")
		}
		if _, err := audit.ReadKeyFile(k); err != nil {
			add("audit.hmac_key_file", "%v", err)
		}
	}
}

// AuditKey reads audit.hmac_key_file (nil, nil when unset).
func (c *Config) AuditKey() ([]byte, error) {
	if c.Audit.HMACKeyFile == "" {
		return nil, nil
	}
	return audit.ReadKeyFile(c.Audit.HMACKeyFile)
}

// writable checks that the gateway can append to path, leaving no file
// behind that was not there.
func writable(path string) error {
	st, err := os.Stat(path)
	switch {
	case err == nil && st.IsDir():
		return errors.New("is a directory")
	case err == nil:
		// Non-blocking: a FIFO without a reader must not hang the check.
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|syscall.O_NONBLOCK, 0)
		if err != nil {
			return fmt.Errorf("cannot be written: %w", cause(err))
		}
		return f.Close()
	case !errors.Is(err, fs.ErrNotExist):
		return cause(err)
	}
	dir := filepath.Dir(path)
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return fmt.Errorf("its directory %s does not exist", dir)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) { // created meanwhile
		return writable(path)
	}
	if err != nil {
		return fmt.Errorf("cannot be created: %w", cause(err))
	}
	_ = f.Close()
	return os.Remove(path)
}

// cause is err without the path an *fs.PathError repeats.
func cause(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
