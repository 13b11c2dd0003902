package gateway

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"slices"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/acpgate/acpgate/gateway/config"
	"github.com/acpgate/acpgate/internal/redact"
)

// configSecrets lists every secret value of cfg that the gateway's log,
// audit trail and traces must never show, whatever writes it (an agent's
// stderr, an error, a client's text): the tenants' agent credentials
// (creds, as read), the session keys, the audit HMAC key, the JWT HS256
// secret and the budget store's Redis password. A key file that cannot be
// read is skipped here: what reads it for use refuses it.
func configSecrets(cfg *config.Config, creds map[string]map[string]string) []redact.Secret {
	var out []redact.Secret
	for _, tenant := range slices.Sorted(maps.Keys(creds)) {
		for _, k := range slices.Sorted(maps.Keys(creds[tenant])) {
			out = append(out, redact.Secret{Source: fmt.Sprintf("tenant %q agent_env %s", tenant, k), Value: creds[tenant][k]})
		}
	}
	if keys, err := cfg.SessionKeys(); err == nil {
		for _, k := range keys {
			out = append(out, redact.Secret{Source: "a session key", Value: hex.EncodeToString(k)})
		}
	}
	if k, err := cfg.AuditKey(); err == nil && k != nil {
		out = append(out, redact.Secret{Source: "audit.hmac_key_file", Value: hex.EncodeToString(k)},
			redact.Secret{Source: "audit.hmac_key_file", Value: string(k)})
	}
	if j := cfg.Auth.JWT; j != nil && j.HS256SecretFile != "" {
		if b, err := os.ReadFile(j.HS256SecretFile); err == nil {
			out = append(out, redact.Secret{Source: "auth.jwt.hs256_secret_file", Value: string(bytes.TrimSpace(b))})
		}
	}
	if s := cfg.Budgets.Store; strings.HasPrefix(s, "redis") {
		if u, err := url.Parse(s); err == nil && u.User != nil {
			if pw, ok := u.User.Password(); ok && pw != "" {
				out = append(out, redact.Secret{Source: "budgets.store's Redis password", Value: pw})
			}
		}
	}
	return out
}

// setSecrets makes cfg's secrets the ones redacted from now on; a secret
// too short to redact is warned about by its source.
func setSecrets(r *redact.Redactor, cfg *config.Config, creds map[string]map[string]string, log *slog.Logger) {
	for _, src := range r.Set(configSecrets(cfg, creds)) {
		log.Warn("a secret is too short to be redacted from the log, audit trail and traces; use a longer one",
			"source", src, "min_bytes", redact.MinLen)
	}
}

// redactingExporter takes the redactor's secrets out of every span before
// the exporter it wraps sends it: names, attributes, events, links and
// status. A span that holds none is passed as it is.
type redactingExporter struct {
	sdktrace.SpanExporter
	r *redact.Redactor
}

// ExportSpans implements sdktrace.SpanExporter.
func (e redactingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	var out []sdktrace.ReadOnlySpan
	for i, s := range spans {
		if !e.holdsSecret(s) {
			if out != nil {
				out = append(out, s)
			}
			continue
		}
		if out == nil {
			out = append(make([]sdktrace.ReadOnlySpan, 0, len(spans)), spans[:i]...)
		}
		stub := tracetest.SpanStubFromReadOnlySpan(s)
		stub.Name = e.r.String(stub.Name)
		stub.Attributes = e.attrs(stub.Attributes)
		for j := range stub.Events {
			stub.Events[j].Name = e.r.String(stub.Events[j].Name)
			stub.Events[j].Attributes = e.attrs(stub.Events[j].Attributes)
		}
		for j := range stub.Links {
			stub.Links[j].Attributes = e.attrs(stub.Links[j].Attributes)
		}
		stub.Status.Description = e.r.String(stub.Status.Description)
		out = append(out, stub.Snapshot())
	}
	if out == nil {
		out = spans
	}
	return e.SpanExporter.ExportSpans(ctx, out)
}

// holdsSecret reports whether any text of s holds a secret.
func (e redactingExporter) holdsSecret(s sdktrace.ReadOnlySpan) bool {
	if e.r.Contains(s.Name()) || e.r.Contains(s.Status().Description) || e.attrsHold(s.Attributes()) {
		return true
	}
	for _, ev := range s.Events() {
		if e.r.Contains(ev.Name) || e.attrsHold(ev.Attributes) {
			return true
		}
	}
	for _, l := range s.Links() {
		if e.attrsHold(l.Attributes) {
			return true
		}
	}
	return false
}

func (e redactingExporter) attrsHold(kvs []attribute.KeyValue) bool {
	for _, kv := range kvs {
		if e.r.Contains(string(kv.Key)) || e.r.Contains(kv.Value.String()) {
			return true
		}
	}
	return false
}

// attrs returns kvs with their strings redacted (a copy).
func (e redactingExporter) attrs(kvs []attribute.KeyValue) []attribute.KeyValue {
	out := make([]attribute.KeyValue, len(kvs))
	for i, kv := range kvs {
		key := attribute.Key(e.r.String(string(kv.Key)))
		switch kv.Value.Type() {
		case attribute.STRING:
			out[i] = key.String(e.r.String(kv.Value.AsString()))
		case attribute.STRINGSLICE:
			ss := slices.Clone(kv.Value.AsStringSlice())
			for j := range ss {
				ss[j] = e.r.String(ss[j])
			}
			out[i] = key.StringSlice(ss)
		default:
			out[i] = attribute.KeyValue{Key: key, Value: kv.Value}
		}
	}
	return out
}
