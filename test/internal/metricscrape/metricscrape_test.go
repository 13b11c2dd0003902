package metricscrape

import "testing"

const text = `# HELP acpgate_up Up.
# TYPE acpgate_up gauge
acpgate_up 1
acpgate_messages_total{agent="default",direction="client_to_agent",method="session/prompt"} 3
acpgate_messages_total{agent="default",direction="client_to_agent",method="session/load"} 2
acpgate_messages_total{agent="default",direction="agent_to_client",method="session/update"} 40
acpgate_messages_total_extra 7
`

func TestSampleSumParse(t *testing.T) {
	if v := Sample(text, "acpgate_up", ""); v != 1 {
		t.Errorf("Sample up = %v", v)
	}
	if v := Sample(text, "acpgate_messages_total", `agent="default",direction="client_to_agent",method="session/load"`); v != 2 {
		t.Errorf("Sample load = %v", v)
	}
	if v := Sample(text, "acpgate_missing", ""); v != -1 {
		t.Errorf("Sample missing = %v, want -1", v)
	}
	if v := Sum(text, "acpgate_messages_total", `direction="client_to_agent"`); v != 5 {
		t.Errorf("Sum client_to_agent = %v, want 5", v)
	}
	if v := Sum(text, "acpgate_messages_total"); v != 45 {
		t.Errorf("Sum all = %v, want 45 (not the _extra metric)", v)
	}
	m := Parse(text)
	if len(m) != 5 || m["acpgate_up"] != 1 || m[`acpgate_messages_total{agent="default",direction="agent_to_client",method="session/update"}`] != 40 {
		t.Errorf("Parse = %v", m)
	}
}
