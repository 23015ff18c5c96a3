package vz

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
)

// The helper protocol: the agent writes requests to a helper's stdin and
// reads replies from its stdout. Each message is one frame: a 4-byte
// big-endian length, then that many bytes of JSON. Replies carry the id of
// their request; a helper answers requests concurrently, so a State is
// answered while a stop is wedged.

// maxFrame bounds one message (a Guest's paths fit in a few hundred bytes).
const maxFrame = 1 << 20

// Operations a helper serves.
const (
	opBoot          = "boot"
	opState         = "state"
	opDetachNetwork = "detach_network"
	opRequestStop   = "request_stop"
	opForceStop     = "force_stop"
	// opDrop: free the guest's objects, answer, and exit.
	opDrop = "drop"
)

// request is one call of the agent to its helper.
type request struct {
	ID uint64 `json:"id"`
	Op string `json:"op"`
	// Guest, CPUs and Memory (bytes) are set on boot only.
	Guest  *Guest `json:"guest,omitempty"`
	CPUs   uint   `json:"cpus,omitempty"`
	Memory uint64 `json:"memory,omitempty"`
}

// reply answers the request with the same id.
type reply struct {
	ID    uint64 `json:"id"`
	State State  `json:"state"`
	Error string `json:"error,omitempty"`
}

// writeFrame writes v as one frame.
func writeFrame(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(b) > maxFrame {
		return fmt.Errorf("vz helper protocol: frame of %d bytes, above %d", len(b), maxFrame)
	}
	buf := make([]byte, 4+len(b))
	binary.BigEndian.PutUint32(buf, uint32(len(b)))
	copy(buf[4:], b)
	_, err = w.Write(buf)
	return err
}

// readFrame reads one frame into v; io.EOF when the stream ended between
// frames.
func readFrame(r io.Reader, v any) error {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > maxFrame {
		return fmt.Errorf("vz helper protocol: frame of %d bytes, above %d: not a berth helper on the other end?", n, maxFrame)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return fmt.Errorf("vz helper protocol: frame cut short: %w", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("vz helper protocol: bad frame: %w", err)
	}
	return nil
}
