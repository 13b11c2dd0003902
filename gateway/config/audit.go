package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Audit configures the audit trail.
type Audit struct {
	// File is where the trail goes: a path (JSON lines, appended, created
	// 0600) or "-" for standard output; "" = no audit trail. Each replica
	// writes its own. SIGHUP reopens it (after logrotate moved it).
	File string `yaml:"file"`
	// IncludePrompts adds a prompt's text to its event.
	IncludePrompts bool `yaml:"include_prompts"`
}

func (c *Config) validateAudit(add addFunc) {
	if f := c.Audit.File; f != "" && f != "-" {
		if err := writable(f); err != nil {
			add("audit.file", "%q: %v", f, err)
		}
	}
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
