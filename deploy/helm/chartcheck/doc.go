// Package chartcheck holds the tests of the Helm chart deploy/helm/outboxd:
// they render it with the Helm SDK (as `helm template` does) for each lease
// backend, and check the result against the code and the plain manifests in
// deploy/kubernetes. It is a module of its own, so the SDK's Kubernetes
// modules stay out of outboxd's go.mod.
package chartcheck
