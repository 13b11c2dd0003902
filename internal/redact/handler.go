package redact

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync/atomic"
)

// Handler is a slog.Handler that redacts every record before the handler
// it wraps sees it: the message, each attribute's key and value (strings,
// errors, groups at any depth, LogValuers once resolved, and any other
// value whose text or JSON form holds a secret, which is then logged as
// its redacted text).
//
// Attributes bound by WithAttrs are kept as given and redacted when the
// wrapped handler is built, again after each Set of the Redactor, so a
// secret added by a reload is redacted from loggers made before it too.
type Handler struct {
	// Static after construction.
	base slog.Handler
	r    *Redactor
	ops  []op // WithGroup and WithAttrs calls since base, in order

	built atomic.Pointer[builtHandler] // base with ops applied, for one generation of r
}

// op is one WithGroup (group set) or WithAttrs call.
type op struct {
	group string
	attrs []slog.Attr
}

type builtHandler struct {
	gen uint64
	h   slog.Handler
}

// NewHandler wraps h so that r's secrets never reach it.
func NewHandler(h slog.Handler, r *Redactor) *Handler {
	return &Handler{base: h, r: r}
}

// inner is base with the ops applied, their attributes redacted with the
// current secrets.
func (h *Handler) inner() slog.Handler {
	gen := h.r.generation()
	if b := h.built.Load(); b != nil && b.gen == gen {
		return b.h
	}
	in := h.base
	for _, o := range h.ops {
		if o.attrs == nil {
			in = in.WithGroup(o.group)
			continue
		}
		in = in.WithAttrs(h.r.attrs(o.attrs))
	}
	h.built.Store(&builtHandler{gen: gen, h: in})
	return in
}

// Enabled implements slog.Handler.
func (h *Handler) Enabled(ctx context.Context, l slog.Level) bool { return h.inner().Enabled(ctx, l) }

// Handle implements slog.Handler.
func (h *Handler) Handle(ctx context.Context, rec slog.Record) error {
	in := h.inner()
	if h.r.empty() {
		return in.Handle(ctx, rec)
	}
	out := slog.NewRecord(rec.Time, rec.Level, h.r.String(rec.Message), rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(h.r.attr(a))
		return true
	})
	return in.Handle(ctx, out)
}

// WithAttrs implements slog.Handler.
func (h *Handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if len(attrs) == 0 {
		return h
	}
	return h.with(op{attrs: attrs})
}

// WithGroup implements slog.Handler.
func (h *Handler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return h.with(op{group: name})
}

func (h *Handler) with(o op) *Handler {
	ops := append(h.ops[:len(h.ops):len(h.ops)], o)
	return &Handler{base: h.base, r: h.r, ops: ops}
}

// attrs redacts each of as.
func (r *Redactor) attrs(as []slog.Attr) []slog.Attr {
	out := make([]slog.Attr, len(as))
	for i, a := range as {
		out[i] = r.attr(a)
	}
	return out
}

// attr redacts one attribute: its key and its value, resolved.
func (r *Redactor) attr(a slog.Attr) slog.Attr {
	a.Key = r.String(a.Key)
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		a.Value = slog.StringValue(r.String(v.String()))
	case slog.KindGroup:
		a.Value = slog.GroupValue(r.attrs(v.Group())...)
	case slog.KindAny:
		a.Value = r.anyValue(v)
	default: // numbers, times, durations, bools: only their text could match
		if s := v.String(); r.Contains(s) {
			a.Value = slog.StringValue(r.String(s))
		} else {
			a.Value = v
		}
	}
	return a
}

// anyValue redacts a value of kind any. An error is logged by its text,
// so its text is redacted; any other value is kept as it is unless its
// text (as a text handler prints it) or its JSON (as a JSON handler does)
// holds a secret, when it becomes its redacted text.
func (r *Redactor) anyValue(v slog.Value) slog.Value {
	switch x := v.Any().(type) {
	case error:
		if s := x.Error(); r.Contains(s) {
			return slog.StringValue(r.String(s))
		}
		return v
	case []byte:
		if s := string(x); r.Contains(s) {
			return slog.StringValue(r.String(s))
		}
		return v
	}
	s := fmt.Sprintf("%+v", v.Any())
	if r.Contains(s) {
		return slog.StringValue(r.String(s))
	}
	if j, err := json.Marshal(v.Any()); err == nil && r.Contains(string(j)) {
		return slog.StringValue(r.String(string(j)))
	}
	return v
}
