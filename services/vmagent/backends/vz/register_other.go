//go:build !(darwin && arm64 && cgo)

package vz

import "github.com/berth-ci/berth/services/vmagent/backend"

// Off macOS the vz section is known (a mac agent's config can be checked
// anywhere) but has no constructor: choosing it says it needs macOS.
func init() { backend.Register(kind(nil)) }
