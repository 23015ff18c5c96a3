package bench

import (
	"bytes"
	"runtime"
	"runtime/pprof"
	"testing"
)

// Given stacks (leaf first) from the bench's one process, then each is
// charged to its owner: a simulator or bench-VM frame anywhere wins (the
// agent calling its backend is the VM's cost), the NATS server's over
// Berth's client, and a stack naming nobody is the runtime's.
func TestEachStackIsChargedToItsOwner(t *testing.T) {
	for _, c := range []struct {
		stack []string
		want  Part
	}{
		{[]string{"encoding/json.Unmarshal", "github.com/berth-ci/berth/services/dispatch.(*Intake).ServeHTTP", "net/http.(*conn).serve"}, PartBerth},
		{[]string{"syscall.Syscall6", "github.com/nats-io/nats.go.(*Conn).readLoop"}, PartBerth},
		// As a profile names it: the dot of a package path's last element
		// is escaped.
		{[]string{"syscall.Syscall6", "github.com/nats-io/nats%2ego.(*Conn).flusher"}, PartBerth},
		{[]string{"github.com/nats-io/nats-server/v2/server.(*stream).internalLoop"}, PartNATS},
		{[]string{"encoding/json.Marshal", "github.com/berth-ci/berth/tests/ghsim.(*Sim).emitJobLocked", "github.com/berth-ci/berth/tests/ghsim.(*Sim).Enqueue"}, PartSim},
		{[]string{"time.Sleep", "github.com/berth-ci/berth/tests/bench.(*InProc).Create", "github.com/berth-ci/berth/services/vmagent.(*Agent).startCreate.func1"}, PartSim},
		{[]string{"runtime.scanObject", "runtime.gcBgMarkWorker"}, PartOther},
	} {
		if got := partOf(c.stack); got != c.want {
			t.Errorf("stack %v charged to %s, want %s", c.stack, got, c.want)
		}
	}
}

var kept [][]byte

// Given every allocation sampled, when this package keeps 1 MiB, then a
// heap profile charges at least that much in use to the simulator's part
// (this package stands in for the VMs and runners).
func TestHeapSharesChargeWhatACodePathKeeps(t *testing.T) {
	old := runtime.MemProfileRate
	runtime.MemProfileRate = 1
	defer func() { runtime.MemProfileRate = old }()
	for range 16 {
		kept = append(kept, make([]byte, 64<<10))
	}
	defer func() { kept = nil }()
	runtime.GC()
	var buf bytes.Buffer
	if err := pprof.Lookup("heap").WriteTo(&buf, 0); err != nil {
		t.Fatal(err)
	}
	s, err := HeapSharesOf(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if got := s[PartSim][0]; got < 1<<20 {
		t.Errorf("the simulator's part holds %d B in use, want at least the 1 MiB this test keeps (all parts: %v)", got, s)
	}
}
