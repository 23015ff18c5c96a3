package events_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/events"
	"pgregory.net/rapid"
)

var at = time.Date(2025, 3, 14, 15, 9, 26, 535897932, time.UTC)

func jobRef() events.JobRef {
	return events.JobRef{Delivery: "d-1", JobID: 42, RunID: 7, RunAttempt: 2, Org: "acme",
		Repo: "acme/app", Name: "build", Labels: []string{"self-hosted", "macos"}, Installation: "acme-cloud"}
}

func attemptRef() events.AttemptRef {
	return events.AttemptRef{Attempt: "berth-42-1", Pool: "macos", Host: "mac-1"}
}

func hostChange() events.HostChange {
	return events.HostChange{Host: "mac-1", Reason: "maintenance", By: "ops", At: at}
}

// samples has one payload per catalogue type with every field non-zero, so a
// field the codec drops fails the round trip.
func samples() map[string]events.Payload {
	return map[string]events.Payload{
		events.TypeJobQueued:     &events.JobQueued{JobRef: jobRef()},
		events.TypeJobWaiting:    &events.JobWaiting{JobRef: jobRef()},
		events.TypeJobInProgress: &events.JobInProgress{JobRef: jobRef(), RunnerName: "berth-42-1", RunnerID: 99},
		events.TypeJobCompleted: &events.JobCompleted{JobRef: jobRef(), Conclusion: "success",
			RunnerName: "berth-42-1", RunnerID: 99},
		events.TypeJobUnschedulable: &events.JobUnschedulable{JobID: 42, Reason: "create failed 3 times", Attempts: 3},
		events.TypeJobConflict:      &events.JobConflict{JobID: 43, Runner: "berth-42-1", BoundJob: 42},
		events.TypeSlotReserved: &events.SlotReserved{Pool: "macos", Host: "mac-1", Attempt: "berth-42-1",
			JobID: 42, N: 1, Labels: []string{"macos"}, Warm: true},
		events.TypeSlotReleased: &events.SlotReleased{Pool: "macos", Host: "mac-1", Attempt: "berth-42-1",
			Reason: events.ReleaseCreateFailed, JobID: 42, Culprit: events.CulpritHost},
		events.TypeAttemptPlaced: &events.AttemptPlaced{AttemptRef: attemptRef(), JobID: 42,
			Labels: []string{"macos"}, RunnerID: 99, SealedJIT: []byte{0, 1, 2, 0xff}, SealedBy: "XDISP", SealedTo: "XAGENT", Warm: true},
		events.TypeAttemptProvisioning:      &events.AttemptProvisioning{AttemptRef: attemptRef()},
		events.TypeAttemptRunnerStarted:     &events.AttemptRunnerStarted{AttemptRef: attemptRef(), Took: 93 * time.Second},
		events.TypeAttemptFailed:            &events.AttemptFailed{AttemptRef: attemptRef(), Step: "create", Error: "exit 3", Culprit: events.CulpritHost},
		events.TypeAttemptTeardownRequested: &events.AttemptTeardownRequested{AttemptRef: attemptRef(), Reason: "completed"},
		events.TypeAttemptStopped:           &events.AttemptStopped{AttemptRef: attemptRef(), Late: true, Ended: events.StopKilled},
		events.TypeAttemptDeregistered:      &events.AttemptDeregistered{AttemptRef: attemptRef(), RunnerID: 23},
		events.TypeAttemptBound:             &events.AttemptBound{AttemptRef: attemptRef(), JobID: 42, Ended: true},
		events.TypeAttemptRunnerBusy:        &events.AttemptRunnerBusy{AttemptRef: attemptRef(), RunnerID: 23, At: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)},
		events.TypeAttemptRunnerVersion:     &events.AttemptRunnerVersion{AttemptRef: attemptRef(), Image: "xcode-16", Version: "2.310.0"},
		events.TypeAttemptRunnerRefused: &events.AttemptRunnerRefused{AttemptRef: attemptRef(), Image: "xcode-16", Version: "2.310.0", Minimum: "2.329.0",
			Message: "Runner version v2.310.0 is deprecated and cannot receive messages."},
		events.TypeAttemptReady:   &events.AttemptReady{AttemptRef: attemptRef()},
		events.TypeAttemptClaimed: &events.AttemptClaimed{Pool: "macos", Host: "mac-1", Attempt: "berth-warm-macos-3", JobID: 42},
		events.TypeAttemptAssigned: &events.AttemptAssigned{AttemptRef: attemptRef(), JobID: 42, RunnerID: 99,
			SealedJIT: []byte{3, 4}, SealedBy: "XDISP", SealedTo: "XAGENT"},
		events.TypeAttemptAbandoned: &events.AttemptAbandoned{AttemptRef: attemptRef(), Step: "stop",
			After: 5 * time.Minute},
		events.TypeHostOnline: &events.HostOnline{Host: "mac-1", Boot: "b-1", At: at,
			Pools: map[string]events.PoolSlots{"macos": {Labels: []string{"self-hosted", "macos"}, Slots: 2, Installation: "acme-cloud"},
				"macos-l": {Labels: []string{"self-hosted", "macos", "berth-size-l"}, Slots: 1,
					Shape: &events.Shape{CPU: 8, MemoryMiB: 16384, DiskGiB: 100, Image: "xcode-16", InstanceTypes: []string{"mac2.metal"}}}},
			PhysicalCap: 2, CurveKey: "XAGENT", Backend: "vz", Assign: true, Resources: &events.Resources{CPU: 12, MemoryMiB: 32768}},
		events.TypeHostDraining:   &events.HostDraining{HostChange: hostChange()},
		events.TypeHostLost:       &events.HostLost{HostChange: hostChange()},
		events.TypeHostCordoned:   &events.HostCordoned{HostChange: hostChange()},
		events.TypeHostUncordoned: &events.HostUncordoned{HostChange: hostChange()},
		events.TypeHostDegraded:   &events.HostDegraded{HostChange: hostChange(), Culprit: events.CulpritHost, Failures: 3},
		events.TypeHostRecovered:  &events.HostRecovered{HostChange: hostChange()},
		events.TypeHostGranted: &events.HostGranted{Host: "mac-1", By: "ops", At: at, PhysicalCap: 2,
			Pools: map[string]events.PoolGrant{"macos": {Labels: []string{"macos", "self-hosted"}, Slots: 2, Installation: "acme-cloud"}}},
		events.TypeDemandWaiting: &events.DemandWaiting{Pool: "macos", Jobs: 3, OldestJobID: 40,
			Waited: 31 * time.Second, Reason: "no free slot", At: at},
		events.TypeAlarmRaised: &events.AlarmRaised{Key: "slot_leak/macos/berth-42-1", Kind: events.AlarmSlotLeak,
			Pool: "macos", Message: "release berth-42-1", At: at},
		events.TypeAlarmCleared: &events.AlarmCleared{Key: "slot_leak/macos/berth-42-1", Pool: "macos", At: at},
	}
}

// requireAllSet fails if any field of v (recursively, through structs) is zero.
func requireAllSet(t *testing.T, path string, v reflect.Value) {
	t.Helper()
	if v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	if v.Kind() == reflect.Struct && v.Type() != reflect.TypeOf(time.Time{}) {
		for i := 0; i < v.NumField(); i++ {
			requireAllSet(t, path+"."+v.Type().Field(i).Name, v.Field(i))
		}
		return
	}
	if v.IsZero() {
		t.Errorf("sample field %s is zero: the round trip would not prove it survives", path)
	}
}

func TestRoundTripEveryType(t *testing.T) {
	all := samples()
	for typ := range events.Types() {
		if _, ok := all[typ]; !ok {
			t.Errorf("no sample payload for %s: add one", typ)
		}
	}
	for typ, p := range all {
		t.Run(typ, func(t *testing.T) {
			requireAllSet(t, typ, reflect.ValueOf(p))
			if p.EventType() != typ {
				t.Fatalf("sample for %s has type %s", typ, p.EventType())
			}
			if _, known := events.Types()[typ]; !known {
				t.Fatalf("sample for %s is not in Types()", typ)
			}
			in := events.New("berth-test", at, p)
			b, err := events.Marshal(in)
			if err != nil {
				t.Fatalf("Marshal: %v", err)
			}

			var env events.Envelope
			if err := json.Unmarshal(b, &env); err != nil {
				t.Fatalf("envelope is not JSON: %v", err)
			}
			if env.SpecVersion != "1.0" || env.Type != typ || env.Source != "berth-test" ||
				env.ID != p.EventID() || env.Subject != events.SubjectBy(p, events.Authors(typ)[0]) ||
				env.DataContentType != "application/json" || !env.Time.Equal(at) {
				t.Fatalf("envelope %+v: want specversion 1.0, type %s, id %s, subject %s", env, typ, p.EventID(), events.SubjectBy(p, events.Authors(typ)[0]))
			}

			out, err := events.Unmarshal(b, 17)
			if err != nil {
				t.Fatalf("Unmarshal: %v", err)
			}
			in.Seq = 17
			if !reflect.DeepEqual(out, in) {
				t.Fatalf("round trip:\n got %#v\nwant %#v", out, in)
			}
			if out.Type() != typ {
				t.Fatalf("Type() = %s, want %s", out.Type(), typ)
			}
		})
	}
}

func TestUnknownTypeIsReportedWithEnvelopeFields(t *testing.T) {
	for _, typ := range []string{"berth.job.queued.v2", "berth.something.new.v1"} {
		b := []byte(`{"specversion":"1.0","id":"x-1","source":"future","type":"` + typ +
			`","time":"2025-03-14T15:09:26Z","subject":"berth.evt.job.42","data":{"job_id":42}}`)
		ev, err := events.Unmarshal(b, 9)
		if !errors.Is(err, events.ErrUnknownType) {
			t.Fatalf("%s: err = %v, want ErrUnknownType", typ, err)
		}
		if errors.Is(err, events.ErrMalformed) {
			t.Fatalf("%s: unknown type reported as malformed: %v", typ, err)
		}
		want := time.Date(2025, 3, 14, 15, 9, 26, 0, time.UTC)
		if ev.ID != "x-1" || ev.Source != "future" || ev.Subject != "berth.evt.job.42" || ev.Seq != 9 ||
			!ev.Time.Equal(want) || ev.Data != nil {
			t.Fatalf("%s: event %+v: want envelope fields filled and no payload", typ, ev)
		}
	}
}

func TestMalformedEnvelopes(t *testing.T) {
	tests := map[string]string{
		"garbage":             `not json at all`,
		"empty":               ``,
		"array":               `[1,2,3]`,
		"missing id":          `{"specversion":"1.0","source":"s","type":"berth.job.queued.v1","data":{}}`,
		"empty id":            `{"specversion":"1.0","id":"","source":"s","type":"berth.job.queued.v1","data":{}}`,
		"missing type":        `{"specversion":"1.0","id":"x","source":"s","data":{}}`,
		"wrong specversion":   `{"specversion":"0.3","id":"x","source":"s","type":"berth.job.queued.v1","data":{}}`,
		"missing specversion": `{"id":"x","source":"s","type":"berth.job.queued.v1","data":{}}`,
		"data of wrong shape": `{"specversion":"1.0","id":"x","source":"s","type":"berth.job.queued.v1","data":{"job_id":"forty-two"}}`,
		"data missing":        `{"specversion":"1.0","id":"x","source":"s","type":"berth.job.queued.v1"}`,
		"bad time":            `{"specversion":"1.0","id":"x","source":"s","type":"berth.job.queued.v1","time":"yesterday","data":{}}`,
	}
	for name, in := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := events.Unmarshal([]byte(in), 1)
			if !errors.Is(err, events.ErrMalformed) {
				t.Fatalf("err = %v, want ErrMalformed", err)
			}
			if errors.Is(err, events.ErrUnknownType) {
				t.Fatalf("malformed input reported as unknown type: %v", err)
			}
		})
	}
}

// requireSubject checks a subject is under berth.evt. and made of valid tokens.
func requireSubject(t interface{ Fatalf(string, ...any) }, s string) {
	if !strings.HasPrefix(s, "berth.evt.") {
		t.Fatalf("subject %q is not under berth.evt.", s)
	}
	for _, tok := range strings.Split(s, ".") {
		if tok == "" || strings.ContainsAny(tok, ".*> \t\r\n") {
			t.Fatalf("subject %q has an invalid token %q", s, tok)
		}
	}
}

func TestSubjectsAreValidNATSSubjects(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		name := rapid.StringMatching(`[A-Za-z0-9_-]{1,64}`)
		host, pool := name.Draw(t, "host"), name.Draw(t, "pool")
		if events.ValidName("host", host) != nil || events.ValidName("pool", pool) != nil {
			t.Fatalf("generated names %q, %q are not valid", host, pool)
		}
		jobID := rapid.Int64().Draw(t, "job")
		attempt := events.AttemptID(jobID, rapid.IntRange(1, 1000).Draw(t, "n"))
		when := time.Unix(rapid.Int64Range(0, 4e9).Draw(t, "unix"), 0).UTC()

		ref := events.AttemptRef{Attempt: attempt, Pool: pool, Host: host}
		jr := events.JobRef{JobID: jobID}
		hc := events.HostChange{Host: host, At: when}
		subjects := []string{
			events.JobSubject(jobID), events.PoolSubject(pool), events.AttemptSubject(host, attempt),
			events.HostSubject(host), events.DemandSubject(pool), events.AlarmSubject(pool),
		}
		for _, p := range []events.Payload{
			events.JobQueued{JobRef: jr}, events.JobWaiting{JobRef: jr}, events.JobInProgress{JobRef: jr},
			events.JobCompleted{JobRef: jr}, events.JobUnschedulable{JobID: jobID},
			events.SlotReserved{Pool: pool, Host: host, Attempt: attempt},
			events.SlotReleased{Pool: pool, Host: host, Attempt: attempt},
			events.AttemptPlaced{AttemptRef: ref}, events.AttemptProvisioning{AttemptRef: ref},
			events.AttemptRunnerStarted{AttemptRef: ref}, events.AttemptFailed{AttemptRef: ref},
			events.AttemptTeardownRequested{AttemptRef: ref}, events.AttemptStopped{AttemptRef: ref},
			events.AttemptAbandoned{AttemptRef: ref},
			events.HostOnline{Host: host}, events.HostDraining{HostChange: hc}, events.HostLost{HostChange: hc},
			events.HostCordoned{HostChange: hc}, events.HostUncordoned{HostChange: hc},
			events.DemandWaiting{Pool: pool, At: when},
			events.AlarmRaised{Pool: pool, At: when}, events.AlarmCleared{Pool: pool, At: when},
		} {
			subjects = append(subjects, p.EventSubject())
		}
		for _, s := range subjects {
			requireSubject(t, s)
		}
		if got, want := events.AttemptSubject(host, attempt), "berth.evt.attempt."+host+"."+attempt; got != want {
			t.Fatalf("AttemptSubject = %q, want %q", got, want)
		}
		if f := events.HostAttemptsFilter(host); f != "berth.evt.attempt."+host+".>" {
			t.Fatalf("HostAttemptsFilter = %q", f)
		}
	})
}

func TestSubjectsCoverEveryTypeInTheCatalogue(t *testing.T) {
	if events.SubjectAll != "berth.evt.>" || events.StreamName != "BERTH_EVENTS" {
		t.Fatalf("SubjectAll = %q, StreamName = %q: external contract changed", events.SubjectAll, events.StreamName)
	}
	for _, p := range samples() {
		requireSubject(t, p.EventSubject())
	}
}

func TestValidNameRejectsTokensThatBreakSubjects(t *testing.T) {
	for _, bad := range []string{"", "a.b", "a*", ">", "a b", "é", strings.Repeat("x", 65)} {
		if events.ValidName("pool", bad) == nil {
			t.Errorf("ValidName(%q) accepted a name that is not one subject token", bad)
		}
	}
	for _, good := range []string{"linux", "macos-arm64", "A_1", strings.Repeat("x", 64)} {
		if err := events.ValidName("pool", good); err != nil {
			t.Errorf("ValidName(%q) = %v", good, err)
		}
	}
}

// Given a fact of every catalogue type, and one whose envelope strings need
// escaping, when it is encoded, then its bytes are those encoding/json
// gives for its Envelope with the payload as a raw message: the stored
// bytes did not change when Marshal stopped encoding the payload twice.
func TestAFactEncodesToItsEnvelopesBytes(t *testing.T) {
	evs := []events.Event{}
	for _, p := range samples() {
		evs = append(evs, events.New("berth-test", at, p))
	}
	odd := events.New("berth/<test> & \u2028 é", at, samples()[events.TypeJobQueued])
	odd.ID, odd.Subject = "id-<&>\u2029", odd.Subject+".x"
	evs = append(evs, odd)
	for _, e := range evs {
		got, err := events.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		data, err := json.Marshal(e.Data)
		if err != nil {
			t.Fatal(err)
		}
		want, err := json.Marshal(events.Envelope{EnvelopeHead: events.EnvelopeHead{SpecVersion: events.SpecVersion, ID: e.ID, Source: e.Source,
			Type: e.Data.EventType(), Time: e.Time, Subject: e.Subject, DataContentType: "application/json"}, Data: data})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: encoded\n %s\nwant\n %s", e.Type(), got, want)
		}
	}
}
