package redact

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

const (
	key1 = "sk-ant-one-0123456789abcdef"
	key2 = `pw"with\quotes-42` // its JSON and Go-quoted forms differ from it
	key3 = "sk-ant-one-0123456789abcdef-longer"
	key4 = "tok-zzzz-9876543210"
)

func newRedactor(t *testing.T, vals ...string) *Redactor {
	t.Helper()
	r := &Redactor{}
	var s []Secret
	for i, v := range vals {
		s = append(s, Secret{Source: fmt.Sprint("secret ", i), Value: v})
	}
	if short := r.Set(s); len(short) != 0 {
		t.Fatalf("short secrets: %v", short)
	}
	return r
}

func TestString(t *testing.T) {
	r := newRedactor(t, key1, key2, key3)
	for _, tc := range []struct{ in, want string }{
		{"key=" + key1, "key=" + Mark},
		{key1 + " and " + key1 + ".", Mark + " and " + Mark + "."},
		{"longer: " + key3 + "!", "longer: " + Mark + "!"}, // the longer secret whole, not key1 and a rest
		{"plain " + key2, "plain " + Mark},
		{`json "` + strings.ReplaceAll(strings.ReplaceAll(key2, `\`, `\\`), `"`, `\"`) + `"`, `json "` + Mark + `"`},
		{"nothing here", "nothing here"},
		{"", ""},
	} {
		if got := r.String(tc.in); got != tc.want {
			t.Errorf("String(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	var zero Redactor
	if got := zero.String("key=" + key1); got != "key="+key1 {
		t.Errorf("the zero Redactor changed the text: %q", got)
	}
}

func TestSetShortAndReplace(t *testing.T) {
	r := &Redactor{}
	short := r.Set([]Secret{{Source: "tenant a", Value: "1234567"}, {Source: "tenant b", Value: key1}})
	if len(short) != 1 || short[0] != "tenant a" {
		t.Errorf("short = %v, want [tenant a]", short)
	}
	if got := r.String("x 1234567 " + key1); got != "x 1234567 "+Mark {
		t.Errorf("String = %q", got)
	}
	r.Set([]Secret{{Source: "tenant c", Value: key3}}) // a reload replaces the set
	if got := r.String(key1 + " " + key3); got != key1+" "+Mark {
		t.Errorf("after Set: %q", got)
	}
}

type valuer struct{ v string }

func (v valuer) LogValue() slog.Value { return slog.StringValue("valuer " + v.v) }

type payload struct {
	Name string
	Key  string
}

// logBoth logs with the redacting handler over a JSON and a text handler,
// at debug level, and returns both outputs.
func logBoth(t *testing.T, r *Redactor, f func(*slog.Logger)) string {
	t.Helper()
	var out bytes.Buffer
	opts := &slog.HandlerOptions{Level: slog.LevelDebug}
	f(slog.New(NewHandler(slog.NewJSONHandler(&out, opts), r)))
	f(slog.New(NewHandler(slog.NewTextHandler(&out, opts), r)))
	return out.String()
}

func TestHandler(t *testing.T) {
	r := newRedactor(t, key1, key2)
	out := logBoth(t, r, func(l *slog.Logger) {
		l.Debug("message with "+key1, "line", "stderr: "+key1)
		l.Info("error", "err", fmt.Errorf("wrapped: %w", errors.New("bad key "+key1)))
		l.Warn("group", slog.Group("agent", "tail", key1, slog.Group("inner", "deep", "x"+key2+"y")))
		l.Error("any", "payload", payload{Name: "n", Key: key1}, "bytes", []byte("b "+key1), "valuer", valuer{key1},
			"map", map[string]string{"k": key2}, "n", 42, key1, "as key")
		l.With("bound", key1).WithGroup("g").With("inner", key2).Info("bound attrs")
	})
	for _, v := range []string{key1, key2, "0123456789abcdef", `with\\quotes`, `with\"quotes`} {
		if strings.Contains(out, v) {
			t.Errorf("%q in the output:\n%s", v, out)
		}
	}
	for _, want := range []string{
		"message with " + Mark, "stderr: " + Mark, "bad key " + Mark, `"tail":"` + Mark, `"deep":"x` + Mark + `y"`,
		"agent.tail=" + Mark, "agent.inner.deep=x" + Mark + "y", "b " + Mark, "valuer " + Mark, `"n":42`, "n=42",
		`"bound":"` + Mark, `"g":{"inner":"` + Mark, "g.inner=" + Mark, `"` + Mark + `":"as key"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the output lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "\n"); n != 10 {
		t.Errorf("%d lines, want 10 (every record logged):\n%s", n, out)
	}
}

// TestHandlerReload: a secret set after a logger bound its attributes is
// redacted from them too; one no longer set is not.
func TestHandlerReload(t *testing.T) {
	r := newRedactor(t, key1)
	var out bytes.Buffer
	l := slog.New(NewHandler(slog.NewJSONHandler(&out, nil), r)).With("bound", key4)
	l.Info("before")
	r.Set([]Secret{{Source: "s", Value: key4}})
	l.Info("after", "k1", key1)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("lines: %q", lines)
	}
	if !strings.Contains(lines[0], key4) {
		t.Errorf("before the reload key4 was no secret: %s", lines[0])
	}
	if strings.Contains(lines[1], key4) || !strings.Contains(lines[1], `"bound":"`+Mark) || !strings.Contains(lines[1], key1) {
		t.Errorf("after the reload: %s", lines[1])
	}
}

func BenchmarkString(b *testing.B) {
	r := &Redactor{}
	var s []Secret
	for i := range 64 {
		s = append(s, Secret{Source: "s", Value: fmt.Sprintf("sk-tenant-%02d-0123456789abcdef", i)})
	}
	r.Set(s)
	line := strings.Repeat("agent stderr: nothing secret here, just text. ", 10)
	b.SetBytes(int64(len(line)))
	for b.Loop() {
		_ = r.String(line)
	}
}
