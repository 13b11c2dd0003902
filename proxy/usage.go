package proxy

// Usage is what a session's agent reported using, summed over the
// session's life in this gateway.
type Usage struct {
	Tokens map[string]int64   // by kind: input, output, thought, cached_read, cached_write
	Cost   map[string]float64 // by currency: the increase of the agent's cumulative cost
}

// usage is the session's Usage so far (copies).
func (s *Session) usage() Usage { return Usage{} } // filled in by metering (issue 23)
