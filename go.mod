module github.com/acpgate/acpgate

go 1.26

require (
	github.com/coder/websocket v1.8.15
	github.com/go-chi/chi/v5 v5.5.0
	github.com/go-json-experiment/json v0.0.0-20260820222146-c27c302e5fc3
	go.uber.org/goleak v1.3.0
	go.yaml.in/yaml/v3 v3.0.6
)
