package gateway

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/acpgate/acpgate/audit"
	"github.com/acpgate/acpgate/gateway/config"
)

// record writes ev to the audit trail, if there is one.
func (s *Server) record(ev audit.Event) {
	if s.audit != nil {
		s.audit.Record(ev)
	}
}

// openAudit opens the audit trail (nil when audit.file is unset) and
// registers its metrics on reg.
func openAudit(cfg *config.Config, reg prometheus.Registerer, log *slog.Logger) (*audit.Log, error) {
	if cfg.Audit.File == "" {
		return nil, nil
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
	trail, err := audit.Open(audit.Config{
		File:       cfg.Audit.File,
		Written:    func(ev string) { events.WithLabelValues(ev).Inc() },
		Dropped:    func(n int) { dropped.Add(float64(n)) },
		WriteError: writeErrors.Inc,
	}, log)
	if err != nil {
		return nil, err
	}
	reg.MustRegister(events, writeErrors, dropped)
	return trail, nil
}

// ReopenAudit opens the audit file afresh (on SIGHUP, after logrotate
// moved it); the new file's first line chains to the old one's last.
// Without an audit file it does nothing.
func (s *Server) ReopenAudit() error {
	if s.trail == nil {
		return nil
	}
	return s.trail.Reopen()
}

// closeAudit writes what the audit trail holds and closes it (Shutdown,
// once the relay has stopped).
func (s *Server) closeAudit() error {
	if s.trail == nil {
		return nil
	}
	return s.trail.Close()
}
