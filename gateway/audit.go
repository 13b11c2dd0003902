package gateway

import (
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/acpgate/acpgate/audit"
	"github.com/acpgate/acpgate/gateway/config"
	"github.com/acpgate/acpgate/internal/redact"
)

// auditTrail is the gateway's side of the audit trail (audit.file): the
// events it records itself (connections, refusals, admin actions), and the
// file's reopen and close. Without audit.file it records nothing.
type auditTrail struct {
	rec  audit.Recorder // nil: no audit trail
	file *audit.Log     // the same, to reopen and close; nil: none
	// keyFile is audit.hmac_key_file ("": none), read again on reopen.
	keyFile string
	log     *slog.Logger
	// authFails and adminDenials bound the events anyone can make the
	// trail write without a credential, each kind apart and by remote
	// address; adminFailures those an administrator's failing calls make.
	authFails, adminDenials, adminFailures *audit.Throttle
}

// on reports whether there is a trail to record to.
func (t *auditTrail) on() bool { return t.rec != nil }

// record writes ev to the audit trail, if there is one.
func (t *auditTrail) record(ev audit.Event) {
	if t.rec != nil {
		t.rec.Record(ev)
	}
}

// event is an audit event about l's connection.
func (l *link) event(kind string, fields ...audit.Field) audit.Event {
	return audit.Event{Event: kind, Tenant: l.tenant, Subject: l.subject, Agent: l.agent, Conn: l.id, Fields: fields}
}

// recordOpened records connection.opened for a socket (a WebSocket, resumed or
// not) or a Streamable HTTP connection.
func (l *link) recordOpened(fields ...audit.Field) {
	l.s.audit.record(l.event("connection.opened", append([]audit.Field{
		audit.F("transport", l.kind), audit.F("remote", l.remote)}, fields...)...))
}

// recordClosed records connection.closed: label is why (the metrics reason),
// attrs the transport's own (a WebSocket's close code).
func (l *link) recordClosed(label string, attrs []any) {
	if !l.s.audit.on() {
		return
	}
	fields := []audit.Field{audit.F("transport", l.kind), audit.F("remote", l.remote), audit.F("reason", label)}
	for i := 0; i+1 < len(attrs); i += 2 {
		if attrs[i] == "close_code" {
			fields = append(fields, audit.F("close_code", attrs[i+1]))
		}
	}
	fields = append(fields, audit.F("duration_ms", time.Since(l.start).Milliseconds()))
	l.s.audit.record(l.event("connection.closed", fields...))
}

// authFailed records auth.failed for a request the authenticator refused
// (an upgrade, a POST, a ticket request…): the reason, never the
// credential.
func (t *auditTrail) authFailed(r *http.Request, reason string) {
	if t == nil || !t.on() { // nil: New has not finished
		return
	}
	t.refusal(t.authFails, r, audit.F("reason", reason), audit.F("remote", r.RemoteAddr), audit.F("path", boundedPath(r.URL.Path)))
}

// adminDenied records admin.denied for a request to the admin API the
// admins' check refused.
func (t *auditTrail) adminDenied(r *http.Request, reason string) {
	t.refusal(t.adminDenials, r, audit.F("reason", reason), audit.F("method", r.Method), audit.F("path", boundedPath(r.URL.Path)),
		audit.F("remote", r.RemoteAddr))
}

// adminFailed records admin.failed for an administrator's call that
// failed (404, 400, 503…): method, path (bounded, without its query),
// status and who. Throttled as the refusals are, by remote host.
func (t *auditTrail) adminFailed(r *http.Request, subject string, status int) {
	t.throttled(t.adminFailures, r, audit.Event{Subject: subject, Fields: []audit.Field{audit.F("method", r.Method),
		audit.F("path", boundedPath(r.URL.Path)), audit.F("status", status), audit.F("remote", r.RemoteAddr)}})
}

// openAudit opens the audit trail (recording nothing when audit.file is
// unset), keyed by audit.hmac_key_file if set, and registers its metrics
// on reg. Its first line, gateway.started, names the version.
func openAudit(cfg *config.Config, version string, reg prometheus.Registerer, red *redact.Redactor, log *slog.Logger) (*auditTrail, error) {
	t := &auditTrail{keyFile: cfg.Audit.HMACKeyFile, log: log}
	t.authFails = audit.NewThrottle(audit.RecorderFunc(t.record), "auth.failed", audit.ThrottleConfig{})
	t.adminDenials = audit.NewThrottle(audit.RecorderFunc(t.record), "admin.denied", audit.ThrottleConfig{})
	t.adminFailures = audit.NewThrottle(audit.RecorderFunc(t.record), "admin.failed", audit.ThrottleConfig{})
	if cfg.Audit.File == "" {
		return t, nil
	}
	key, err := cfg.AuditKey()
	if err != nil {
		return nil, err
	}
	events := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "acpgate_audit_events_total", Help: "Events written to the audit trail, by event.",
	}, []string{"event"})
	writeErrors := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "acpgate_audit_write_errors_total", Help: "Failed writes to the audit trail (a full disk…); their events are lost.",
	})
	dropped := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "acpgate_audit_dropped_total", Help: "Audit events lost: the writer was behind (the disk stalled) or their write failed.",
	})
	file, err := audit.Open(audit.Config{
		File:       cfg.Audit.File,
		Key:        key,
		Start:      []audit.Field{audit.F("version", version), audit.F("pid", os.Getpid())},
		Redact:     red.String,
		Written:    func(ev string) { events.WithLabelValues(ev).Inc() },
		Dropped:    func(n int) { dropped.Add(float64(n)) },
		WriteError: writeErrors.Inc,
	}, log)
	if err != nil {
		return nil, err
	}
	reg.MustRegister(events, writeErrors, dropped)
	t.rec, t.file = file, file
	return t, nil
}

// ReopenAudit opens the audit file afresh (on SIGHUP, after logrotate
// moved it); the new file's first line chains to the old one's last. It
// reads audit.hmac_key_file again: a changed key MACs the lines from now
// on; one that cannot be read (or is refused) leaves the key in use
// (logged). Without an audit file it does nothing.
func (s *Server) ReopenAudit() error { return s.audit.reopen() }

// reopen opens the audit file afresh and reloads its key (ReopenAudit).
func (t *auditTrail) reopen() error {
	if t.file == nil {
		return nil
	}
	if t.keyFile != "" {
		if key, err := audit.ReadKeyFile(t.keyFile); err != nil {
			t.log.Error("audit key not reloaded; MACing on with the key in use", "err", err)
		} else if err := t.file.SetKey(key); err != nil {
			t.log.Error("audit key not reloaded; MACing on with the key in use", "err", err)
		} else {
			t.log.Info("audit key read again", "kid", audit.KeyID(key))
		}
	}
	return t.file.Reopen()
}

// close writes what the audit trail and its throttles hold and closes it
// (Shutdown, once the relay has stopped).
func (t *auditTrail) close() error {
	t.authFails.Close()
	t.adminDenials.Close()
	t.adminFailures.Close()
	if t.file == nil {
		return nil
	}
	return t.file.Close()
}

// refusal records an event anyone can cause without a credential through
// its kind's throttle, by the request's remote host: a flood from one
// address cannot crowd the trail's other events out, nor another
// address's, and what it holds back is written as a suppressed event.
func (t *auditTrail) refusal(th *audit.Throttle, r *http.Request, fields ...audit.Field) {
	t.throttled(th, r, audit.Event{Fields: fields})
}

// throttled records ev through th, by the request's remote host.
func (t *auditTrail) throttled(th *audit.Throttle, r *http.Request, ev audit.Event) {
	if !t.on() {
		return
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	th.Record(ev, host, r.RemoteAddr)
}

// configReloaded records config.reloaded for a reload from cur to next
// that took effect: the top-level settings that changed (by YAML key), the
// tenants added, removed or changed and the agents added or removed, by
// name, and the tenants whose agent credentials changed (agent_env: their
// files may change with the configuration unchanged). Never a value: no
// token hash, key or secret reaches the trail.
func (t *auditTrail) configReloaded(cur, next *config.Config, agentsAdded, agentsRemoved, credsChanged []string) {
	if !t.on() {
		return
	}
	changed := []string{}
	a, b := reflect.ValueOf(cur).Elem(), reflect.ValueOf(next).Elem()
	for i := range a.NumField() {
		key, _, _ := strings.Cut(a.Type().Field(i).Tag.Get("yaml"), ",")
		if key != "" && key != "-" && !reflect.DeepEqual(a.Field(i).Interface(), b.Field(i).Interface()) {
			changed = append(changed, key)
		}
	}
	fields := []audit.Field{audit.F("changed", changed)}
	old := map[string]*config.Tenant{}
	for i := range cur.Tenants {
		old[cur.Tenants[i].Name] = &cur.Tenants[i]
	}
	var added, modified []string
	for i := range next.Tenants {
		nt := &next.Tenants[i]
		ot, ok := old[nt.Name]
		delete(old, nt.Name)
		switch {
		case !ok:
			added = append(added, nt.Name)
		case !reflect.DeepEqual(ot, nt):
			modified = append(modified, nt.Name)
		}
	}
	removed := slices.Sorted(maps.Keys(old))
	for _, f := range []struct {
		key   string
		names []string
	}{{"tenants_added", added}, {"tenants_removed", removed}, {"tenants_changed", modified},
		{"agents_added", agentsAdded}, {"agents_removed", agentsRemoved}, {"agent_env_changed", credsChanged}} {
		if len(f.names) > 0 {
			fields = append(fields, audit.F(f.key, f.names))
		}
	}
	t.record(audit.Event{Event: "config.reloaded", Fields: fields})
}
