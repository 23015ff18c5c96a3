package backend

import (
	"errors"

	"github.com/berth-ci/berth/events"
)

// Errors a backend wraps (with %w) to name who a failed step is charged to
// (law 11; events/culprit.go). Without either, a failed create is the
// host's.
var (
	// ErrBackend: the backend's own service refused or failed (an EC2
	// capacity or API answer), not the host it runs on.
	ErrBackend = errors.New("backend refused")
	// ErrImage: the VM image is at fault (missing, corrupt, or its runner
	// is one GitHub no longer accepts).
	ErrImage = errors.New("image at fault")
)

// Culprit is who a failed step's error is charged to: the backend or the
// image when the backend says so, else the host.
func Culprit(err error) string {
	switch {
	case errors.Is(err, ErrBackend):
		return events.CulpritBackend
	case errors.Is(err, ErrImage):
		return events.CulpritImage
	}
	return events.CulpritHost
}
