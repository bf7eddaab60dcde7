// Package helm tests the Helm chart deploy/helm/gcagent with Helm's own Go
// SDK: lint, renders decoded strictly into typed objects, and the plain
// manifest deploy/kubernetes/gcagent.yaml as the chart's default render. It
// is a module of its own so that the SDK's dependencies never enter the
// agent's go.mod (with them, bbolt, prometheus/client_golang and others in
// the agent's build would move up).
package helm
