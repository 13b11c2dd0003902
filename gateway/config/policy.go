package config

// PolicyYAML is a `policy:` section, globally or in a tenant. Every key is
// optional: a tenant's policy is the global one with the tenant's keys
// laid over it, key by key, and the global one is the built-in secure
// defaults with its keys laid over them.
type PolicyYAML struct {
	Session struct {
		Load                  *bool `yaml:"load"`
		Resume                *bool `yaml:"resume"`
		Close                 *bool `yaml:"close"`
		List                  *bool `yaml:"list"`
		Delete                *bool `yaml:"delete"`
		Fork                  *bool `yaml:"fork"`
		AdditionalDirectories *bool `yaml:"additional_directories"`
	} `yaml:"session"`
	MCP struct {
		Stdio     *bool     `yaml:"stdio"`
		HTTP      *bool     `yaml:"http"`
		SSE       *bool     `yaml:"sse"`
		HTTPHosts *[]string `yaml:"http_hosts"`
	} `yaml:"mcp"`
	Prompt struct {
		Image           *bool `yaml:"image"`
		Audio           *bool `yaml:"audio"`
		EmbeddedContext *bool `yaml:"embedded_context"`
	} `yaml:"prompt"`
	Client struct {
		FsRead   *bool `yaml:"fs_read"`
		FsWrite  *bool `yaml:"fs_write"`
		Terminal *bool `yaml:"terminal"`
	} `yaml:"client"`
	AgentAuth  *bool `yaml:"agent_auth"`
	Extensions struct {
		Allow *[]string `yaml:"allow"`
	} `yaml:"extensions"`
	Unstable *bool `yaml:"unstable"`
}
