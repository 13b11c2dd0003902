package config

import "slices"

// SharingYAML is a `sharing:` section, at the top level or in a tenant:
// who may attach (session/attach) to a session another client holds. Every
// key is optional: a tenant's sharing is the top-level one with the
// tenant's keys laid over it, key by key, and the top-level one is the
// defaults (attach: same_subject, read_only_for_others: false) with its
// keys laid over them.
type SharingYAML struct {
	// Attach is SharingSameSubject, SharingTenant or SharingOff.
	Attach *string `yaml:"attach"`
	// ReadOnlyForOthers: a client of another subject than the one that
	// holds the session attaches read-only (it matters with attach: tenant).
	ReadOnlyForOthers *bool `yaml:"read_only_for_others"`
}

// Sharing is the effective sharing of a tenant, or of the gateway without
// tenants.
type Sharing struct {
	Attach            string // SharingSameSubject, SharingTenant or SharingOff
	ReadOnlyForOthers bool
}

// sharing.attach values.
const (
	// SharingSameSubject: clients whose credential names the same subject
	// as the one that holds the session ("jwt:" and a JWT's sub; a static
	// token is its own subject, "token:…"). The default.
	SharingSameSubject = "same_subject"
	// SharingTenant: any client of the tenant.
	SharingTenant = "tenant"
	// SharingOff: nobody; session/attach is refused, and sessions keep no
	// history for it.
	SharingOff = "off"
)

var sharingAttach = []string{SharingSameSubject, SharingTenant, SharingOff}

// apply lays the keys y sets over s.
func (y *SharingYAML) apply(s Sharing) Sharing {
	if y.Attach != nil {
		s.Attach = *y.Attach
	}
	if y.ReadOnlyForOthers != nil {
		s.ReadOnlyForOthers = *y.ReadOnlyForOthers
	}
	return s
}

// GlobalSharing is the defaults with the top-level sharing section laid
// over them: the sharing of the gateway without tenants.
func (c *Config) GlobalSharing() Sharing {
	return c.Sharing.apply(Sharing{Attach: SharingSameSubject})
}

// TenantSharing is the top-level sharing with the tenant's keys laid over
// it.
func (c *Config) TenantSharing(t *Tenant) Sharing { return t.Sharing.apply(c.GlobalSharing()) }

// badAttach reports whether a sharing section sets attach to a value it
// may not have.
func (y *SharingYAML) badAttach() bool {
	return y.Attach != nil && !slices.Contains(sharingAttach, *y.Attach)
}

// validate checks the top-level sharing section.
func (y *SharingYAML) validate(add addFunc) {
	if y.badAttach() {
		add("sharing.attach", "%q is not same_subject, tenant or off", *y.Attach)
	}
}
