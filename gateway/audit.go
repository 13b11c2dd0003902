package gateway

import "github.com/acpgate/acpgate/audit"

// record writes ev to the audit trail, if there is one.
func (s *Server) record(ev audit.Event) {
	if s.audit != nil {
		s.audit.Record(ev)
	}
}
