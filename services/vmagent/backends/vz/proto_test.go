package vz

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

func TestFramesRoundTripAndBadFramesAreRefused(t *testing.T) {
	// Given two requests written as frames.
	var buf bytes.Buffer
	g := Guest{Attempt: "berth-1-1", Dir: "/c/berth-1-1", SharedDir: "/c/berth-1-1/shared"}
	must(t, writeFrame(&buf, request{ID: 1, Op: opBoot, Guest: &g, CPUs: 4, Memory: 8 << 30}))
	must(t, writeFrame(&buf, request{ID: 2, Op: opState}))

	// Then they read back whole, in order, and the stream then ends.
	var r1, r2 request
	must(t, readFrame(&buf, &r1))
	must(t, readFrame(&buf, &r2))
	if r1.ID != 1 || r1.Op != opBoot || r1.Guest == nil || *r1.Guest != g || r1.CPUs != 4 || r1.Memory != 8<<30 || r2.ID != 2 || r2.Op != opState {
		t.Errorf("read back %+v and %+v", r1, r2)
	}
	if err := readFrame(&buf, &r1); !errors.Is(err, io.EOF) {
		t.Errorf("after the last frame: %v; want io.EOF", err)
	}

	// And a frame above the bound, one cut short, and one that is not JSON
	// are errors that say so.
	var huge [4]byte
	binary.BigEndian.PutUint32(huge[:], maxFrame+1)
	cut := []byte{0, 0, 0, 10, '{'}
	notJSON := append([]byte{0, 0, 0, 3}, "abc"...)
	for name, in := range map[string][]byte{"above the bound": huge[:], "cut short": cut, "not JSON": notJSON} {
		err := readFrame(bytes.NewReader(in), &r1)
		if err == nil || !strings.Contains(err.Error(), "vz helper protocol") {
			t.Errorf("%s: %v; want a protocol error", name, err)
		}
	}
}

// Serve answers a State while a stop call is wedged, and returns once the
// guest is dropped, having answered the drop.
func TestServeAnswersWhileAStopIsWedgedAndEndsOnDrop(t *testing.T) {
	fx := newFixture(t, nil)
	fx.hv.set(func(f *fakeHV) { f.request = wedge })
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	served := make(chan error, 1)
	go func() {
		served <- Serve(deadline(t, 10*time.Second), inR, outW, func(uint, uint64) (Hypervisor, error) { return fx.hv, nil })
	}()
	g, err := fx.b.GuestFor("berth-3-1")
	must(t, err)
	must(t, fx.b.prepare(g, Machine{BaseImage: fx.b.cfg.BaseImage}, fx.jit))

	send := func(r request) {
		t.Helper()
		must(t, writeFrame(inW, r))
	}
	recv := func() reply {
		t.Helper()
		var rep reply
		must(t, readFrame(outR, &rep))
		return rep
	}
	send(request{ID: 1, Op: opBoot, Guest: &g})
	if rep := recv(); rep.ID != 1 || rep.Error != "" {
		t.Fatalf("boot reply %+v", rep)
	}
	send(request{ID: 2, Op: opRequestStop}) // wedges
	send(request{ID: 3, Op: opState})
	if rep := recv(); rep.ID != 3 || rep.State != StateRunning {
		t.Fatalf("reply while the stop is wedged: %+v; want state running for request 3", rep)
	}
	fx.hv.setState("berth-3-1", StateStopped)
	send(request{ID: 4, Op: opDrop})
	if rep := recv(); rep.ID != 4 || rep.Error != "" {
		t.Fatalf("drop reply %+v", rep)
	}
	must(t, <-served)
	if fx.hv.held() != 0 {
		t.Errorf("VM objects held after the drop: %d", fx.hv.held())
	}
	inW.Close()
	outR.Close()
}
