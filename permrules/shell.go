package permrules

import (
	"path"
	"strings"
)

// Titles as claude-code-acp writes them: a Bash call's title is its command
// in backticks, each backtick of the command escaped as \` (so "`ls`");
// other tools put a path in backticks ("Edit `/workspace/a.md`") or after
// a word ("Read /workspace/a.md"). The backticks that delimit these spans
// are the title's own syntax; what is inside them, and around them, is
// what the shell or the tool gets.

// openSpans is title with its backtick spans opened: each span's
// delimiters dropped and its \` made a backtick again. false when a span
// is left open (the title is not one these agents write).
func openSpans(title string) (string, bool) {
	if strings.IndexByte(title, '`') < 0 {
		return title, true
	}
	var b strings.Builder
	in := false
	for i := 0; i < len(title); i++ {
		switch c := title[i]; {
		case c == '`':
			in = !in
		case in && c == '\\' && i+1 < len(title) && title[i+1] == '`':
			b.WriteByte('`')
			i++
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), !in
}

// commandOf is the command of a title wholly in backticks ("`…`"), its \`
// made backticks again; false for any other title.
func commandOf(title string) (string, bool) {
	if len(title) < 2 || title[0] != '`' || title[len(title)-1] != '`' {
		return "", false
	}
	return strings.ReplaceAll(title[1:len(title)-1], "\\`", "`"), true
}

// controlOps are the bytes that end, join, group or redirect commands in
// a POSIX shell or start a substitution: an allow rule never matches a
// title (its spans opened) holding one. '$' counts when it starts a
// substitution or a quoted string that can spell any character: "$(",
// "${", "$[", "$'", `$"`.
const controlOps = ";&|()<>`"

// allowable reports whether an allow rule may match title at all: its
// spans pair up, it holds no control character, no control operator, no
// ".." path segment (nor one a shell glob or brace could expand to ".."),
// and every word naming a path inside the root names it plainly (no quote,
// escape, glob, brace, "~" or "$") and is the path it resolves to: a path
// through a symbolic link, out of the root, or that cannot be resolved is
// not allowable. Anything it cannot read is not allowable.
func allowable(title string, sc *scope) bool {
	if strings.ContainsFunc(title, isControl) {
		return false
	}
	text, ok := openSpans(title)
	if !ok || strings.ContainsAny(text, controlOps) {
		return false
	}
	for i := 0; i+1 < len(text); i++ {
		if text[i] == '$' && strings.IndexByte(`({['"`, text[i+1]) >= 0 {
			return false
		}
	}
	// Words as the shell splits them: at spaces and tabs only (a no-break
	// space is part of a word); an allow glob's '*' takes neither, so a
	// title it matches has no more words than the glob.
	for w := range strings.FieldsFuncSeq(text, func(r rune) bool { return r == ' ' || r == '\t' }) {
		if !plainWord(w, sc) {
			return false
		}
	}
	return true
}

// plainWord reports whether one word of an allowable title is: no ".."
// segment once quotes and escapes are dropped (nor ".?", ".*", ".[",
// ".{", which a shell may expand to ".."); no "~" or "$" in a bare word,
// and a bare word the shell takes as it is names, from the session's cwd,
// a path that resolves to itself; and, if it holds a '/', no character a
// shell expands, and the path after its last '=' (relative ones taken from
// the session's cwd) inside the root resolves to itself.
func plainWord(w string, sc *scope) bool {
	for part := range strings.FieldsFuncSeq(unquote(w), func(r rune) bool { return r == '/' || r == '=' || r == ':' }) {
		if len(part) >= 2 && part[0] == '.' && strings.IndexByte(".?*[{", part[1]) >= 0 {
			return false
		}
	}
	if strings.IndexByte(w, '/') < 0 {
		// A bare word is a path too: "notes" may be a link out of the
		// root, and "~" or "$HOME" names one the shell expands.
		if strings.HasPrefix(w, "~") || strings.Contains(w, "$") {
			return false
		}
		if p := w[strings.LastIndexByte(w, '=')+1:]; p != "" && sc.m != nil && path.IsAbs(sc.cwd) &&
			!strings.ContainsAny(p, `*?[]{}$'"\`) {
			return sc.plain(path.Join(sc.cwd, p))
		}
		return true
	}
	if strings.ContainsAny(w, `*?[]{}~$'"\`) {
		return false
	}
	p := w[strings.LastIndexByte(w, '=')+1:]
	if p == "" {
		return true
	}
	if !path.IsAbs(p) {
		if !path.IsAbs(sc.cwd) {
			return false
		}
		p = path.Join(sc.cwd, p)
	}
	return sc.plain(p)
}

// commandForms are the titles a deny or ask rule is matched against: the
// title, and each simple command in it (split at ; & | ( ) < > and line
// ends, and in a command title ("`…`") at its backticks too; a split
// inside quotes too), trimmed, and once more normalized as the shell would
// run it: leading variable assignments, reserved words (! { if then else
// elif do while until) and wrappers (command, builtin, exec, env, sudo,
// doas, nohup, time, nice, timeout, stdbuf, with their options) dropped,
// quotes and backslashes removed, the command's path cut to its base name
// ("/bin/rm" → "rm"), spaces collapsed; in a command title, each in
// backticks again. Their total length is at most three times the title's.
func commandForms(title string) []string {
	forms := []string{title}
	trimmed := strings.TrimSpace(title)
	cmd, wrapped := commandOf(trimmed)
	seps, quote := ";&|()<>\n\r", ""
	if wrapped {
		seps, quote = ";&|()<>`\n\r", "`"
	} else {
		cmd = trimmed
	}
	for _, piece := range strings.FieldsFunc(cmd, func(r rune) bool { return strings.ContainsRune(seps, r) }) {
		piece = strings.TrimSpace(piece)
		if piece == "" {
			continue
		}
		if f := quote + piece + quote; f != title {
			forms = append(forms, f)
		}
		if n := normalize(piece); n != piece && n != "" {
			forms = append(forms, quote+n+quote)
		}
	}
	return forms
}

// wrappers are the commands that run the command that follows them, with
// the options of each that take a value ("-u root"), as letters.
var wrappers = map[string]string{
	"command": "", "builtin": "", "exec": "a", "env": "uC", "sudo": "ughpCDrtUTR", "doas": "uC",
	"nohup": "", "time": "", "nice": "n", "timeout": "sk", "stdbuf": "ioe",
}

// reserved are the shell's reserved words that may come before a command.
var reserved = map[string]bool{"!": true, "{": true, "if": true, "then": true, "else": true, "elif": true, "do": true, "while": true, "until": true}

// normalize is one simple command as commandForms says.
func normalize(piece string) string {
	words := strings.Fields(piece)
	for i, w := range words {
		words[i] = unquote(w)
	}
	for len(words) > 0 {
		w := words[0]
		if reserved[w] || isAssignment(w) {
			words = words[1:]
			continue
		}
		opts, ok := wrappers[w]
		if !ok {
			break
		}
		words = words[1:]
		for len(words) > 0 && (strings.HasPrefix(words[0], "-") || w == "env" && isAssignment(words[0])) {
			o := words[0]
			words = words[1:]
			if o == "--" {
				break
			}
			if len(o) == 2 && strings.IndexByte(opts, o[1]) >= 0 && len(words) > 0 {
				words = words[1:]
			}
		}
		if w == "timeout" && len(words) > 0 {
			words = words[1:] // its duration
		}
	}
	if len(words) == 0 {
		return ""
	}
	if i := strings.LastIndexByte(words[0], '/'); i >= 0 && i < len(words[0])-1 {
		words[0] = words[0][i+1:]
	}
	return strings.Join(words, " ")
}

// unquote is w with its quotes and backslashes dropped.
func unquote(w string) string {
	return strings.Map(func(r rune) rune {
		if r == '\'' || r == '"' || r == '\\' {
			return -1
		}
		return r
	}, w)
}

// isAssignment reports a shell variable assignment, NAME=value.
func isAssignment(w string) bool {
	name, _, ok := strings.Cut(w, "=")
	if !ok || name == "" {
		return false
	}
	for i, r := range name {
		if r != '_' && (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') && (i == 0 || r < '0' || r > '9') {
			return false
		}
	}
	return true
}
