package config

import (
	"fmt"

	"go.yaml.in/yaml/v3"

	"github.com/acpgate/acpgate/permrules"
	"github.com/acpgate/acpgate/proxy/pathmap"
)

// validatePermissions checks the top-level and every tenant's
// `permissions:` lists (package permrules says what a rule may hold), each
// problem at the key it is about.
func (c *Config) validatePermissions(root *yaml.Node) []Problem {
	var ps []Problem
	check := func(list *yaml.Node, where string, rules []permrules.Rule) {
		for i, r := range rules {
			var item *yaml.Node
			if list != nil && list.Kind == yaml.SequenceNode && i < len(list.Content) {
				item = list.Content[i]
			}
			for _, p := range r.Check() {
				at := item
				if item != nil {
					if m := member(item, p.Key); m != nil {
						at = m
					}
				}
				pr := Problem{Msg: fmt.Sprintf("%s[%d].%s: %s", where, i, p.Key, p.Msg)}
				if at != nil {
					pr.Line, pr.Column = at.Line, at.Column
				}
				ps = append(ps, pr)
			}
		}
	}
	check(find(root, "permissions"), "permissions", c.Permissions)
	tenants := find(root, "tenants")
	for i := range c.Tenants {
		var list *yaml.Node
		if tenants != nil && tenants.Kind == yaml.SequenceNode && i < len(tenants.Content) {
			list = member(tenants.Content[i], "permissions")
		}
		check(list, fmt.Sprintf("tenants[%d].permissions", i), c.Tenants[i].Permissions)
	}
	return ps
}

// PermissionTable is every tenant's standing permission rules, for
// permrules.Decider: a tenant's own list, or the top-level one, with paths
// relative to its virtual root (without tenants: the session's cwd). A
// rule is named as the audit trail and the clients are told of it:
// "permissions[2]", or "tenants[acme].permissions[0]" for a tenant's own.
func (c *Config) PermissionTable() (*permrules.Table, error) {
	def, err := permrules.Compile(c.Permissions, nil, "permissions")
	if err != nil {
		return nil, err
	}
	t := &permrules.Table{Tenants: map[string]*permrules.List{}}
	if len(c.Tenants) == 0 {
		t.Default = def
		return t, nil
	}
	for i := range c.Tenants {
		ten := &c.Tenants[i]
		rules, where := c.Permissions, "permissions"
		if ten.Permissions != nil {
			rules, where = ten.Permissions, fmt.Sprintf("tenants[%s].permissions", ten.Name)
		}
		m, err := pathmap.New(ten.Root, ten.VirtualRoot)
		if err != nil {
			return nil, fmt.Errorf("tenants[%s]: permission rules: %w", ten.Name, err)
		}
		l, err := permrules.Compile(rules, m, where)
		if err != nil {
			return nil, err
		}
		t.Tenants[ten.Name] = l
	}
	return t, nil
}
