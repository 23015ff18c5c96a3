package bench

import (
	"bytes"
	"fmt"
	"strings"
	"time"

	"github.com/google/pprof/profile"
)

// Part is who a CPU sample is charged to.
type Part string

// The parts of the bench's one process. The simulator stands in for GitHub
// and for the VMs and their runners (ghsim, the InProc backend and the
// runner goroutines), so it is left out of Berth's share; the NATS server
// is counted apart, as the issue asks; Other is what no stack names an
// owner of: the garbage collector, the scheduler, a syscall entered from
// the runtime.
const (
	PartBerth Part = "berth"
	PartNATS  Part = "nats-server"
	PartSim   Part = "simulator"
	PartOther Part = "other"
)

// partOf charges one stack (leaf first) to a part: a frame of the
// simulator or the bench's VMs wins over Berth's (the agent calling its
// backend is the VM's cost), the NATS server's over the client's.
func partOf(funcs []string) Part {
	part := PartOther
	for _, fn := range funcs {
		switch {
		case strings.Contains(fn, "/berth/tests/ghsim") || strings.Contains(fn, "/berth/tests/bench."):
			return PartSim
		case strings.Contains(fn, "nats-io/nats-server/"):
			part = PartNATS
		case part == PartOther && (strings.Contains(fn, "berth-ci/berth/") || isNATSClient(fn)):
			part = PartBerth
		}
	}
	return part
}

// isNATSClient: a frame of nats.go, the services' NATS client. A profile
// escapes the dot of a package path's last element, so its core package
// is named "nats-io/nats%2ego" there and its subpackages "nats-io/nats.go/…".
func isNATSClient(fn string) bool {
	return strings.Contains(fn, "nats-io/nats.go") || strings.Contains(fn, "nats-io/nats%2ego")
}

// CPUShares is CPU time by part, from a CPU profile.
type CPUShares map[Part]time.Duration

// SharesOf reads a CPU profile (pprof's protobuf, as runtime/pprof writes
// it) and sums its CPU samples by part.
func SharesOf(raw []byte) (CPUShares, error) {
	p, err := profile.Parse(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("read CPU profile: %w", err)
	}
	idx := -1
	for i, st := range p.SampleType {
		if st.Type == "cpu" {
			idx = i
		}
	}
	if idx < 0 {
		return nil, fmt.Errorf("read CPU profile: no cpu sample type")
	}
	out := CPUShares{}
	for _, s := range p.Sample {
		out[partOf(funcsOf(s))] += time.Duration(s.Value[idx])
	}
	return out, nil
}

// HeapShares is in-use heap by part: bytes and objects.
type HeapShares map[Part][2]int64

// HeapSharesOf reads a heap profile and sums its in-use bytes and objects
// by the part whose code allocated them. Exact only when every allocation
// was sampled (runtime.MemProfileRate = 1 from the process's start).
func HeapSharesOf(raw []byte) (HeapShares, error) {
	p, err := profile.Parse(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("read heap profile: %w", err)
	}
	objs, space := -1, -1
	for i, st := range p.SampleType {
		switch st.Type {
		case "inuse_objects":
			objs = i
		case "inuse_space":
			space = i
		}
	}
	if objs < 0 || space < 0 {
		return nil, fmt.Errorf("read heap profile: no in-use samples")
	}
	out := HeapShares{}
	for _, s := range p.Sample {
		part := partOf(funcsOf(s))
		v := out[part]
		v[0] += s.Value[space]
		v[1] += s.Value[objs]
		out[part] = v
	}
	return out, nil
}

// funcsOf is a sample's stack as function names, leaf first.
func funcsOf(s *profile.Sample) []string {
	var funcs []string
	for _, loc := range s.Location {
		for _, l := range loc.Line {
			if l.Function != nil {
				funcs = append(funcs, l.Function.Name)
			}
		}
	}
	return funcs
}
