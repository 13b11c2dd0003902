package proxy

import "github.com/acpgate/acpgate/proxy/pool"

// Profile is what a pooled agent is told about its clients (pool.Profile).
type Profile = pool.Profile

// AllCapabilities is a profile with every client capability.
var AllCapabilities = pool.AllCapabilities
