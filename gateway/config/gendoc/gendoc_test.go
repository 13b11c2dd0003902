package main

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/acpgate/acpgate/gateway/config"
)

const root = "../../.."

func readDoc(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, Output))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestConfigurationDocFresh fails while docs/configuration.md is not what
// the generator writes from the code as it is.
func TestConfigurationDocFresh(t *testing.T) {
	want, err := Generate(root)
	if err != nil {
		t.Fatal(err)
	}
	if got := readDoc(t); got != string(want) {
		gl, wl := strings.Split(got, "\n"), strings.Split(string(want), "\n")
		i := 0
		for i < len(gl) && i < len(wl) && gl[i] == wl[i] {
			i++
		}
		at := func(l []string) string {
			if i < len(l) {
				return l[i]
			}
			return "(end of file)"
		}
		t.Fatalf("%s is stale (line %d is %q, the code makes it %q): run `go run ./gateway/config/gendoc` from the repository's root",
			Output, i+1, at(gl), at(wl))
	}
}

// configKeys lists every key the configuration accepts, by reflection over
// config.Config: its yaml tags, through nested structs, pointers, inline
// structs, lists of structs (path[].key) and maps of structs
// (path.<name>.key).
func configKeys(t reflect.Type, prefix string, out *[]string) {
	for i := range t.NumField() {
		f := t.Field(i)
		key, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if key == "-" || !f.IsExported() {
			continue
		}
		ft := deref(f.Type)
		if strings.Contains(opts, "inline") {
			configKeys(ft, prefix, out)
			continue
		}
		if key == "" {
			key = strings.ToLower(f.Name)
		}
		path := prefix + key
		*out = append(*out, path)
		switch {
		case ft.Kind() == reflect.Struct:
			configKeys(ft, path+".", out)
		case ft.Kind() == reflect.Slice && deref(ft.Elem()).Kind() == reflect.Struct:
			configKeys(deref(ft.Elem()), path+"[].", out)
		case ft.Kind() == reflect.Map && deref(ft.Elem()).Kind() == reflect.Struct:
			configKeys(deref(ft.Elem()), path+".<name>.", out)
		}
	}
}

func deref(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

// missing are the keys doc does not name (in backticks).
func missing(doc string, keys []string) []string {
	var out []string
	for _, k := range keys {
		if !strings.Contains(doc, "`"+k+"`") {
			out = append(out, k)
		}
	}
	return out
}

// TestConfigurationDocNamesEveryKey checks that the reference names every
// key the configuration accepts, found by reflection and not by the
// generator's reading of the source.
func TestConfigurationDocNamesEveryKey(t *testing.T) {
	var keys []string
	configKeys(reflect.TypeFor[config.Config](), "", &keys)
	for _, k := range []string{"listen", "agents.<name>.pool.min_idle", "tenants[].permissions[].decide", "tenants[].agent_env.<name>.file",
		"observability.tracing.headers", "policy.models.allow"} {
		if !slices.Contains(keys, k) {
			t.Fatalf("the reflection walk misses %s: %v", k, keys)
		}
	}
	doc := readDoc(t)
	if m := missing(doc, keys); len(m) > 0 {
		t.Errorf("%s does not name %d keys the configuration accepts: %s", Output, len(m), strings.Join(m, ", "))
	}
	// The check can fail: a reference without one key's heading misses it.
	cut := strings.Replace(doc, "`pool.idle_timeout`", "`pool.idle`", -1)
	if m := missing(cut, keys); !slices.Equal(m, []string{"pool.idle_timeout"}) {
		t.Errorf("with pool.idle_timeout cut out, missing = %v", m)
	}
}

// exampleKeys lists the keys the example file sets, as paths of the
// reference, walking the YAML beside the configuration's type.
func exampleKeys(t *testing.T, n *yaml.Node, typ reflect.Type, prefix string, out *[]string) {
	t.Helper()
	typ = deref(typ)
	if n.Kind != yaml.MappingNode || typ.Kind() != reflect.Struct {
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, val := n.Content[i].Value, n.Content[i+1]
		f, ok := fieldByKey(typ, key)
		if !ok {
			t.Errorf("%s sets %s%s, which is not a setting", Example, prefix, key)
			continue
		}
		path := prefix + key
		*out = append(*out, path)
		ft := deref(f.Type)
		switch {
		case ft.Kind() == reflect.Struct:
			exampleKeys(t, val, ft, path+".", out)
		case ft.Kind() == reflect.Slice && deref(ft.Elem()).Kind() == reflect.Struct:
			for _, item := range val.Content {
				exampleKeys(t, item, ft.Elem(), path+"[].", out)
			}
		case ft.Kind() == reflect.Map && deref(ft.Elem()).Kind() == reflect.Struct && val.Kind == yaml.MappingNode:
			for j := 1; j < len(val.Content); j += 2 {
				exampleKeys(t, val.Content[j], ft.Elem(), path+".<name>.", out)
			}
		}
	}
}

func fieldByKey(t reflect.Type, key string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		k, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if strings.Contains(opts, "inline") {
			if g, ok := fieldByKey(deref(f.Type), key); ok {
				return g, true
			}
			continue
		}
		if k == key {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// TestConfigurationDocNamesExampleKeys checks that every key of the
// annotated example is in the reference.
func TestConfigurationDocNamesExampleKeys(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, Example))
	if err != nil {
		t.Fatal(err)
	}
	var n yaml.Node
	if err := yaml.Unmarshal(b, &n); err != nil {
		t.Fatal(err)
	}
	var keys []string
	exampleKeys(t, n.Content[0], reflect.TypeFor[config.Config](), "", &keys)
	if len(keys) < 100 || !slices.Contains(keys, "agents.<name>.pool.max_processes") || !slices.Contains(keys, "tenants[].root") {
		t.Fatalf("the example walk found %d keys: %v", len(keys), keys)
	}
	if m := missing(readDoc(t), keys); len(m) > 0 {
		t.Errorf("%s does not name %d keys %s sets: %s", Output, len(m), Example, strings.Join(m, ", "))
	}
}

// TestEverySettingDescribed checks that every setting the reference
// describes has a description and every value an example: a new field
// needs a doc comment (or a note), and an example in the example file (or
// a note) unless its default is one.
func TestEverySettingDescribed(t *testing.T) {
	entries, err := Entries(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Twin != "" {
			continue
		}
		if e.Doc == "" {
			t.Errorf("%s has no description: give its field a doc comment (gateway/config) or a note (gendoc/notes.md)", e.Path)
		}
		if e.Example == "" && !e.Section {
			t.Errorf("%s has no example: set it in %s or give it one in gendoc/notes.md", e.Path, Example)
		}
		if e.Change == "" || e.Type == "" {
			t.Errorf("%s: type %q, change %q", e.Path, e.Type, e.Change)
		}
	}
}

// TestExamplesParse checks that every example in the reference is a
// configuration the gateway accepts as far as its keys go (values such as
// paths are the deployment's).
func TestExamplesParse(t *testing.T) {
	entries, err := Entries(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Example == "" {
			continue
		}
		var c config.Config
		dec := yaml.NewDecoder(bytes.NewReader([]byte(e.Example)))
		dec.KnownFields(true)
		if err := dec.Decode(&c); err != nil {
			t.Errorf("%s: example does not decode: %v\n%s", e.Path, err, e.Example)
		}
	}
}
