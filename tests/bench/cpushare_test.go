package bench

import "testing"

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
