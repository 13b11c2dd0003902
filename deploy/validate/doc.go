// Package validate checks the deployment files in deploy/ offline: every
// Kubernetes manifest is strictly decoded into its API type (unknown or
// duplicate fields are errors), and the manifests are checked against each
// other and against the gateway's configuration they embed.
//
// It is its own Go module so that the Kubernetes API packages never become
// dependencies of acpgate itself. Run it from this directory:
//
//	go test ./...
package validate
