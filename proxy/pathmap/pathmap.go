// Package pathmap maps file-system paths and file:// URIs between a tenant's
// virtual root (what clients see, e.g. /workspace) and its host root (the
// directory the agent really works in, e.g. /srv/tenants/acme).
//
// ACP requires every protocol path to be absolute (PROTOCOL.md §5), so
// relative paths are refused rather than resolved against some cwd.
//
// # Directions
//
// Client → agent ([Mapper.ToAgent], [Mapper.URIToAgent]) is the security
// boundary: the input is untrusted. A path is accepted only when, after
// lexical cleaning, it lies under the virtual root, and when the host path
// it maps to does not reach outside the host root through a symbolic link.
// The symlink check walks the mapped host path component by component:
// every existing component is resolved (links are followed, up to 40 as the
// kernel allows), and the first component that does not exist ends the walk,
// the rest being appended lexically. So a file about to be created is
// accepted when its nearest existing ancestor resolves inside the root, and a
// dangling symlink is judged by where it points. The path handed to the agent
// is the cleaned host path, not the resolved one: the agent keeps seeing
// paths under its root.
//
// Agent → client ([Mapper.ToClient], [Mapper.URIToClient]) is purely lexical
// and runs on the relay's hot path: it touches no file system, and a path
// that is already clean costs at most the one allocation of the result
// (none at all when the virtual root equals the host root).
//
// # Decisions
//
//   - Paths are slash-separated byte strings, compared case-sensitively.
//     A backslash is an ordinary byte. Windows is not supported: [New]
//     refuses to build a Mapper there.
//   - Cleaning is lexical ([path.Clean]): "//", "." and ".." are folded
//     before the containment test, so /workspace/../etc is outside, and
//     /workspace2 or /workspacefoo are never inside /workspace.
//   - A host root of "/" is refused (a misconfiguration); a virtual root of
//     "/" is allowed, and then every absolute client path maps under the
//     host root.
//   - The host root is resolved with [filepath.EvalSymlinks] once, in [New];
//     [Mapper.Root] returns the resolved directory, which is what the agent
//     must be given as its cwd. The virtual root defaults to that resolved
//     root, which makes the mapping the identity.
//   - A component that cannot be examined (permission denied, name too long,
//     a symlink loop) makes ToAgent fail closed with [ErrResolve].
//   - The check is made at call time. It cannot see bind mounts or hard
//     links, and it does not stop the agent itself from swapping a directory
//     for a symlink afterwards: it keeps client-supplied paths from pointing
//     through existing links out of the workspace.
//   - File URIs: see [Mapper.URIToAgent]. A percent-encoded slash (%2F) inside
//     a segment is rejected ([ErrEncodedSlash]) rather than decoded into a
//     separator, and %00 is rejected too. Output URIs are re-encoded in
//     canonical form: scheme "file", empty authority (file:///...), every
//     byte outside RFC 3986 pchar escaped; the query and fragment are kept
//     verbatim.
//   - A bare absolute path where a URI is expected (no scheme, leading "/")
//     is mapped as a path in both directions, so a sloppy agent cannot leak
//     host paths through a URI field and a sloppy client still works.
//   - Paths outside the root are shown to clients as [Redact] gives them:
//     "/<outside-workspace>/" and the base name.
//
// A Mapper is immutable and safe for concurrent use.
package pathmap

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
)

// Reasons a path or URI is refused. A [*PathError] wraps exactly one of them
// (test with [errors.Is]).
var (
	ErrEmpty         = errors.New("path is empty")
	ErrRelative      = errors.New("path is not absolute")
	ErrNUL           = errors.New("path contains a NUL byte")
	ErrOutside       = errors.New("path is outside the workspace")
	ErrSymlinkEscape = errors.New("path resolves through a symbolic link to outside the workspace")
	ErrResolve       = errors.New("path cannot be resolved")
	ErrNotURI        = errors.New("not an absolute URI")
	ErrBadURI        = errors.New("malformed file URI")
	ErrRemoteHost    = errors.New("file URI names a remote host")
	ErrEncodedSlash  = errors.New("file URI encodes a slash (%2F) inside a path segment")
)

// PathError is a client path or URI that cannot be mapped. Its message names
// the rejected value and the reason, never the host layout; the caller adds
// the field name.
type PathError struct {
	Path string // the rejected path or URI, as given
	Err  error  // the reason: one of the Err variables of this package
	// Root is the virtual root, set with ErrOutside so the message tells the
	// user where paths must be.
	Root string
	// Cause is the file-system error behind ErrResolve. It may name host
	// paths: log it, do not send it to the client. Error() leaves it out.
	Cause error
}

// maxQuoted bounds how much of the rejected value Error() repeats.
const maxQuoted = 512

func (e *PathError) Error() string {
	p := e.Path
	if len(p) > maxQuoted {
		p = p[:maxQuoted] + "..."
	}
	msg := strconv.Quote(p) + ": " + e.Err.Error()
	if e.Root != "" {
		msg += " " + strconv.Quote(e.Root)
	}
	return msg
}

// Unwrap gives the reason and, when there is one, the file-system cause.
func (e *PathError) Unwrap() []error {
	if e.Cause != nil {
		return []error{e.Err, e.Cause}
	}
	return []error{e.Err}
}

// Mapper maps paths between a tenant's virtual root (what clients see) and
// its host root (where the agent works).
type Mapper struct {
	root      string // resolved, clean, absolute, never "/"
	vroot     string // clean, absolute
	vrootURI  string // vroot percent-encoded; "" when vroot is "/"
	identity  bool   // root == vroot
	vrootOnly bool   // vroot == "/"
}

// New builds a Mapper. root and virtualRoot must be absolute; both are
// cleaned. root is resolved with [filepath.EvalSymlinks] (it must exist and
// be a directory, and may not be "/"). virtualRoot defaults to the resolved
// root when "".
func New(root, virtualRoot string) (*Mapper, error) {
	if runtime.GOOS == "windows" {
		return nil, errors.New("pathmap: Windows paths are not supported")
	}
	if err := checkAbs(root); err != nil {
		return nil, fmt.Errorf("pathmap: root %q: %w", root, err)
	}
	r := path.Clean(root)
	if r == "/" {
		return nil, errors.New(`pathmap: root "/" is not allowed: a tenant root must be a directory of its own`)
	}
	resolved, err := filepath.EvalSymlinks(r)
	if err != nil {
		return nil, fmt.Errorf("pathmap: root: %w", err)
	}
	fi, err := os.Stat(resolved)
	if err != nil {
		return nil, fmt.Errorf("pathmap: root: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("pathmap: root %q is not a directory", root)
	}
	resolved = path.Clean(resolved)
	if resolved == "/" {
		return nil, fmt.Errorf(`pathmap: root %q resolves to "/": a tenant root must be a directory of its own`, root)
	}
	v := resolved
	if virtualRoot != "" {
		if err := checkAbs(virtualRoot); err != nil {
			return nil, fmt.Errorf("pathmap: virtual root %q: %w", virtualRoot, err)
		}
		v = path.Clean(virtualRoot)
	}
	return newMapper(resolved, v), nil
}

// newMapper builds a Mapper from a checked, resolved root and a clean
// virtual root.
func newMapper(root, vroot string) *Mapper {
	m := &Mapper{root: root, vroot: vroot, identity: root == vroot, vrootOnly: vroot == "/"}
	if !m.vrootOnly {
		m.vrootURI = escapePath(vroot)
	}
	return m
}

// Root is the host root, cleaned and resolved: the directory the agent works in.
func (m *Mapper) Root() string { return m.root }

// VirtualRoot is the cleaned virtual root clients see.
func (m *Mapper) VirtualRoot() string { return m.vroot }

// checkAbs reports why p is not a usable absolute path.
func checkAbs(p string) error {
	switch {
	case p == "":
		return ErrEmpty
	case strings.IndexByte(p, 0) >= 0:
		return ErrNUL
	case p[0] != '/':
		return ErrRelative
	}
	return nil
}

// cutRoot returns the part of the clean absolute path c below root: "" for
// root itself, "/rest" for a path under it. ok is false when c is not root
// or under it.
func cutRoot(c, root string) (tail string, ok bool) {
	if root == "/" {
		if c == "/" {
			return "", true
		}
		return c, true
	}
	if !strings.HasPrefix(c, root) {
		return "", false
	}
	tail = c[len(root):]
	if tail == "" || tail[0] == '/' {
		return tail, true
	}
	return "", false
}

// ToAgent maps a client path to the host path. It fails with a *PathError
// for an empty or relative path or one holding a NUL byte ([ErrEmpty],
// [ErrRelative], [ErrNUL]); for a path outside the virtual root after
// lexical cleaning ([ErrOutside]); for one whose host path resolves through
// a symlink, dangling or not, to outside the host root ([ErrSymlinkEscape]);
// and for one that cannot be examined ([ErrResolve]). The result is the
// cleaned host path, not the symlink-resolved one.
func (m *Mapper) ToAgent(p string) (string, error) {
	if err := checkAbs(p); err != nil {
		return "", &PathError{Path: p, Err: err}
	}
	tail, ok := cutRoot(path.Clean(p), m.vroot)
	if !ok {
		return "", &PathError{Path: p, Err: ErrOutside, Root: m.vroot}
	}
	resolved, err := resolve(m.root, tail)
	if err != nil {
		return "", &PathError{Path: p, Err: ErrResolve, Cause: err}
	}
	if _, ok := cutRoot(resolved, m.root); !ok {
		return "", &PathError{Path: p, Err: ErrSymlinkEscape}
	}
	return m.root + tail, nil
}

// Resolve is the client path p resolves to: p mapped to the host, its
// symlinks followed as [Mapper.ToAgent] follows them (a missing rest is
// appended lexically), and mapped back under the virtual root. It fails as
// ToAgent does: [ErrOutside], [ErrSymlinkEscape] for a path that resolves
// outside the host root, [ErrResolve] for one that cannot be examined.
// For a path reached through no symlink, the result is path.Clean(p).
func (m *Mapper) Resolve(p string) (string, error) {
	if err := checkAbs(p); err != nil {
		return "", &PathError{Path: p, Err: err}
	}
	tail, ok := cutRoot(path.Clean(p), m.vroot)
	if !ok {
		return "", &PathError{Path: p, Err: ErrOutside, Root: m.vroot}
	}
	resolved, err := resolve(m.root, tail)
	if err != nil {
		return "", &PathError{Path: p, Err: ErrResolve, Cause: err}
	}
	rtail, ok := cutRoot(resolved, m.root)
	if !ok {
		return "", &PathError{Path: p, Err: ErrSymlinkEscape}
	}
	return m.virtual(rtail), nil
}

// maxLinks is how many symlinks resolve follows, as Linux's MAXSYMLINKS.
const maxLinks = 40

var errTooManyLinks = errors.New("too many levels of symbolic links")

// resolve evaluates the symlinks of base+rest as far as the path exists.
// base is an existing, symlink-free, clean absolute directory; rest is ""
// or a clean "/a/b". Each existing component is resolved (links followed,
// relative targets taken from the link's directory); at the first one that
// does not exist, or that sits below a non-directory, the remaining path is
// appended lexically. A dangling link thus resolves to where it points.
func resolve(base, rest string) (string, error) {
	resolved := base
	links := 0
	for rest != "" {
		var comp string
		comp, rest, _ = strings.Cut(rest, "/")
		switch comp {
		case "", ".":
			continue
		case "..":
			resolved = path.Dir(resolved)
			continue
		}
		next := path.Join(resolved, comp)
		fi, err := os.Lstat(next)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || isNotDir(err) {
				return path.Join(next, rest), nil
			}
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			resolved = next
			continue
		}
		links++
		if links > maxLinks {
			return "", &fs.PathError{Op: "resolve", Path: next, Err: errTooManyLinks}
		}
		target, err := os.Readlink(next)
		if err != nil {
			return "", err
		}
		if path.IsAbs(target) {
			resolved = "/"
		}
		if rest != "" {
			target += "/" + rest
		}
		rest = target
	}
	return resolved, nil
}

// isNotDir reports a lookup below a non-directory (ENOTDIR): the rest of
// the path cannot exist, like ENOENT.
func isNotDir(err error) bool { return errors.Is(err, syscall.ENOTDIR) }

// ToClient maps a host path to the client's view. It is purely lexical.
// When p is not under the host root after cleaning (or is not absolute),
// ok is false and the result is [Redact](p), safe to show the client.
func (m *Mapper) ToClient(p string) (string, bool) {
	if p == "" || p[0] != '/' {
		return Redact(p), false
	}
	c := p
	if !isCleanAbs(p) {
		c = path.Clean(p)
	}
	tail, ok := cutRoot(c, m.root)
	if !ok {
		return Redact(p), false
	}
	if m.identity {
		return c, true
	}
	return m.virtual(tail), true
}

// isCleanAbs reports whether the absolute path p equals path.Clean(p),
// faster than cleaning it: no "//", no "." or ".." segment, no trailing "/".
func isCleanAbs(p string) bool {
	if len(p) > 1 && p[len(p)-1] == '/' || strings.Contains(p, "//") {
		return false
	}
	for s := p; ; {
		i := strings.Index(s, "/.")
		if i < 0 {
			return true
		}
		s = s[i+2:]
		if s == "" || s[0] == '/' || s[0] == '.' && (len(s) == 1 || s[1] == '/') {
			return false
		}
	}
}

// virtual is the client path for a tail below the host root.
func (m *Mapper) virtual(tail string) string {
	switch {
	case m.vrootOnly:
		if tail == "" {
			return "/"
		}
		return tail
	case tail == "":
		return m.vroot
	}
	return m.vroot + tail
}

// outside is the stand-in for the host directory of a path outside the root.
const outside = "/<outside-workspace>"

// Redact returns the client-visible stand-in for a host path outside the
// root: "/<outside-workspace>/<basename>". Only the base name is kept
// (useful to the user, and it leaks no host layout); a path with no base
// name ("/", "", "..") gives "/<outside-workspace>".
func Redact(p string) string {
	if b := keptBase(p); b != "" {
		return outside + "/" + b
	}
	return outside
}

// keptBase is the base name a redaction keeps of p: "" when p has none
// ("/", "", "..").
func keptBase(p string) string {
	b := path.Base(path.Clean(p))
	switch b {
	case "/", ".", "..":
		return ""
	}
	return b
}
