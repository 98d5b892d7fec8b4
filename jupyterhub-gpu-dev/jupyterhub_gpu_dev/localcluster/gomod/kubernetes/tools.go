// Package controlplane only exists so that `go mod tidy` records every module the
// kube-apiserver, kube-controller-manager and kube-scheduler commands need; the
// binaries are built with `go build k8s.io/kubernetes/cmd/<name>`.
package controlplane

import (
	_ "k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	_ "k8s.io/kubernetes/cmd/kube-scheduler/app"
)
