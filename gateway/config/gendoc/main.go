// Command gendoc writes docs/configuration.md, the reference of every
// setting, from the configuration structs of package config: it parses
// their Go source (yaml tags, field types, doc comments), takes each
// setting's default from config.Default() (policy keys from
// policy.Default()), its example from deploy/acpgate.example.yaml, and
// merges in the hand-written text of intro.md. Where a field has no doc
// comment, the example file's comment above the key stands in.
//
// Run from the repository's root after changing a configuration struct:
//
//	go run ./gateway/config/gendoc
//
// (`go generate ./gateway/config` runs it too). TestConfigurationDoc
// fails while docs/configuration.md differs from what it would write.
package main

import (
	"bytes"
	_ "embed"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"log"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/acpgate/acpgate/gateway/config"
	"github.com/acpgate/acpgate/proxy/policy"
)

// intro is the hand-written text at the top of the reference.
//
//go:embed intro.md
var intro string

// notesText is hand-written text merged into the settings' entries, under
// a heading per setting (see its preamble).
//
//go:embed notes.md
var notesText string

// note is the hand-written text of one setting.
type note struct{ doc, example string }

// notes reads notesText: "## `path`", text, and at most one yaml block.
func notes() map[string]note {
	out := map[string]note{}
	for _, part := range strings.Split(notesText, "\n## `")[1:] {
		path, body, _ := strings.Cut(part, "`\n")
		var n note
		text, rest, fenced := strings.Cut(body, "```yaml\n")
		n.doc = strings.Join(strings.Fields(text), " ")
		if fenced {
			n.example, _, _ = strings.Cut(rest, "```")
		}
		out[path] = n
	}
	return out
}

// Output is where the reference goes, relative to the repository's root.
const Output = "docs/configuration.md"

// Example is the annotated example configuration the examples come from.
const Example = "deploy/acpgate.example.yaml"

// sources are the packages whose structs the configuration is made of.
var sources = []string{"gateway/config", "permrules"}

func main() {
	root := flag.String("root", ".", "the repository's root")
	out := flag.String("o", "", "where to write (default: <root>/"+Output+"; - for standard output)")
	flag.Parse()
	doc, err := Generate(*root)
	if err != nil {
		log.Fatalf("gendoc: %v", err)
	}
	switch *out {
	case "-":
		_, err = os.Stdout.Write(doc)
	case "":
		err = os.WriteFile(filepath.Join(*root, Output), doc, 0o644)
	default:
		err = os.WriteFile(*out, doc, 0o644)
	}
	if err != nil {
		log.Fatalf("gendoc: %v", err)
	}
}

// Entry is one setting of the reference.
type Entry struct {
	Path    string // YAML path: pool.max_processes, tenants[].root, agents.<name>.pool
	Type    string // as a reader says it
	Doc     string
	Default string // "" when there is none to state
	Change  string // what a SIGHUP does with a change to it
	Env     string // its ACPGATE_ variable, if it has one
	Example string // a YAML snippet that sets it
	Section bool   // it holds other settings
	// Twin is the path of the same setting where its struct was first
	// described (agents.<name>.pool.min_idle: pool.min_idle): such an
	// entry is listed in its section's table, not described again.
	Twin   string
	goPath []string
}

// field is one field of a struct as the source declares it.
type field struct {
	name, key string
	inline    bool
	typ       ast.Expr
	doc       string
	pkg       string
}

type parsed struct {
	structs map[string]*ast.StructType // by "pkg.Type"
	docs    map[string]string          // type docs, by "pkg.Type"
}

func parse(root string) (*parsed, error) {
	p := &parsed{structs: map[string]*ast.StructType{}, docs: map[string]string{}}
	fset := token.NewFileSet()
	for _, dir := range sources {
		files, err := os.ReadDir(filepath.Join(root, dir))
		if err != nil {
			return nil, err
		}
		pkgs := map[string][]*ast.File{}
		for _, fi := range files {
			if !strings.HasSuffix(fi.Name(), ".go") || strings.HasSuffix(fi.Name(), "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, filepath.Join(root, dir, fi.Name()), nil, parser.ParseComments)
			if err != nil {
				return nil, fmt.Errorf("parse %s: %w", dir, err)
			}
			pkgs[f.Name.Name] = append(pkgs[f.Name.Name], f)
		}
		for name, pkgFiles := range pkgs {
			for _, f := range pkgFiles {
				for _, d := range f.Decls {
					g, ok := d.(*ast.GenDecl)
					if !ok || g.Tok != token.TYPE {
						continue
					}
					for _, s := range g.Specs {
						ts := s.(*ast.TypeSpec)
						st, ok := ts.Type.(*ast.StructType)
						if !ok {
							continue
						}
						p.structs[name+"."+ts.Name.Name] = st
						doc := ts.Doc
						if doc == nil {
							doc = g.Doc
						}
						p.docs[name+"."+ts.Name.Name] = doc.Text()
					}
				}
			}
		}
	}
	if p.structs["config.Config"] == nil {
		return nil, fmt.Errorf("no struct Config in %s", sources[0])
	}
	return p, nil
}

func fieldsOf(st *ast.StructType, pkg string) []field {
	var out []field
	lastDoc := ""
	for _, f := range st.Fields.List {
		tag := ""
		if f.Tag != nil {
			tag, _ = strconv.Unquote(f.Tag.Value)
		}
		yt := reflect.StructTag(tag).Get("yaml")
		key, opts, _ := strings.Cut(yt, ",")
		if key == "-" {
			continue
		}
		doc := strings.TrimSpace(f.Doc.Text())
		if doc == "" {
			doc = strings.TrimSpace(f.Comment.Text())
		}
		names := f.Names
		if len(names) == 0 { // embedded
			out = append(out, field{inline: strings.Contains(opts, "inline"), typ: f.Type, doc: doc, pkg: pkg})
			continue
		}
		for _, n := range names {
			if !n.IsExported() {
				continue
			}
			d := doc
			// A field declared after a comment that names it shares it
			// ("RecycleAfterSessions and RecycleAfter retire ...").
			if d == "" && lastDoc != "" && regexp.MustCompile(`\b`+n.Name+`\b`).MatchString(lastDoc) {
				d = lastDoc
			}
			if doc != "" {
				lastDoc = doc
			}
			k := key
			if k == "" {
				k = strings.ToLower(n.Name)
			}
			out = append(out, field{name: n.Name, key: k, inline: strings.Contains(opts, "inline"), typ: f.Type, doc: d, pkg: pkg})
		}
	}
	return out
}

// walker builds the entries.
type walker struct {
	p       *parsed
	entries []*Entry
	first   map[string]string // where each named struct was first described: its path prefix
	twin    string            // while walking a struct described before: that prefix
	twinOf  string            // and the prefix it is walked at
}

// walkNamed walks a named struct (tname "pkg.Type", "" for an anonymous
// one); a struct described before is walked as a twin of the first.
func (w *walker) walkNamed(st *ast.StructType, pkg, tname, prefix string, goPath []string) {
	if tname == "" || w.twin != "" {
		w.walk(st, pkg, prefix, goPath)
		return
	}
	if first, ok := w.first[tname]; ok && first != prefix {
		w.twin, w.twinOf = first, prefix
		w.walk(st, pkg, prefix, goPath)
		w.twin, w.twinOf = "", ""
		return
	}
	w.first[tname] = prefix
	w.walk(st, pkg, prefix, goPath)
}

// named resolves a type expression to a struct of the parsed packages.
func (w *walker) named(e ast.Expr, pkg string) (*ast.StructType, string, string) {
	switch t := e.(type) {
	case *ast.Ident:
		if st := w.p.structs[pkg+"."+t.Name]; st != nil {
			return st, pkg, pkg + "." + t.Name
		}
	case *ast.SelectorExpr:
		if x, ok := t.X.(*ast.Ident); ok {
			if st := w.p.structs[x.Name+"."+t.Sel.Name]; st != nil {
				return st, x.Name, x.Name + "." + t.Sel.Name
			}
		}
	case *ast.StructType:
		return t, pkg, ""
	}
	return nil, "", ""
}

func (w *walker) walk(st *ast.StructType, pkg, prefix string, goPath []string) {
	fs := fieldsOf(st, pkg)
	names := map[string]string{}
	for _, f := range fs {
		if f.name != "" {
			names[f.name] = f.key
		}
	}
	for _, f := range fs {
		if f.inline || f.name == "" {
			// An embedded struct's keys are the outer one's own: described
			// where they are (agents.<name>.command, not as agent.command).
			if inner, ipkg, _ := w.named(f.typ, pkg); inner != nil {
				w.walk(inner, ipkg, prefix, goPath)
			}
			continue
		}
		path := prefix + f.key
		gp := append(slices.Clone(goPath), f.name)
		e := &Entry{Path: path, Doc: yamlNames(f.doc, names), goPath: gp}
		if w.twin != "" {
			e.Twin = w.twin + strings.TrimPrefix(path, w.twinOf)
		}
		w.entries = append(w.entries, e)
		t := f.typ
		if s, ok := t.(*ast.StarExpr); ok {
			t = s.X
		}
		if inner, ipkg, tname := w.named(t, pkg); inner != nil {
			e.Section, e.Type = true, "section"
			if e.Doc == "" {
				e.Doc = yamlNames(firstSentences(w.p.docs[tname]), names)
			}
			w.walkNamed(inner, ipkg, tname, path+".", gp)
			continue
		}
		switch tt := t.(type) {
		case *ast.ArrayType:
			if inner, ipkg, tname := w.named(tt.Elt, pkg); inner != nil {
				e.Section, e.Type = true, "list of sections"
				w.walkNamed(inner, ipkg, tname, path+"[].", append(gp, "[]"))
				continue
			}
		case *ast.MapType:
			v := tt.Value
			if s, ok := v.(*ast.StarExpr); ok {
				v = s.X
			}
			if inner, ipkg, tname := w.named(v, pkg); inner != nil {
				e.Section, e.Type = true, "map of sections, by name"
				w.walkNamed(inner, ipkg, tname, path+".<name>.", append(gp, "<name>"))
				continue
			}
		}
		e.Type = typeName(t)
	}
}

// firstSentences is a type's doc comment without its Go name at the start.
func firstSentences(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.Index(s, " "); i > 0 && s[:i] == strings.Fields(s)[0] && len(s[:i]) > 0 && s[0] >= 'A' && s[0] <= 'Z' {
		rest := s[i+1:]
		for _, verb := range []string{"is ", "are ", "says ", "configures ", "sizes ", "bound ", "bounds ", "tunes ", "confines ", "restricts ", "adds ", "turns "} {
			if strings.HasPrefix(rest, verb) {
				return "This section " + rest
			}
		}
	}
	return s
}

// yamlNames writes the Go names of a struct's fields in its comment as
// their YAML keys.
func yamlNames(doc string, names map[string]string) string {
	doc = strings.Join(strings.Fields(doc), " ")
	for _, n := range slices.Sorted(maps.Keys(names)) {
		doc = regexp.MustCompile(`\b`+n+`\b`).ReplaceAllString(doc, "`"+names[n]+"`")
	}
	return doc
}

func typeName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.Ident:
		switch t.Name {
		case "string":
			return "string"
		case "bool":
			return "boolean"
		case "int", "int64":
			return "integer"
		case "float64":
			return "number"
		case "Duration":
			return "duration (`30s`, `5m`, `720h`)"
		case "ByteSize":
			return "size (`1048576`, `512MiB`, `2GiB`, `64KB`)"
		}
		return t.Name
	case *ast.StarExpr:
		return typeName(t.X)
	case *ast.ArrayType:
		return "list of " + plural(typeName(t.Elt))
	case *ast.MapType:
		return "map of " + typeName(t.Key) + " to " + typeName(t.Value)
	case *ast.SelectorExpr:
		return t.Sel.Name
	}
	return fmt.Sprintf("%T", e)
}

func plural(s string) string {
	switch s {
	case "string":
		return "strings"
	case "integer":
		return "integers"
	}
	return s
}

// Generate returns the reference for the repository at root.
func Generate(root string) ([]byte, error) {
	entries, err := Entries(root)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.WriteString("<!-- Generated by `go run ./gateway/config/gendoc` from the structs of gateway/config,\n")
	b.WriteString("     deploy/acpgate.example.yaml and gateway/config/gendoc/intro.md. Do not edit. -->\n\n")
	b.WriteString(strings.TrimSpace(intro))
	b.WriteString("\n\n## Every top-level key\n\n| key | type | on SIGHUP |\n|---|---|---|\n")
	for _, e := range entries {
		if !strings.Contains(e.Path, ".") && !strings.Contains(e.Path, "[") {
			fmt.Fprintf(&b, "| [`%s`](#%s) | %s | %s |\n", e.Path, anchor(e.Path), e.Type, shortChange(e.Change))
		}
	}
	for i, e := range entries {
		if e.Twin != "" {
			continue // in its section's table
		}
		level := "###"
		if !strings.ContainsAny(e.Path, ".[") {
			level = "##"
		}
		fmt.Fprintf(&b, "\n%s `%s`\n\n", level, e.Path)
		facts := []string{"**Type:** " + e.Type}
		if e.Default != "" {
			facts = append(facts, "**Default:** "+e.Default)
		}
		facts = append(facts, "**Change:** "+e.Change)
		if e.Env != "" {
			facts = append(facts, "**Environment:** `"+e.Env+"`")
		}
		b.WriteString(strings.Join(facts, " · "))
		b.WriteString("\n")
		if e.Doc != "" {
			b.WriteString("\n" + wrap(e.Doc, 88) + "\n")
		}
		if e.Example != "" {
			b.WriteString("\n```yaml\n" + e.Example + "```\n")
		}
		var twins []*Entry
		for _, t := range entries[i+1:] {
			if t.Twin == "" || !strings.HasPrefix(t.Path, e.Path) {
				break
			}
			twins = append(twins, t)
		}
		if len(twins) > 0 {
			b.WriteString("\nIts keys, each as described at its twin:\n\n| key | as | change |\n|---|---|---|\n")
			for _, t := range twins {
				fmt.Fprintf(&b, "| `%s` | [`%s`](#%s) | %s |\n", t.Path, t.Twin, anchor(t.Twin), shortChange(t.Change))
			}
		}
	}
	return b.Bytes(), nil
}

// anchor is GitHub's anchor of a heading that is the path in backticks.
func anchor(path string) string {
	return strings.NewReplacer(".", "", "[", "", "]", "", "<", "", ">", "", "`", "").Replace(path)
}

func shortChange(c string) string {
	s, _, _ := strings.Cut(c, ":")
	s, _, _ = strings.Cut(s, " (")
	return s
}

func wrap(s string, width int) string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		if line != "" && len(line)+1+len(w) > width {
			lines = append(lines, line)
			line = w
			continue
		}
		if line != "" {
			line += " "
		}
		line += w
	}
	return strings.Join(append(lines, line), "\n")
}

// Entries lists every setting, in the order of the structs' fields.
func Entries(root string) ([]*Entry, error) {
	p, err := parse(root)
	if err != nil {
		return nil, err
	}
	w := &walker{p: p, first: map[string]string{}}
	// A struct the top level holds is described there, wherever else it
	// appears first (agents.<name>.pool is a twin of pool).
	for _, f := range fieldsOf(p.structs["config.Config"], "config") {
		t := f.typ
		if a, ok := t.(*ast.ArrayType); ok {
			if _, _, tname := w.named(a.Elt, "config"); tname != "" {
				w.first[tname] = f.key + "[]."
			}
			continue
		}
		if _, _, tname := w.named(t, "config"); tname != "" {
			w.first[tname] = f.key + "."
		}
	}
	w.walk(p.structs["config.Config"], "config", "", nil)
	ex, err := os.ReadFile(filepath.Join(root, Example))
	if err != nil {
		return nil, err
	}
	var exRoot yaml.Node
	if err := yaml.Unmarshal(ex, &exRoot); err != nil {
		return nil, fmt.Errorf("%s: %w", Example, err)
	}
	env := map[string]bool{}
	for _, n := range config.EnvNames() {
		env[n] = true
	}
	ns := notes()
	for path := range ns {
		if !slices.ContainsFunc(w.entries, func(e *Entry) bool { return e.Path == path }) {
			return nil, fmt.Errorf("notes.md: %s is not a setting", path)
		}
	}
	defaults := reflect.ValueOf(config.Default()).Elem()
	pol := reflect.ValueOf(policy.Default())
	for _, e := range w.entries {
		e.Change = change(e.Path)
		if name := config.EnvPrefix + strings.ToUpper(strings.ReplaceAll(e.Path, ".", "_")); env[name] {
			e.Env = name
		}
		e.Default = defaultOf(e, defaults, pol)
		node, comment, names := exampleNode(exRoot.Content[0], strings.Split(e.Path, "."))
		if e.Doc == "" {
			e.Doc = comment
		}
		n := ns[e.Path]
		if n.doc != "" {
			e.Doc = strings.TrimSpace(e.Doc + " " + n.doc)
		}
		if e.Example = example(e, node, names); e.Example == "" {
			e.Example = n.example
		}
	}
	return w.entries, nil
}

// change says what a reload (SIGHUP) does with a change to the setting,
// as gateway.Server.Reload decides: the keys it lists reload, every other
// one is refused until a restart (a new key is too, without being listed).
func change(path string) string {
	top, rest, _ := strings.Cut(path, ".")
	top = strings.TrimSuffix(top, "[]")
	switch {
	case path == "tenants":
		return "reload (but adding the first tenant or removing the last, which turns authentication on or off, needs a restart)"
	case top == "tenants", top == "policy", top == "sharing", top == "permissions", top == "default_agent":
		return "reload"
	case path == "agents":
		return "reload adds and removes agents; an existing agent's settings other than `policy` need a restart"
	case top == "agents" && strings.HasPrefix(strings.TrimPrefix(rest, "<name>."), "policy"):
		return "reload"
	case top == "agents":
		return "restart (or remove the agent in one reload and add it back in the next)"
	case path == "admin.tokens_sha256":
		return "reload"
	case path == "admin":
		return "restart to turn the admin API on or off; its `tokens_sha256` reload"
	}
	return "restart (a reload that changes it is refused)"
}

// defaultOf states a setting's default.
func defaultOf(e *Entry, defaults, pol reflect.Value) string {
	path := e.Path
	switch {
	case strings.HasPrefix(path, "agents.<name>."):
		rest := strings.TrimPrefix(path, "agents.<name>.")
		switch {
		case strings.HasPrefix(rest, "pool"):
			return "the top-level `" + rest + "`"
		case strings.HasPrefix(rest, "policy"):
			return "the top-level `" + rest + "`"
		case rest == "command":
			return "none: the built-in demo agent"
		case strings.HasPrefix(rest, "sandbox"):
			return "none"
		}
		return "`agent." + rest + "`"
	case strings.HasPrefix(path, "tenants[].policy") || strings.HasPrefix(path, "tenants[].sharing") || path == "tenants[].permissions":
		return "the top-level `" + strings.TrimPrefix(path, "tenants[].") + "`"
	case strings.HasPrefix(path, "policy.") && !e.Section:
		return policyDefault(e.goPath[1:], pol)
	case strings.HasPrefix(path, "sharing."):
		return map[string]string{"sharing.attach": "`same_subject`", "sharing.read_only_for_others": "`false`"}[path]
	case strings.Contains(path, "[]") || strings.Contains(path, "<name>") || e.Section:
		return ""
	}
	v := defaults
	for _, n := range e.goPath {
		if v.Kind() == reflect.Pointer {
			if v.IsNil() {
				return "unset"
			}
			v = v.Elem()
		}
		v = v.FieldByName(n)
	}
	return show(v, path)
}

// policyDefault reads the built-in policy's value of a policy key: the
// field of the same Go path in policy.Policy (Extensions.Allow is
// Policy.Extensions).
func policyDefault(goPath []string, pol reflect.Value) string {
	v := pol
	for _, n := range goPath {
		if v.Kind() != reflect.Struct {
			break
		}
		f := v.FieldByName(n)
		if !f.IsValid() {
			break // Extensions.Allow: the list is Extensions itself
		}
		v = f
	}
	if v.Kind() == reflect.Struct {
		return ""
	}
	s := show(v, "")
	if s == "none" && (goPath[0] == "Models" || goPath[0] == "Modes") {
		return "unset: every one"
	}
	if s == "none" && goPath[0] == "Meta" {
		return "unset: only `traceparent`, `tracestate` and `acpgate`"
	}
	if s == "none" && goPath[0] == "MCP" {
		return "unset: any host"
	}
	return s
}

func show(v reflect.Value, path string) string {
	if !v.IsValid() {
		return ""
	}
	if v.Type() == reflect.TypeOf(config.Duration(0)) {
		return "`" + shortDuration(time.Duration(v.Int())) + "`"
	}
	switch v.Kind() {
	case reflect.String:
		if v.String() == "" {
			return "unset"
		}
		return "`" + v.String() + "`"
	case reflect.Bool:
		return "`" + strconv.FormatBool(v.Bool()) + "`"
	case reflect.Int, reflect.Int64:
		n := v.Int()
		s := "`" + strconv.FormatInt(n, 10) + "`"
		if strings.HasSuffix(path, "_bytes") && n >= 1<<20 && n%(1<<20) == 0 {
			s += fmt.Sprintf(" (%d MiB)", n>>20)
		}
		return s
	case reflect.Float64:
		return "`" + strconv.FormatFloat(v.Float(), 'g', -1, 64) + "`"
	case reflect.Slice:
		if v.Len() == 0 {
			return "none"
		}
		var parts []string
		for i := range v.Len() {
			parts = append(parts, fmt.Sprint(v.Index(i).Interface()))
		}
		return "`[" + strings.Join(parts, ", ") + "]`"
	case reflect.Map, reflect.Pointer:
		if v.IsNil() || v.Len() == 0 {
			return "none"
		}
	}
	return ""
}

func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// exampleNode finds a setting in the example file: its value node, the
// comment above its key, and the names it took for <name> (a map's first
// entry that sets the rest of the path; a list's first entry stands for
// []).
func exampleNode(n *yaml.Node, path []string) (*yaml.Node, string, []string) {
	if len(path) == 0 {
		return n, "", nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, "", nil
	}
	seg := path[0]
	if seg == "<name>" {
		for j := 0; j+1 < len(n.Content); j += 2 {
			if got, c, names := exampleNode(n.Content[j+1], path[1:]); got != nil {
				if len(path) == 1 {
					c = cleanComment(n.Content[j].HeadComment)
				}
				return got, c, append([]string{n.Content[j].Value}, names...)
			}
		}
		return nil, "", nil
	}
	list := strings.HasSuffix(seg, "[]")
	seg = strings.TrimSuffix(seg, "[]")
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value != seg {
			continue
		}
		v, comment := n.Content[i+1], cleanComment(n.Content[i].HeadComment)
		if list {
			if v.Kind != yaml.SequenceNode {
				return nil, "", nil
			}
			for _, item := range v.Content {
				if got, c, names := exampleNode(item, path[1:]); got != nil {
					if len(path) == 1 {
						c = comment
					}
					return got, c, names
				}
			}
			return nil, "", nil
		}
		if len(path) == 1 {
			return v, comment, nil
		}
		return exampleNode(v, path[1:])
	}
	return nil, "", nil
}

func cleanComment(c string) string {
	var lines []string
	for _, l := range strings.Split(c, "\n") {
		l = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "#"))
		if l == "" && len(lines) > 0 {
			lines = lines[:0] // keep the paragraph right above the key
			continue
		}
		lines = append(lines, l)
	}
	return strings.TrimSpace(strings.Join(lines, " "))
}

// example is a YAML snippet that sets the setting: its value in the
// example file, else its default.
func example(e *Entry, node *yaml.Node, names []string) string {
	if e.Section && node != nil && (len(node.Content) > 12 || strings.Count(nodeText(node), "\n") > 12) {
		node = nil // a whole section is the sum of its keys' examples
	}
	if e.Section && node == nil {
		return ""
	}
	var val *yaml.Node
	if node != nil {
		val = stripComments(node)
	} else {
		if strings.ContainsAny(e.Path, "<[") {
			return "" // its default is another key's
		}
		val = &yaml.Node{}
		d := strings.Trim(e.Default, "`")
		if e.Default == "" || strings.Contains(e.Default, " ") && !strings.HasPrefix(e.Default, "`") || e.Default == "unset" || e.Default == "none" {
			return ""
		}
		if strings.Contains(e.Default, " (") {
			d = strings.Trim(strings.Split(e.Default, " (")[0], "`")
		}
		if err := yaml.Unmarshal([]byte(d), val); err != nil || len(val.Content) == 0 {
			return ""
		}
		val = val.Content[0]
	}
	segs := strings.Split(e.Path, ".")
	for i := len(segs) - 1; i >= 0; i-- {
		s := segs[i]
		if s == "<name>" {
			s = "NAME"
			if len(names) > 0 {
				s = names[len(names)-1]
				names = names[:len(names)-1]
			}
		}
		wrapped := &yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{{Kind: yaml.ScalarNode, Value: strings.TrimSuffix(s, "[]")}, val}}
		if strings.HasSuffix(s, "[]") {
			wrapped.Content[1] = &yaml.Node{Kind: yaml.SequenceNode, Content: []*yaml.Node{val}}
		}
		val = wrapped
	}
	return nodeText(val)
}

func nodeText(n *yaml.Node) string {
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(n); err != nil {
		return ""
	}
	return b.String()
}

func stripComments(n *yaml.Node) *yaml.Node {
	c := *n
	c.HeadComment, c.LineComment, c.FootComment = "", "", ""
	c.Content = nil
	for _, k := range n.Content {
		c.Content = append(c.Content, stripComments(k))
	}
	if c.Kind == yaml.SequenceNode || c.Kind == yaml.MappingNode {
		c.Style = n.Style
	}
	return &c
}
