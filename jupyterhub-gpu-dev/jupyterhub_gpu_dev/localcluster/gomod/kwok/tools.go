// Package kwok only exists so that `go mod tidy` records what
// `go build sigs.k8s.io/kwok/cmd/kwok` needs.
package kwok

import _ "sigs.k8s.io/kwok/pkg/kwok/cmd"
