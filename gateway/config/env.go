package config

import (
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"
)

// EnvPrefix starts every environment variable the gateway reads.
const EnvPrefix = "ACPGATE_"

// EnvNames lists the variables ApplyEnv understands, one per scalar
// setting: the YAML path upper-cased and joined with "_", after the prefix
// (pool.max_processes → ACPGATE_POOL_MAX_PROCESSES). Lists (tenants) and
// maps (agent.env) come from the file only.
func EnvNames() []string {
	var names []string
	walkEnv(reflect.ValueOf(Default()).Elem(), EnvPrefix, func(name string, _ reflect.Value) {
		names = append(names, name)
	})
	sort.Strings(names)
	return names
}

// ApplyEnv lays ACPGATE_* variables from environ ("K=V" entries) over c.
// It returns the ACPGATE_* names it does not know (the caller warns: other
// tools share the prefix) and an error listing every value it cannot parse.
func (c *Config) ApplyEnv(environ []string) (unknown []string, err error) {
	values := map[string]string{}
	for _, kv := range environ {
		k, v, ok := strings.Cut(kv, "=")
		if ok && strings.HasPrefix(k, EnvPrefix) {
			values[k] = v
		}
	}
	var errs []error
	walkEnv(reflect.ValueOf(c).Elem(), EnvPrefix, func(name string, f reflect.Value) {
		v, ok := values[name]
		if !ok {
			return
		}
		delete(values, name)
		if err := setFromEnv(name, f, v); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
	})
	for k := range values {
		unknown = append(unknown, k)
	}
	sort.Strings(unknown)
	return unknown, errors.Join(errs...)
}

var durationType = reflect.TypeOf(Duration(0))

// walkEnv calls fn for every scalar (and string list) field under v, with
// its variable name.
func walkEnv(v reflect.Value, prefix string, fn func(string, reflect.Value)) {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		tag := strings.Split(t.Field(i).Tag.Get("yaml"), ",")[0]
		if tag == "" || tag == "-" {
			continue
		}
		name := prefix + strings.ToUpper(tag)
		f := v.Field(i)
		switch {
		case f.Type() == durationType:
			fn(name, f)
		case f.Kind() == reflect.Struct:
			walkEnv(f, name+"_", fn)
		case f.Kind() == reflect.Pointer && f.Type().Elem().Kind() == reflect.Struct:
			// A block that is off unless set (cluster:): a variable for one
			// of its keys turns it on.
			if !f.IsNil() {
				walkEnv(f.Elem(), name+"_", fn)
				break
			}
			tmp := reflect.New(f.Type().Elem())
			walkEnv(tmp.Elem(), name+"_", fn)
			if !tmp.Elem().IsZero() && f.CanSet() {
				f.Set(tmp)
			}
		case f.Kind() == reflect.String, f.Kind() == reflect.Int, f.Kind() == reflect.Bool:
			fn(name, f)
		case f.Kind() == reflect.Slice && f.Type().Elem().Kind() == reflect.String:
			fn(name, f)
		}
	}
}

func setFromEnv(name string, f reflect.Value, v string) error {
	switch {
	case f.Type() == durationType:
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("%q is not a duration", v)
		}
		f.SetInt(int64(d))
	case f.Kind() == reflect.String:
		f.SetString(v)
	case f.Kind() == reflect.Int:
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("%q is not an integer", v)
		}
		f.SetInt(int64(n))
	case f.Kind() == reflect.Bool:
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("%q is not true or false", v)
		}
		f.SetBool(b)
	case f.Kind() == reflect.Slice:
		// The agent command is split like a shell would; other lists are
		// comma-separated.
		var list []string
		if name == EnvPrefix+"AGENT_COMMAND" {
			parts, err := SplitCommand(v)
			if err != nil {
				return err
			}
			list = parts
		} else {
			for _, item := range strings.Split(v, ",") {
				if item = strings.TrimSpace(item); item != "" {
					list = append(list, item)
				}
			}
		}
		f.Set(reflect.ValueOf(list))
	}
	return nil
}

// SplitCommand splits a command line into argv like a POSIX shell would for
// words, single and double quotes and backslashes; nothing is expanded.
func SplitCommand(s string) ([]string, error) {
	var (
		argv  []string
		cur   strings.Builder
		inArg bool
		quote rune
	)
	rs := []rune(s)
	for i := 0; i < len(rs); i++ {
		r := rs[i]
		switch {
		case quote == '\'':
			if r == '\'' {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case quote == '"':
			switch {
			case r == '"':
				quote = 0
			case r == '\\' && i+1 < len(rs) && strings.ContainsRune(`"\$`+"`", rs[i+1]):
				i++
				cur.WriteRune(rs[i])
			default:
				cur.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, inArg = r, true
		case r == '\\':
			if i+1 < len(rs) {
				i++
				cur.WriteRune(rs[i])
				inArg = true
			}
		case r == ' ' || r == '\t' || r == '\n':
			if inArg {
				argv = append(argv, cur.String())
				cur.Reset()
				inArg = false
			}
		default:
			cur.WriteRune(r)
			inArg = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c quote in %q", quote, s)
	}
	if inArg {
		argv = append(argv, cur.String())
	}
	if len(argv) == 0 {
		return nil, errors.New("empty command")
	}
	return argv, nil
}
